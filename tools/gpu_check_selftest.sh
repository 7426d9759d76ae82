#!/usr/bin/env bash
# gpu_check_selftest.sh — tools/gpu_check.sh's own mechanics, in seconds, without a GPU or a
# build: the deadline, results published after every step, the exit trap on a kill, the
# preflight's refusals and the order of the steps. (ctest GpuCheckSelfTest; under a minute:
# 42-58 s on a 2-core machine shared with two builds, mostly python starts for the summaries.)
#
# The script under test is the real one; only what it calls is replaced, through PATH and its
# own variables: nvcc, nvidia-smi (an H200, or none), cmake, mpirun, the built binaries
# (BUILD= a folder of stubs that write the JSON the summary reads), the PyTorch peer (PYTHON=
# a wrapper that answers the torch probe and stands in for tools/hf_peer.py, and runs python3
# for everything else) and the .devdeps bundle (DEVDEPS_DIR= 13 made-up .debs and their
# MANIFEST). Every stub sleeps FAKE_STEP_S (default 0.05 s). Kills are sent as `timeout` sends
# them at its limit (the signal to the script's process group) once steps.jsonl holds a given
# number of steps (and, for SIGTERM, the next step has started), so what must be in $RESULTS is
# known exactly. MIN_PCT=10 shrinks the steps' useful minimums for the deadline case.
#
# The same kills against the real dry run (BACKEND=meta, real build, 60/200/400 s) were run by
# hand: docs/gpu.md, "The one-call plan".
# shellcheck disable=SC2016  # the stubs are single-quoted on purpose: they expand when they run
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GC="$ROOT/tools/gpu_check.sh"
W=$(mktemp -d /tmp/gpu_check_selftest.XXXXXX)
trap 'rm -rf "$W"' EXIT
export FAKE_STEP_S=${FAKE_STEP_S:-0.05}
FAILS=0
T_START=$SECONDS
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; FAILS=$((FAILS + 1)); }
check() {  # check DESCRIPTION CONDITION...
  local what=$1
  shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}

# ---------------------------------------------------------------- the stubs
mkdir -p "$W/bin" "$W/gpubin" "$W/build" "$W/devdeps"
stub() {  # stub PATH BODY
  printf '#!/usr/bin/env bash\n%s\n' "$2" >"$1"
  chmod +x "$1"
}
stub "$W/bin/nvcc" 'echo "Cuda compilation tools, release 13.0, V13.0.88"'
stub "$W/bin/cmake" 'sleep "$FAKE_STEP_S"; exit 0'
stub "$W/gpubin/nvidia-smi" '
case "$*" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-fake)" ;;
  *noheader,nounits*) echo 143771 ;;
  *) echo "name, memory.total [MiB], driver_version, clocks.max.sm [MHz]"
     echo "NVIDIA H200, 143771 MiB, 570.00, 1980 MHz" ;;
esac'
stub "$W/bin/mpirun" 'sleep "$FAKE_STEP_S"; exit 0'
# trainmem: estimate/profile/sweep write what the summary reads (the estimate fits an H200).
stub "$W/build/trainmem" '
sleep "$FAKE_STEP_S"
out=""; prev=""
for a in "$@"; do [[ $prev == --output ]] && out=$a; prev=$a; done
case $1 in
  estimate) echo "{\"analytic\": {\"native\": {\"peak\": 129000000000}, \"hf-eager\": {\"activations\": 1, \"peak\": 2}}}" >"$out" ;;
  profile | sweep) echo "{\"measured\": {\"ledger\": {\"peak\": 128000000000}}}" >"$out" ;;
