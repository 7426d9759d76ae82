#!/usr/bin/env bash
# The build dependencies for a machine that has CUDA, CMake, ninja and a compiler but neither
# network nor these Debian packages (the GPU machines lent to this project: nothing can be
# fetched there, see docs/gpu.md).
#
#   tools/devdeps.sh fetch      (here, with network) download the .deb files of the libraries
#                               trainmem builds with into .devdeps/ (ignored by git; about
#                               14 MB) and write .devdeps/MANIFEST (one line per package:
#                               file, bytes, sha256). Carry that folder to the GPU machine.
#   tools/devdeps.sh verify     the bundle is complete: MANIFEST lists one .deb per package
#                               of DEVDEPS_PACKAGES and every file has its size and sha256
#                               (exit 1 with what is wrong otherwise; a second or less)
#   source tools/devdeps.sh use  (there) when a library is missing from the system and
#                               .devdeps/ holds the packages: unpack them under
#                               build/devdeps-root (no dpkg, nothing installed; the files keep
#                               the packages' dates, so a rebuild finds nothing changed), and
#                               set DEVDEPS_CMAKE_ARGS (an array for cmake's configure: prefix,
#                               and an rpath so the binaries find the libraries). Nothing is
#                               exported: LD_LIBRARY_PATH is left as it was (the binaries carry
#                               their library paths, and other programs, such as the PyTorch
#                               peer's python, must not load Debian's libgfortran or OpenBLAS).
#                               With every library present it leaves the array empty and says so.
#   tools/devdeps.sh check      print which libraries the system lacks (exit 1 if any)
#
# The packages are Debian 12's (bookworm), the versions this project is built and tested with;
# their shared libraries need glibc >= 2.36 (Ubuntu 24.04's is 2.39).
ROOT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVDEPS_DIR=${DEVDEPS_DIR:-$ROOT_DIR/.devdeps}
DEVDEPS_PACKAGES=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev libgtest-dev
  nlohmann-json3-dev libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
  libgfortran5 libquadmath0)
DEVDEPS_MANIFEST=$DEVDEPS_DIR/MANIFEST

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
  (cd "$DEVDEPS_DIR" && rm -f ./*.deb MANIFEST && apt-get download "${DEVDEPS_PACKAGES[@]}") ||
    return 1
  # The manifest: what verify (gpu_check.sh's preflight) checks the carried folder against.
  (cd "$DEVDEPS_DIR" && for f in ./*.deb; do
    printf '%s %s %s\n' "${f#./}" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
  done) >"$DEVDEPS_MANIFEST.tmp" && mv "$DEVDEPS_MANIFEST.tmp" "$DEVDEPS_MANIFEST" || return 1
  echo "devdeps: $(ls "$DEVDEPS_DIR"/*.deb | wc -l) packages, $(du -sh "$DEVDEPS_DIR" | cut -f1) in $DEVDEPS_DIR (MANIFEST written)"
}

# The bundle against its manifest: one .deb per package, each with its size and sha256.
devdeps_verify() {
  if [[ ! -d $DEVDEPS_DIR ]]; then
    echo "devdeps: no $DEVDEPS_DIR (run 'tools/devdeps.sh fetch' where there is network, and carry .devdeps)" >&2
    return 1
  fi
  if [[ ! -f $DEVDEPS_MANIFEST ]]; then
    echo "devdeps: no $DEVDEPS_MANIFEST (run 'tools/devdeps.sh fetch' again: it writes one)" >&2
    return 1
  fi
  local want=${#DEVDEPS_PACKAGES[@]} n=0 bytes=0 bad="" file size sum actual p
  while read -r file size sum; do
    [[ -z $file ]] && continue
    n=$((n + 1))
    if [[ ! -f $DEVDEPS_DIR/$file ]]; then
      bad+=" $file: missing;"
      continue
    fi
    actual=$(stat -c %s "$DEVDEPS_DIR/$file")
    if [[ $actual != "$size" ]]; then
      bad+=" $file: $actual bytes, manifest says $size;"
    elif [[ $(sha256sum "$DEVDEPS_DIR/$file" | cut -d' ' -f1) != "$sum" ]]; then
      bad+=" $file: sha256 differs from the manifest;"
    fi
    bytes=$((bytes + size))
  done <"$DEVDEPS_MANIFEST"
  for p in "${DEVDEPS_PACKAGES[@]}"; do
    grep -q "^${p}_" "$DEVDEPS_MANIFEST" || bad+=" package $p: not in the manifest;"
  done
  ((n == want)) || bad+=" manifest lists $n .debs, $want expected;"
  if [[ -n $bad ]]; then
    echo "devdeps: $DEVDEPS_DIR incomplete:$bad (run 'tools/devdeps.sh fetch' again)" >&2
    return 1
  fi
  echo "devdeps: $n packages, $bytes bytes, sizes and sha256 as in the manifest"
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
    # The linker also searches -rpath folders for the libraries' own needs, so configure and
    # build need no LD_LIBRARY_PATH either.
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags -Wl,-rpath,$lib:$lib/openblas-pthread")
  echo "devdeps: missing here: $missing; using the Debian 12 packages unpacked in $root"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  case ${1:-} in
    fetch) devdeps_fetch ;;
    verify) devdeps_verify ;;
    check)
      m=$(devdeps_missing)
      if [[ -n $m ]]; then echo "missing: $m" | tr '\n' ' '; echo; exit 1; fi
      echo "every library is installed"
      ;;
    use) echo "devdeps: 'use' must be sourced: source tools/devdeps.sh use" >&2; exit 2 ;;
    *) echo "usage: tools/devdeps.sh fetch|verify|check   or   source tools/devdeps.sh use" >&2; exit 2 ;;
  esac
elif [[ ${1:-} == use ]]; then
  devdeps_use
fi
