# Shared by tools/main.sh and tools/test.sh (sourced, not run): configure and build
# trainmem in build/release. CUDA is on when nvcc is found, off otherwise.
# Environment overrides: TRAINMEM_BUILD_DIR (default build/release), TRAINMEM_JOBS (default
# nproc), TRAINMEM_CUDA_ARCHS (default: the CMakeLists.txt default, "80;90"), TRAINMEM_CUDA
# (OFF: build without CUDA even where nvcc is installed; ON: require nvcc; default: auto),
# TRAINMEM_BUILD_TYPE (default Release), TRAINMEM_SANITIZE (ON: ASan + UBSan on host code).

trainmem_find_nvcc() {
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo /usr/local/cuda/bin/nvcc
  elif command -v nvcc >/dev/null 2>&1; then
    command -v nvcc
  fi
}

# trainmem_configure_and_build [cmake --build target...]
trainmem_configure_and_build() {
  local build_dir="${TRAINMEM_BUILD_DIR:-build/release}"
  local jobs="${TRAINMEM_JOBS:-$(nproc)}"
  local nvcc=""
  case "${TRAINMEM_CUDA:-auto}" in
    OFF | off | 0) ;;
    ON | on | 1)
      nvcc="$(trainmem_find_nvcc)"
      if [ -z "$nvcc" ]; then
        echo "trainmem: TRAINMEM_CUDA=ON but nvcc is not in /usr/local/cuda/bin or on PATH" >&2
        return 2
      fi
      ;;
    auto) nvcc="$(trainmem_find_nvcc)" ;;
    *)
      echo "trainmem: TRAINMEM_CUDA must be ON, OFF or auto, got '${TRAINMEM_CUDA}'" >&2
      return 2
      ;;
  esac
  local args=(-S . -B "$build_dir" -G Ninja "-DCMAKE_BUILD_TYPE=${TRAINMEM_BUILD_TYPE:-Release}"
              "-DTRAINMEM_SANITIZE=${TRAINMEM_SANITIZE:-OFF}")
  if [ -n "$nvcc" ]; then
    args+=(-DTRAINMEM_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc")
    [ -n "${TRAINMEM_CUDA_ARCHS:-}" ] && args+=("-DCMAKE_CUDA_ARCHITECTURES=$TRAINMEM_CUDA_ARCHS")
    echo "trainmem: configuring with CUDA ($nvcc) in $build_dir" >&2
  else
    args+=(-DTRAINMEM_CUDA=OFF)
    echo "trainmem: configuring without CUDA in $build_dir ($([ "${TRAINMEM_CUDA:-auto}" = auto ] && echo "nvcc not found" || echo "TRAINMEM_CUDA=${TRAINMEM_CUDA}"))" >&2
  fi
  cmake "${args[@]}" >/dev/null  # errors still reach stderr
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  echo "trainmem: building (-j$jobs)" >&2
  # The build log goes to stderr: stdout is the report's.
  cmake --build "$build_dir" -j "$jobs" "${targets[@]}" >&2
}
