#!/usr/bin/env bash
# Checks that the Debian packages trainmem builds with are installed. Installs the missing
# ones with apt-get when run as root; otherwise prints the exact command and exits 1.
# Quiet and idempotent when everything is present. CUDA (optional) is not installed here:
# trainmem builds its CUDA parts when nvcc is found (/usr/local/cuda/bin/nvcc or on PATH).
set -euo pipefail

# chromium: the browser tests of the HTML reports (tests/browser_test.py; they skip without it).
# openmpi-bin, libopenmpi-dev: multi-rank runs (mpirun, the MPI collectives and their tests,
# docs/distributed.md "Measured runs"); trainmem still builds without them (MPI is optional).
packages=(cmake ninja-build g++ pkg-config libspdlog-dev libcli11-dev libgtest-dev
          nlohmann-json3-dev libopenblas-dev chromium openmpi-bin libopenmpi-dev)

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup.sh: dpkg-query not found; this script supports Debian/Ubuntu." >&2
  echo "setup.sh: install by hand: ${packages[*]}" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  echo "setup.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup.sh: missing packages: ${missing[*]}" >&2
  echo "setup.sh: run as root:" >&2
  echo "  sudo sh -c '$cmd'" >&2
  exit 1
fi
