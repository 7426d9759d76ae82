#!/usr/bin/env bash
# One command for a fresh machine: set up, build everything, run every test (ctest).
# GPU tests skip with the reason when no CUDA device is usable (ctest counts them as skipped).
#
#   tools/test.sh              Release build in build/release (CUDA when nvcc is found)
#   tools/test.sh --sanitize   Debug build with ASan + UBSan, without CUDA, in build/debug-cpu
#
# OpenMP teams are fixed (OMP_DYNAMIC=false): libgomp's dynamic teams shrink to one thread on
# a loaded machine, which hid a crash of the threaded cpu ops from every earlier test run. The
# whole suite runs with 2 threads; the cpu-backend suites run again with 1 and with 4 threads
# (4 oversubscribes a 2-core machine on purpose). ThreadTeams.* compares the bits of whole
# runs across 1, 2 and 4 threads.
#
# Under --sanitize (a Debug build, several times slower) the suite runs once, at 2 threads: the
# ThreadTeams.* tests in it run whole steps at 1, 2 and 4 threads under the sanitizers, and the
# release stages above cover the team sizes for every cpu suite. Left out there, because the
# release run has them and they add no code under the sanitizers (docs/testing.md, "What CI runs
# and what it costs"): the scripts that run no compiled code of ours (LayerIncludes*,
# GpuCheckSelfTest, BrowserHtmlReports), flash attention at batch 64 × 4,096 positions and the
# two largest emulated flash-attention cases (smaller cases run the same kernel code), the two
# fp16 steps of 2^16 positions (needed to overflow fp16; smaller fp16 steps run the same code),
# the 4-rank repeats of the sharded and CLI MPI jobs (their 2-rank runs stay; the 4-rank
# collectives and failures stay), the compare/sweep cases of ThreadTeams.* (its profile
# cases run every threaded op at 1, 2 and 4 threads under the sanitizers; compare and sweep
# repeat those steps), and five of the MoE meta-trace grids (thousands of layouts of the code
# that ShardedTrace.MixtureOfExpertsOverTheGrid, the hand-worked AnalyticRank/ShardedTrace MoE
# cases and the 2-rank MPI jobs run under the sanitizers).
#
# The multi-rank tests (ctest Mpi.*: tests/mpi_test.py) run in the first stage under
# `mpirun --oversubscribe -np 2` and `-np 4`, one MPI job at a time; they skip, saying why, when
# the build has no MPI or mpirun is absent (tools/setup.sh installs both).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/build_common.sh

case "${1:-}" in
  "") ;;
  --sanitize)
    export TRAINMEM_BUILD_DIR="${TRAINMEM_BUILD_DIR:-build/debug-cpu}"
    export TRAINMEM_BUILD_TYPE=Debug TRAINMEM_SANITIZE=ON TRAINMEM_CUDA=OFF
    ;;
  *)
    echo "usage: tools/test.sh [--sanitize]" >&2
    exit 2
    ;;
esac

bash tools/setup.sh
trainmem_configure_and_build
build_dir="${TRAINMEM_BUILD_DIR:-build/release}"

# The suites that run the cpu backend's threaded code.
# Parameterised tests carry a prefix ("DtypeByShape/OpsMatmulP..."). ThreadTeams.* is left out:
# it sets its own team sizes.
cpu_suites='(^|/)(Ops|Model|Golden|Training|Optimizer|CliE2E|CliProfile|CliDocs|Run)'

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
run_stage() {  # run_stage THREADS [ctest args...]
  local threads=$1
  shift
  echo "== tools/test.sh: ctest $* with OMP_DYNAMIC=false OMP_NUM_THREADS=$threads"
  (cd "$build_dir" && OMP_DYNAMIC=false OMP_NUM_THREADS=$threads ctest --output-on-failure "$@") \
    2>&1 | tee "$log" || status=1
  stage_summary="$(grep -E '^[0-9]+% tests passed' "$log" | tail -1 || true)"
  stage_skipped="$(grep -c '\*\*\*Skipped' "$log" || true)"
  echo "== tools/test.sh: ${threads} thread(s): ${stage_summary:-ctest did not finish}"
}
if [ "${TRAINMEM_SANITIZE:-OFF}" = ON ]; then
  sanitize_skip='^(LayerIncludes|LayerIncludesSelfTest|GpuCheckSelfTest|BrowserHtmlReports)$'
  sanitize_skip+='|^CudaKernelsAtRealSizes\.FlashAttentionLastBatchAndHeadAtBatch64Seq4096$'
  sanitize_skip+='|^CudaKernelsEmulated\.(FlashAttentionSlidingWindowAcrossTilesGqa|FlashAttentionWindowOffByOneIsDetected)$'
  sanitize_skip+='|^ModelFp16\.(OverflowingScaledGradientsAreReported|LossScaledGradientsFollowFp32AtLlamasVocabulary)$'
  sanitize_skip+='|^Mpi\.(sharded|sharded_staged|cli)\.np4$'
  sanitize_skip+='|^Cpu/ThreadTeams\.SameBitsWithOneTwoAndFourThreads/(compare|sweep)_'
  sanitize_skip+='|^ModelTraining\.(AdamWCutsTheLossTenfold|AdamW8bitCutsTheLossFivefold)OnAFixedSequence$'
  sanitize_skip+='|^ShardedTrace\.(ExpertParallelEveryRankOverTheGrid|MixtureOfExpertsUnderTensorParallelism)$'
  sanitize_skip+='|^ShardedTrace\.(ExpertTensorParallel|ZeroThreeOfTheExperts)EveryRankOverTheGrid$'
  sanitize_skip+='|^ShardedTrace\.CapacityPerRankOverTheGrid$'
  run_stage 2 -j2 -E "$sanitize_skip"
  summary=$stage_summary skipped=$stage_skipped
  also="ThreadTeams.* ran 1, 2 and 4 threads; the release run covers what was left out here"
else
  run_stage 2 -j2
  summary=$stage_summary skipped=$stage_skipped
  # The hostile-input tests check refusals before any thread team starts: once is enough.
  run_stage 1 -j2 -R "$cpu_suites" -E CliE2EHostile
  run_stage 4 -j2 -R "$cpu_suites" -E CliE2EHostile
  also="cpu suites also passed with 1 and 4 threads"
fi

if [ "$status" -eq 0 ]; then
  echo "tools/test.sh: PASS: ${summary:-no summary} (${skipped} skipped); $also"
else
  echo "tools/test.sh: FAIL: see the stages above"
fi
exit "$status"
