#!/usr/bin/env bash
# One command for a fresh machine: set up, build, and run the main job.
# The main job today: the analytic estimate for the question that started trainmem (LLaMA-7B,
# batch 8, sequence 512, fp16, AdamW). It grows into `trainmem compare` (predicted on meta
# without a GPU, measured on one) plus a tiny real cpu run as those subcommands land.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/build_common.sh

bash tools/setup.sh
trainmem_configure_and_build trainmem
bin="${TRAINMEM_BUILD_DIR:-build/release}/trainmem"

echo "== trainmem estimate --model llama-7b --batch 8 --seq 512 --dtype fp16" >&2
"$bin" estimate --model llama-7b --batch 8 --seq 512 --dtype fp16
