#!/usr/bin/env bash
# One command for a fresh machine: set up, build, and run the main job.
# The main job: the question that started trainmem, LLaMA-7B at batch 8, sequence 512, fp16,
# AdamW, with activation checkpointing off and on (`trainmem compare`). With a usable GPU it
# is measured on the cuda backend; without one, `--backend auto` traces it on the meta backend
# and the report says PREDICTED. Then a short real run of a small model on the cpu backend
# (`trainmem profile`), so the measured path is seen working everywhere.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/build_common.sh

bash tools/setup.sh
trainmem_configure_and_build trainmem
bin="${TRAINMEM_BUILD_DIR:-build/release}/trainmem"

# Exit code 3 is an out-of-memory: the step does not fit this GPU (LLaMA-7B with AdamW needs
# about 121 GiB). The report of what was measured is still written; that is an answer, not a
# failure of the job.
run_job() {
  echo "== trainmem $*" >&2
  local rc=0
  "$bin" "$@" || rc=$?
  if [ "$rc" -eq 3 ]; then
    echo "trainmem: the step does not fit this device (out of memory); the report above shows what was measured" >&2
  elif [ "$rc" -ne 0 ]; then
    exit "$rc"
  fi
  echo
}

run_job compare --model llama-7b --batch 8 --seq 512 --dtype fp16 --optimizer adamw
run_job profile --model small-256 --batch 4 --seq 128 --backend cpu
