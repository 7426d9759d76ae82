#!/usr/bin/env bash
# The build dependencies for a machine that has CUDA, CMake, ninja and a compiler but neither
# network nor these Debian packages (the GPU machines lent to this project: nothing can be
# fetched there, see docs/gpu.md).
#
#   tools/devdeps.sh fetch      (here, with network) download the .deb files of the libraries
#                               trainmem builds with into .devdeps/ (ignored by git; about
#                               14 MB). Carry that folder to the GPU machine.
#   source tools/devdeps.sh use  (there) when a library is missing from the system and
#                               .devdeps/ holds the packages: unpack them under
#                               build/devdeps-root (no dpkg, nothing installed), and set
#                               DEVDEPS_CMAKE_ARGS (an array for cmake's configure: prefix,
#                               and an rpath so the binaries find the libraries) and
#                               LD_LIBRARY_PATH (for the linker's checks). With every
#                               library present it leaves both empty and says so.
#   tools/devdeps.sh check      print which libraries the system lacks (exit 1 if any)
#
# The packages are Debian 12's (bookworm), the versions this project is built and tested with;
# their shared libraries need glibc >= 2.36 (Ubuntu 24.04's is 2.39).
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVDEPS_DIR=${DEVDEPS_DIR:-$ROOT_DIR/.devdeps}
DEVDEPS_PACKAGES=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev libgtest-dev
  nlohmann-json3-dev libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
  libgfortran5)

# A header each library must provide, as `what:header`.
_devdeps_headers=(spdlog:spdlog/spdlog.h fmt:fmt/format.h CLI11:CLI/CLI.hpp
  nlohmann_json:nlohmann/json.hpp GTest:gtest/gtest.h OpenBLAS:cblas.h)

# Prints the libraries whose header is in none of the compiler's default include folders.
devdeps_missing() {
  local dirs h what file found d cxx
  cxx=${CXX:-$(command -v c++ || command -v g++ || echo c++)}
  dirs=$(echo | "$cxx" -xc++ -E -v - 2>&1 |
    sed -n '/#include <...> search starts here:/,/End of search list./p' | sed '1d;$d')
  for h in "${_devdeps_headers[@]}"; do
    what=${h%%:*} file=${h#*:} found=0
    for d in $dirs; do
      # cblas.h: also under openblas-pthread/ (Debian's alternatives) or openblas/.
      if [[ -e $d/$file || -e $d/openblas-pthread/$file || -e $d/openblas/$file ]]; then
        found=1
        break
      fi
    done
    ((found)) || echo "$what"
  done
}

devdeps_fetch() {
  mkdir -p "$DEVDEPS_DIR"
  (cd "$DEVDEPS_DIR" && rm -f ./*.deb && apt-get download "${DEVDEPS_PACKAGES[@]}") || return 1
  echo "devdeps: $(ls "$DEVDEPS_DIR"/*.deb | wc -l) packages, $(du -sh "$DEVDEPS_DIR" | cut -f1) in $DEVDEPS_DIR"
}

devdeps_use() {
  DEVDEPS_CMAKE_ARGS=()
  local missing
  missing=$(devdeps_missing | tr '\n' ' ')
  if [[ -z ${missing// /} ]]; then
    echo "devdeps: every library is installed on this system; the bundle is not used"
    return 0
  fi
  if ! compgen -G "$DEVDEPS_DIR/*.deb" >/dev/null; then
    echo "devdeps: missing here: $missing; no bundle in $DEVDEPS_DIR (run 'tools/devdeps.sh fetch' where there is network, and carry .devdeps)" >&2
    return 1
  fi
  local root=${DEVDEPS_ROOT:-$ROOT_DIR/build/devdeps-root}
  rm -rf "$root"
  python3 "$ROOT_DIR/tools/unpack_debs.py" "$root" "$DEVDEPS_DIR"/*.deb || return 1
  local lib=$root/usr/lib/x86_64-linux-gnu
  DEVDEPS_CMAKE_ARGS=(-DCMAKE_PREFIX_PATH="$root/usr"
    -DCMAKE_LIBRARY_PATH="$lib/openblas-pthread;$lib"
    -DCMAKE_INCLUDE_PATH="$root/usr/include/x86_64-linux-gnu/openblas-pthread;$root/usr/include"
    # DT_RPATH (not RUNPATH) so that the libraries' own needs (OpenBLAS's libgfortran) are
    # found too: the binaries then run without LD_LIBRARY_PATH.
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags -Wl,-rpath,$lib:$lib/openblas-pthread")
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "devdeps: missing here: $missing; using the Debian 12 packages unpacked in $root"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  case ${1:-} in
    fetch) devdeps_fetch ;;
    check)
      m=$(devdeps_missing)
      if [[ -n $m ]]; then echo "missing: $m" | tr '\n' ' '; echo; exit 1; fi
      echo "every library is installed"
      ;;
    use) echo "devdeps: 'use' must be sourced: source tools/devdeps.sh use" >&2; exit 2 ;;
    *) echo "usage: tools/devdeps.sh fetch|check   or   source tools/devdeps.sh use" >&2; exit 2 ;;
  esac
elif [[ ${1:-} == use ]]; then
  devdeps_use
fi
