#!/usr/bin/env bash
# One command for a fresh machine: set up, build everything, run every test (ctest).
# GPU tests skip with the reason when no CUDA device is usable (ctest counts them as skipped).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/build_common.sh

bash tools/setup.sh
trainmem_configure_and_build
build_dir="${TRAINMEM_BUILD_DIR:-build/release}"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
(cd "$build_dir" && ctest --output-on-failure -j2) 2>&1 | tee "$log" || status=$?
summary="$(grep -E '^[0-9]+% tests passed' "$log" | tail -1 || true)"
skipped="$(grep -c '\*\*\*Skipped' "$log" || true)"
if [ "$status" -eq 0 ]; then
  echo "tools/test.sh: PASS: ${summary:-no summary} (${skipped} skipped)"
else
  echo "tools/test.sh: FAIL: ${summary:-ctest did not finish}"
fi
exit "$status"
