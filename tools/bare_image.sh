#!/usr/bin/env bash
# bare_image.sh — run a command on this machine as if it were a GPU machine lent to this
# project: CUDA, CMake, ninja, a compiler and python3, but none of the Debian libraries that
# tools/devdeps.sh bundles (spdlog, fmt, CLI11, GoogleTest, nlohmann-json, OpenBLAS, libgfortran,
# libquadmath), no reference BLAS/LAPACK and no MPI. Those packages' files (and the
# /etc/alternatives links into them) are hidden under an overlay of /usr in a private mount
# namespace; nothing on the machine changes, and the command sees everything else as it is.
#
#   tools/bare_image.sh CMD [ARGS...]      e.g.
#   tools/bare_image.sh env BACKEND=meta JOBS=2 OUT=/tmp/gc RESULTS=/tmp/gc-res bash tools/gpu_check.sh
#
# Needs root, unshare(1) and overlayfs (Debian 12 and the dev containers of this project have
# them); the package list comes from dpkg, so this runs on Debian/Ubuntu only.
set -euo pipefail
if [[ ${1:-} == "" || ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
[[ $(id -u) == 0 ]] || { echo "bare_image.sh: needs root (unshare -m, mount -t overlay)" >&2; exit 2; }

HIDE_PACKAGES=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev libgtest-dev googletest
  nlohmann-json3-dev libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
  libgfortran5 libquadmath0 libgfortran-12-dev gfortran gfortran-12 libblas-dev libblas3
  liblapack-dev liblapack3 libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common)

STATE=$(mktemp -d /tmp/bare_image.XXXXXX)
trap 'rm -rf "$STATE"' EXIT
mkdir -p "$STATE/upper" "$STATE/work"
hidden="$STATE/hidden.txt"
for p in "${HIDE_PACKAGES[@]}"; do
  dpkg -L "$p" 2>/dev/null || true
done | grep '^/usr/' | while read -r f; do
  # Files and links only: folders such as /usr/include are shared with other packages.
  if [[ -L $f || -f $f ]]; then echo "$f"; fi
done | sort -u >"$hidden"
# The alternatives links (libblas.so.3, cblas.h, mpirun, mpicc, ...) whose target is hidden.
find /usr -lname '/etc/alternatives/*' 2>/dev/null | while read -r l; do
  t=$(readlink -f "$l" || true)
  if [[ -n $t ]] && grep -qxF "$t" "$hidden"; then echo "$l"; fi
done >>"$hidden"
while read -r f; do
  rel=${f#/usr/}
  mkdir -p "$STATE/upper/$(dirname "$rel")"
  mknod "$STATE/upper/$rel" c 0 0  # an overlayfs whiteout: the file is absent above
done <"$hidden"
echo "bare_image.sh: $(wc -l <"$hidden") files of ${#HIDE_PACKAGES[@]} packages hidden under /usr" >&2

unshare -m --propagation private -- bash -c '
  mount -t overlay overlay -o "lowerdir=/usr,upperdir=$1/upper,workdir=$1/work" /usr || exit 97
  shift
  exec "$@"' bare_image "$STATE" "$@"