esac
exit 0'
stub "$W/build/trainmem_gpu_tests" '
echo "[ RUN      ] Fake.One"; echo "[       OK ] Fake.One (1 ms)"
sleep "${FAKE_GPU_TESTS_S:-$FAKE_STEP_S}"
echo "[ RUN      ] Fake.Two"; echo "[  SKIPPED ] Fake.Two (0 ms)"
json=${1#--gtest_output=json:}
echo "{\"tests\": 2, \"failures\": 0, \"testsuites\": []}" >"$json"
[[ ${CUDA_LAUNCH_BLOCKING:-} == 1 ]] || { echo "CUDA_LAUNCH_BLOCKING is not 1"; exit 1; }'
stub "$W/build/bench_gemm_cuda" '
sleep "$FAKE_STEP_S"; echo "{\"best_tflops\": 700}" >"${@: -1}"'
stub "$W/build/bench_step_cuda" '
sleep "$FAKE_STEP_S"; echo "{\"tokens_per_s\": 1000, \"step_ms\": 4000, \"mfu\": 0.4}" >"${@: -1}"'
stub "$W/build/mpi_test_sharded" 'exit 0'
# PYTHON: the torch probe succeeds, hf_peer.py is a stub, everything else is python3.
stub "$W/bin/py" '
if [[ ${1:-} == -c && ${2:-} == *"import torch"* ]]; then
  [[ -z ${LD_LIBRARY_PATH+x} ]] || { echo "LD_LIBRARY_PATH reached the peer" >&2; exit 1; }
  exit 0
fi
if [[ ${1:-} == *hf_peer.py ]]; then
  sleep "$FAKE_STEP_S"; out=""; prev=""
  for a in "$@"; do [[ $prev == --output ]] && out=$a; prev=$a; done
  echo "{\"torch\": \"0\", \"transformers\": \"0\", \"run\": {\"optimizer\": \"sgd\"}, \"configs\": []}" >"$out"
  exit 0
fi
exec python3 "$@"'
# The bundle: one made-up .deb per package of tools/devdeps.sh, and its manifest.
(
  # shellcheck source=tools/devdeps.sh
  source "$ROOT/tools/devdeps.sh" functions
  cd "$W/devdeps" || exit 1
  for p in "${DEVDEPS_PACKAGES[@]}"; do
    head -c 1000 /dev/urandom >"${p}_1.0_amd64.deb"
    printf '%s %s %s\n' "${p}_1.0_amd64.deb" 1000 "$(sha256sum "${p}_1.0_amd64.deb" | cut -d' ' -f1)"
  done >MANIFEST
)

# The steps in the order the script must run them (one GPU: shared-GPU runs, no NCCL).
EXPECTED_ORDER="devdeps configure build gpu_tests estimate_llama7b_adamw_none
estimate_llama7b_adamw_full estimate_llama7b_sgd_none estimate_llama7b_sgd_full
estimate_llama7b_lomo_none estimate_llama7b_lomo_full estimate_llama7b_qlora_adamw8bit
profile_llama7b_adamw_none profile_llama7b_adamw_full profile_llama7b_sgd_none
profile_llama7b_sgd_full profile_llama7b_lomo_none profile_llama7b_lomo_full
profile_llama7b_qlora_adamw8bit gemm_bf16 throughput gemm_fp16
estimate_hf_eager hf_peer hf_step_peer estimate_hf_step_eager estimate_hf_step_sdpa sweep shared_gpu_zero3 shared_gpu_tp2_sp shared_gpu_pp2 shared_gpu_cp2
build_mpi_test shared_gpu_sharded multi_gpu"

steps_of() { [[ -f $1 ]] && python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.strip(): print(json.loads(l)["step"])' "$1"; }
status_of() { python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.strip():
        d = json.loads(l)
        if d["step"] == sys.argv[2]: print(d["status"]); break' "$1" "$2"; }
json_get() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))' "$1" "$2"; }
tar_has() { tar -tzf "$1" 2>/dev/null | grep "$2" >/dev/null; }

# gc NAME [VAR=VALUE...]: the environment of one run of the script under test (with its GPU).
gc_env() {
  local name=$1
  shift
  # Started without LD_LIBRARY_PATH: the peer's stub fails if the script gives it one.
  echo env -u LD_LIBRARY_PATH PATH="$W/bin:$W/gpubin:$PATH" CUDACXX="$W/bin/nvcc" BUILD="$W/build" \
    PYTHON="$W/bin/py" DEVDEPS_DIR="$W/devdeps" OUT="$W/$name/out" RESULTS="$W/$name/results" \
    MIN_FREE_GIB=0 BACKEND=cuda "$@"
}

# kill_after_steps NAME SIGNAL N NEXT [VAR=VALUE...]: runs the script under `timeout`, and
# once steps.jsonl holds N steps (and logs/NEXT.log has output, if NEXT is not -) sends SIGNAL to
# timeout's process group, as timeout does at its limit (timeout runs the script in a group of
# its own; the script's steps run in groups of their own, as they do under the real kill).
# Echoes the exit code.
kill_after_steps() {
  local name=$1 sig=$2 n=$3 next=$4
  shift 4
  mkdir -p "$W/$name"
  # shellcheck disable=SC2046
  timeout 300 $(gc_env "$name" "$@") bash "$GC" >"$W/$name/stdout" 2>&1 &
  local tpid=$! i
  for ((i = 0; i < 6000; i++)); do
    if [[ -f $W/$name/out/steps.jsonl ]] && (($(wc -l <"$W/$name/out/steps.jsonl") >= n)) &&
      [[ $next == - || -s $W/$name/out/logs/$next.log ]]; then
      break
    fi
    kill -0 "$tpid" 2>/dev/null || break
    sleep 0.02
  done
  kill -s "$sig" -- "-$tpid" 2>/dev/null
  wait "$tpid"
  echo $?
}

# ---------------------------------------------------------------- 1. a whole run
echo "== a whole run (stubs of ${FAKE_STEP_S}s)"
mkdir -p "$W/full"
# shellcheck disable=SC2046
$(gc_env full) bash "$GC" >"$W/full/stdout" 2>&1
rc=$?
R="$W/full/results"
check "whole run exits 0 (rc $rc)" test "$rc" = 0
check "the preflight is the first line of output" \
  grep -q "^== gpu_check preflight" <(head -n 1 "$W/full/stdout")
check "steps in the planned order (build, GPU tests, LLaMA-7B, throughput, peer, sweep, multi-rank)" \
  test "$(steps_of "$R/steps.jsonl" | tr '\n' ' ')" = "$(echo $EXPECTED_ORDER) "
check "every step ok but the NCCL one (one GPU)" test "$(grep -vc '"status": "ok"' "$R/steps.jsonl")" = 1
check "\$RESULTS holds exactly the five files (the transport returns 8)" \
  test "$(cd "$R" && ls -A | tr '\n' ' ')" = "gpu_check.tar.gz preflight.txt steps.jsonl summary.json summary.txt "
check "summary.json says complete" test "$(json_get "$R/summary.json" state)" = complete
check "the tarball holds the logs" tar_has "$R/gpu_check.tar.gz" "logs/gpu_tests.log"
check "the summary reads the stubs' figures" grep -q "GEMM (cuBLAS, fp32 accumulate): bf16 700" "$R/summary.txt"
check "JOBS defaults to the machine's cores" grep -q "JOBS=$(nproc)," "$R/preflight.txt"

# ---------------------------------------------------------------- 2. killed by SIGTERM
# Once configure and build are recorded and the GPU tests (a 30 s stub here) have started.
echo "== SIGTERM during the GPU tests"
t=$SECONDS
rc=$(kill_after_steps term TERM 3 gpu_tests FAKE_GPU_TESTS_S=30)
took=$((SECONDS - t))
R="$W/term/results"
check "killed: exit status 143 or 124 (got $rc), in seconds, not the stub's 30 (${took}s)" \
  test \( "$rc" = 143 -o "$rc" = 124 \) -a "$took" -lt 20
check "\$RESULTS/steps.jsonl: the three finished steps, then the GPU tests interrupted" \
  test "$(steps_of "$R/steps.jsonl" | tr '\n' ' ')" = "devdeps configure build gpu_tests "
check "the step in flight is recorded as interrupted" \
  test "$(status_of "$R/steps.jsonl" gpu_tests)" = interrupted
check "\$RESULTS/steps.jsonl is the output folder's" cmp -s "$R/steps.jsonl" "$W/term/out/steps.jsonl"
check "summary.json: interrupted by SIGTERM during gpu_tests" \
  grep -q '"state": "interrupted by SIGTERM during gpu_tests"' "$R/summary.json"
check "the summary counts the GPU tests from the log (gtest's JSON comes only at the end)" \
  grep -q "GPU tests (interrupted, counted from the log): 1 ok" "$R/summary.txt"
check "the tarball holds the logs of the finished steps and the interrupted one" bash -c '
  for s in configure build gpu_tests; do
    tar -tzf "$1" | grep "logs/$s.log" >/dev/null || { echo "no logs/$s.log"; exit 1; }
  done' _ "$R/gpu_check.tar.gz"
check "no partial copy left in \$RESULTS" test -z "$(cd "$R" && ls -A | grep part)"

# ---------------------------------------------------------------- 3. killed by SIGKILL (no trap)
echo "== SIGKILL (no trap runs) once 8 steps are recorded"
rc=$(kill_after_steps kill8 KILL 8 -)
R="$W/kill8/results"
n_out=$(steps_of "$W/kill8/out/steps.jsonl" | wc -l)
n_res=$(steps_of "$R/steps.jsonl" | wc -l)
check "exit status is 137 (got $rc)" test "$rc" = 137
# The copy follows each record: at most the step recorded at the very moment of the kill is
# missing from $RESULTS.
check "\$RESULTS holds the finished steps ($n_res of $n_out; at most the last missing)" \
  test "$n_res" -ge $((n_out - 1)) -a "$n_res" -ge 7
check "\$RESULTS/steps.jsonl is a prefix of the output folder's" \
  test "$(steps_of "$W/kill8/out/steps.jsonl" | head -n "$n_res")" = "$(steps_of "$R/steps.jsonl")"
check "a summary so far is there" grep -q '"state": "after ' "$R/summary.json"

# ---------------------------------------------------------------- 4. the deadline
echo "== the deadline: DEADLINE_S=15, the GPU tests would take 60 s"
mkdir -p "$W/deadline"
t=$SECONDS
# shellcheck disable=SC2046
$(gc_env deadline DEADLINE_S=15 MARGIN_S=3 MIN_PCT=10 FAKE_GPU_TESTS_S=60) bash "$GC" \
  >"$W/deadline/stdout" 2>&1
took=$((SECONDS - t))
R="$W/deadline/results"
check "the script ends by the deadline (${took}s)" test "$took" -le 16
check "the GPU tests' limit was cut to the deadline and they timed out" \
  grep -q '"step": "gpu_tests", "status": "timeout", .*cut to the 15s deadline' "$R/steps.jsonl"
check "the steps after it are skipped with the reason" \
  grep -q '"step": "estimate_llama7b_adamw_none", "status": "skipped", .*"detail": "deadline: ' "$R/steps.jsonl"
check "the summary lists them" grep -q "profile_llama7b_lomo_full: skipped: deadline" "$R/summary.txt"

# ---------------------------------------------------------------- 5. the preflight
echo "== the preflight"
for case in missing incomplete nodevice meta; do
  mkdir -p "$W/pf_$case"
  extra=()
  case $case in
    missing) extra=(REQUIRE_DEVDEPS=1 DEVDEPS_DIR="$W/nonexistent") ;;
    incomplete)
      cp -r "$W/devdeps" "$W/devdeps_incomplete"
      rm "$W/devdeps_incomplete/libquadmath0_1.0_amd64.deb"
      extra=(REQUIRE_DEVDEPS=1 DEVDEPS_DIR="$W/devdeps_incomplete")
      ;;
    nodevice | meta)
      stub "$W/bin/nvidia-smi-none" 'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver"; exit 9'
      mkdir -p "$W/nogpubin" && cp "$W/bin/nvidia-smi-none" "$W/nogpubin/nvidia-smi"
      extra=(PATH="$W/bin:$W/nogpubin:$PATH")
      [[ $case == meta ]] && extra+=(BACKEND=meta DEADLINE_S=1)
      ;;
  esac
  t=$SECONDS
  # shellcheck disable=SC2046
  $(gc_env "pf_$case" "${extra[@]}") bash "$GC" >"$W/pf_$case/stdout" 2>&1
  rc=$?
  took=$((SECONDS - t))
  R="$W/pf_$case/results"
  if [[ $case == meta ]]; then
    check "meta dry run without a device: the device is reported, not fatal" \
      grep -q "^note  device .*not fatal in a BACKEND=meta dry run" "$W/pf_$case/stdout"
    check "meta dry run without a device: it goes on (rc $rc)" grep -q "== preflight ok" "$W/pf_$case/stdout"
    continue
  fi
  what=$([[ $case == nodevice ]] && echo device || echo devdeps)
  check "$case: refused with exit 2 (rc $rc) in seconds (${took}s)" test "$rc" = 2 -a "$took" -le 5
  check "$case: the first lines say so" grep -q "^FAIL  $what" <(head -n 6 "$W/pf_$case/stdout")
  check "$case: PREFLIGHT FAILED is printed" grep -q "PREFLIGHT FAILED" "$W/pf_$case/stdout"
  check "$case: \$RESULTS/summary.txt says why" grep -q "PREFLIGHT FAILED" "$R/summary.txt"
  check "$case: \$RESULTS/summary.json names the check" grep -q "\"$what: " "$R/summary.json"
  check "$case: nothing was built" test ! -e "$W/pf_$case/out/logs/build.log"
done
check "an incomplete bundle names the missing .deb" \
  grep -q "libquadmath0_1.0_amd64.deb: missing" "$W/pf_incomplete/stdout"

echo "gpu_check_selftest: $((SECONDS - T_START))s, $FAILS failure(s)"
if ((FAILS)); then
  echo "gpu_check_selftest: FAIL (outputs kept in $W)"
  trap - EXIT
  exit 1
fi
echo "gpu_check_selftest: PASS"
