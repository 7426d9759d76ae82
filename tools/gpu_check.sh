#!/usr/bin/env bash
# gpu_check.sh — everything trainmem can check on one GPU, in one call that always comes back
# with results (docs/gpu.md, "The one-call plan").
#
#   0. preflight (seconds, the first lines of output): the .devdeps bundle complete against its
#      manifest where the system lacks a library, nvcc, the device (nvidia-smi; reported but
#      not fatal under BACKEND=meta), free disk. A failure says why in the first lines, writes
#      the reason to $RESULTS and stops (exit 2) before anything long starts;
#   1. configure and build for sm_90 (-j$JOBS; the four targets it runs), then the GPU tests
#      (every op against the CPU reference, the model against the cpu backend, checkpointing
#      equivalence, cuda ledger == meta ledger) under CUDA_LAUNCH_BLOCKING=1, so a faulting
#      kernel fails at its own launch;
#   2. measured runs: LLaMA-7B, batch 8, seq 512, fp16, AdamW / SGD / LOMO, checkpointing off
#      and on. Each is predicted first (`trainmem estimate`, the native profile's peak); a run
#      predicted not to fit in this device's memory is reported as not fitting and skipped;
#   3. the GEMM rate of this GPU through trainmem's cuBLAS path (bf16), the training step's
#      throughput (tokens/s) and its model FLOP utilisation against it; the fp16 GEMM rate;
#   4. the PyTorch peer (tools/hf_peer.py: transformers' LlamaForCausalLM, random weights,
#      eager and sdpa attention, checkpointing off and on) where python3 has torch and
#      transformers; then the HF step of trainmem's event sequence (docs/hf-step.md) against
#      the real one: the literal loop with foreach AdamW on a 4-layer LLaMA-7B in bf16, its
#      max_memory_allocated beside trainmem's sequence peak;
#   5. a small sweep over (batch, seq) on a 4-layer LLaMA-7B (same per-layer shapes) for the
#      coefficient fit (`trainmem sweep --fit`, or profile runs and a least-squares fit here
#      when sweep is not available);
#   6. multi-rank runs (mpirun: two ranks sharing the GPU, collectives through host memory;
#      NCCL with two GPUs or more), last: they are worth least on a one-GPU machine;
#   7. a one-screen summary, and summary.json holding trainmem's and PyTorch's figures side by
#      side.
# The deadline: DEADLINE_S seconds (default 480) from the script's start. Every step's own
# limit is cut to what is left of it (less MARGIN_S, default 15, for the summary and the last
# copy); a step with less time left than its useful minimum is skipped and says so. A step that
# fails, times out or is not available (a subcommand not built yet) is recorded as such and the
# script goes on. All output goes under one folder: $OUT if set, else out/gpu_check-<date>.
# Results as it goes: after every step $RESULTS (if set) receives steps.jsonl, preflight.txt,
# the summary so far (summary.txt, summary.json) and gpu_check.tar.gz (the whole output folder:
# logs and result files), each replaced whole; on exit, on SIGTERM or SIGINT too, the
# interrupted step is recorded and the final summary written. A call killed at any moment so
# returns every step finished before it (5 files: within the transport's 8).
#
# Environment: OUT, BUILD (build folder, default build/gpu-sm90), JOBS (default: the
# machine's cores), CUDACXX (nvcc), PYTHON (default python3), DEADLINE_S, MARGIN_S,
# MIN_FREE_GIB (free disk the preflight asks for, default 4), REQUIRE_DEVDEPS (auto: the
# bundle must be complete where the system lacks a library; 1: always; 0: never),
# RUN_COMPARE=1 (also run `trainmem compare`), BACKEND (default cuda; BACKEND=meta dry-runs the
# whole script without a GPU: the measured runs and the sweep then trace on the meta backend,
# the throughput step is skipped), RESULTS (the folder that receives the files above).
# Libraries missing on the machine come from .devdeps (tools/devdeps.sh). On this project's
# lent GPU machines (docs/gpu.md):  tools/devdeps.sh fetch   here, then there
#   GPU_OUT=$OUT; OUT=/tmp/gpu_check RESULTS=$GPU_OUT bash tools/gpu_check.sh   (carry .devdeps)
set -uo pipefail

T0=$SECONDS
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/out/gpu_check-$(date +%Y%m%d-%H%M%S)}
BUILD=${BUILD:-$ROOT/build/gpu-sm90}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
PYTHON=${PYTHON:-python3}
DEADLINE_S=${DEADLINE_S:-480}
MARGIN_S=${MARGIN_S:-15}
MIN_FREE_GIB=${MIN_FREE_GIB:-4}
MIN_PCT=${MIN_PCT:-100}  # the steps' useful minimums, in percent (tools/gpu_check_selftest.sh)
REQUIRE_DEVDEPS=${REQUIRE_DEVDEPS:-auto}
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
BACKEND=${BACKEND:-cuda}
RESULTS=${RESULTS:-}
# The environment the PyTorch peer gets: the caller's, whatever the build needed.
PEER_LD_LIBRARY_PATH_SET=${LD_LIBRARY_PATH+set}
PEER_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
mkdir -p "$OUT/logs" "$OUT/runs"
[[ -n $RESULTS ]] && mkdir -p "$RESULTS"
STEPS="$OUT/steps.jsonl"
: >"$STEPS"
DEVICE_TOTAL_BYTES=0
CURRENT_STEP="" CURRENT_START=0 STEP_PID="" FINISHED=0

elapsed() { echo $((SECONDS - T0)); }
say() { echo "== [$((SECONDS - T0))s] $*" | tee -a "$OUT/gpu_check.log"; }

# A JSON string: control characters (a log's colours, carriage returns) become spaces.
json_str() {
  local s
  s=$(printf '%s' "$1" | tr '\001-\037' ' ')
  s=${s//\\/\\\\}
  printf '"%s"' "${s//\"/\\\"}"
}

# record NAME STATUS RC SECONDS DETAIL: one line of steps.jsonl (no python: it must work in
# the exit trap and cost nothing).
record() {
  printf '{"step": %s, "status": %s, "rc": %d, "seconds": %d, "detail": %s, "ended_at_s": %d}\n' \
    "$(json_str "$1")" "$(json_str "$2")" "$3" "$4" "$(json_str "$5")" "$((SECONDS - T0))" >>"$STEPS"
}

# Copies a file into $RESULTS whole (a copy then a rename: a kill leaves the old or the new).
put() {
  [[ -n $RESULTS && -f $1 ]] || return 0
  cp "$1" "$RESULTS/.$(basename "$1").part" && mv -f "$RESULTS/.$(basename "$1").part" "$RESULTS/$(basename "$1")"
}

# publish STATE: steps.jsonl into $RESULTS at once (a SIGKILL a moment later must not lose the
# record), then the summary so far, preflight.txt and the output folder's tarball. Called after
# every step.
publish() {
  put "$STEPS"
  summarize "$1" >/dev/null 2>>"$OUT/logs/summary.log"
  [[ -n $RESULTS ]] || return 0
  put "$OUT/preflight.txt"
  put "$OUT/summary.txt"
  put "$OUT/summary.json"
  tar -czf "$RESULTS/.gpu_check.tar.gz.part" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null &&
    mv -f "$RESULTS/.gpu_check.tar.gz.part" "$RESULTS/gpu_check.tar.gz"
}

# summarize STATE: summary.txt and summary.json from what is in $OUT now (after every step, so
# that a killed call still returns the summary so far).
summarize() {
  "$PYTHON" - "$OUT" "$DEVICE_TOTAL_BYTES" "$1" "$DEADLINE_S" "$((SECONDS - T0))" \
    >"$OUT/.summary.txt.tmp" <<'EOF' && mv -f "$OUT/.summary.txt.tmp" "$OUT/summary.txt"
import glob, json, os, sys

out, device_total, state = sys.argv[1], int(sys.argv[2] or 0), sys.argv[3]
deadline, elapsed = int(sys.argv[4]), int(sys.argv[5])
GiB = 2**30


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception:
        return None


def gib(x):
    return f"{x / GiB:7.2f}" if isinstance(x, (int, float)) and x >= 0 else "      -"


steps = [json.loads(l) for l in open(os.path.join(out, "steps.jsonl"), errors="replace")
         if l.strip()]
status = {s["step"]: s for s in steps}
summary = {"schema": "trainmem-gpu-check/1", "state": state, "elapsed_s": elapsed,
           "deadline_s": deadline, "device_total_bytes": device_total, "steps": steps}

print("=" * 78)
print(f"trainmem gpu_check — {out}")
print(f"state: {state}, at {elapsed}s of the {deadline}s deadline" +
      (" (partial: later steps not reached yet)" if state.startswith("after ") else ""))
try:
    summary["preflight"] = [l.rstrip("\n") for l in open(os.path.join(out, "preflight.txt"))]
except OSError:
    summary["preflight"] = None
for s in steps:
    if s["status"] in ("skipped", "interrupted", "timeout"):
        print(f"  {s['step']}: {s['status']}: {s['detail'][:150]}")
print(f"device memory {device_total / GiB:.1f} GiB; steps: " +
      ", ".join(f"{k}={v}" for k, v in sorted(
          {st: sum(1 for s in steps if s["status"] == st) for st in
           {s["status"] for s in steps}}.items())))

tests = load(os.path.join(out, "gpu_tests.json"))
if tests:
    failed = [f"{s['name']}.{t['name']}" for s in tests.get("testsuites", [])
              for t in s.get("testsuite", []) if t.get("failures")]
    skipped = sum(1 for s in tests.get("testsuites", []) for t in s.get("testsuite", [])
                  if t.get("result") == "SKIPPED")
    summary["gpu_tests"] = {"tests": tests.get("tests"), "failures": tests.get("failures"),
                            "skipped": skipped, "failed": failed}
    print(f"GPU tests: {tests.get('tests')} run, {tests.get('failures')} failed, "
          f"{skipped} skipped" + (f"; first failures: {', '.join(failed[:3])}" if failed else ""))
    if tests.get("tests") and skipped == tests.get("tests"):
        print("WARNING: every GPU test skipped: no usable CUDA device (see logs/gpu_tests.log)")
else:
    # No JSON (gtest writes it at the end: the binary was stopped or crashed): count the log.
    st = status.get('gpu_tests', {}).get('status', 'not run')
    try:
        log = open(os.path.join(out, "logs", "gpu_tests.log"), errors="replace").read()
    except OSError:
        log = ""
    if log:
        ok = log.count("[       OK ]")
        failed = sorted({l.split("]", 1)[1].split("(")[0].strip()
                         for l in log.splitlines() if l.startswith("[  FAILED  ]") and "(" in l})
        skipped = log.count("[  SKIPPED ]")
        summary["gpu_tests"] = {"from_log": True, "ok": ok, "skipped": skipped, "failed": failed}
        print(f"GPU tests ({st}, counted from the log): {ok} ok, {len(failed)} failed, "
              f"{skipped} skipped" + (f"; first failures: {', '.join(failed[:3])}" if failed else ""))
    else:
        print(f"GPU tests: {st}")
try:
    dev = [l.strip() for l in open(os.path.join(out, "logs", "gpu_tests.log"), errors="replace")
           if l.startswith("[ DEVICE   ]")]
except OSError:
    dev = []
if dev:
    summary.setdefault("gpu_tests", {})["device_errors"] = dev
    for l in dev[:4]:
        print(f"  {l}")

gemm = {}
for dt in ("bf16", "fp16"):
    g = load(os.path.join(out, f"gemm_{dt}.json"))
    if g:
        gemm[dt] = g
summary["gemm"] = gemm
if gemm:
    print("GEMM (cuBLAS, fp32 accumulate): " + ", ".join(
        f"{dt} {g['best_tflops']:.0f} TFLOP/s" for dt, g in gemm.items()))

print("-" * 78)
print("LLaMA-7B b8 s512 fp16 eager   predicted   ledger    pool-res  memgetinfo  status  (GiB)")
runs = {}
for opt in ("adamw", "sgd", "lomo"):
    for ck in ("none", "full"):
        name = f"llama7b_{opt}_{ck}"
        est = load(os.path.join(out, "runs", f"{name}.estimate.json"))
        prof = load(os.path.join(out, "runs", f"{name}.profile.json"))
        st = status.get(f"profile_{name}", {}).get("status", "not run")
        pred = (est or {}).get("analytic", {}).get("native", {}).get("peak")
        meas = (prof or {}).get("measured", {}) or {}
        ledger = (meas.get("ledger") or {}).get("peak")
        pool = meas.get("pool") or {}
        pool_res = pool.get("reserved_high")
        mgi = meas.get("memgetinfo") or {}
        mgi_peak = (mgi.get("sampler") or {}).get("max_used")
        recon = (prof or {}).get("reconciliation") or []
        not_ok = sum(1 for r in recon if r.get("ok") is False)
        runs[name] = {"optimizer": opt, "checkpointing": ck, "status": st,
                      "predicted_peak": pred, "estimate": est, "profile": prof}
        print(f"  {opt:6s} ckpt={ck:4s}           {gib(pred)}  {gib(ledger)}  {gib(pool_res)}  "
              f"{gib(mgi_peak)}    {st}" + (f" ({not_ok} reconciliation rows not ok)"
                                             if not_ok else ""))
name = "llama7b_qlora_adamw8bit"
est = load(os.path.join(out, "runs", f"{name}.estimate.json"))
prof = load(os.path.join(out, "runs", f"{name}.profile.json"))
st = status.get(f"profile_{name}", {}).get("status", "not run")
pred = (est or {}).get("analytic", {}).get("native", {}).get("peak")
meas = (prof or {}).get("measured", {}) or {}
recon = (prof or {}).get("reconciliation") or []
not_ok = sum(1 for r in recon if r.get("ok") is False)
print(f"  QLoRA nf4 all-linear r16, adamw8bit, bf16 flash ckpt=full:  predicted {gib(pred)}  "
      f"ledger {gib((meas.get('ledger') or {}).get('peak'))}  "
      f"pool-res {gib((meas.get('pool') or {}).get('reserved_high'))}  "
      f"memgetinfo {gib(((meas.get('memgetinfo') or {}).get('sampler') or {}).get('max_used'))}  {st}"
      + (f" ({not_ok} reconciliation rows not ok)" if not_ok else ""))
runs[name] = {"optimizer": "adamw8bit", "checkpointing": "full", "finetune": "qlora",
              "status": st, "predicted_peak": pred, "estimate": est, "profile": prof}
summary["trainmem_runs"] = runs
summary["compare"] = load(os.path.join(out, "runs", "llama7b_compare.json"))

thr = load(os.path.join(out, "throughput.json"))
summary["throughput"] = thr
if thr:
    print(f"throughput (sgd, no ckpt): {thr.get('tokens_per_s', 0):,.0f} tokens/s, "
          f"{thr.get('step_ms', 0):.0f} ms/step, MFU {100 * (thr.get('mfu') or 0):.1f}% "
          f"of the measured bf16 GEMM rate")

peer = load(os.path.join(out, "hf_peer.json"))
summary["peer"] = peer
print("-" * 78)
if peer:
    print(f"PyTorch peer (torch {peer['torch']}, transformers {peer['transformers']}, "
          f"{peer['run']['optimizer']}):")
    print("  attention (ran)  ckpt (ran)    max_alloc  fwd_growth  ms/step   tokens/s  status")
    for c in peer["configs"]:
        mask = c.get("sdpa_attn_mask")
        print(f"  {c['attention']:5s}/{c.get('attention_effective', '?'):6s}  "
              f"{c['checkpointing']:4s}/{c.get('checkpointing_effective', '?'):4s}  "
              f"{gib(c.get('max_memory_allocated'))}  {gib(c.get('forward_growth'))}   "
              f"{c.get('median_step_ms') or 0:7.0f}  {c.get('tokens_per_s') or 0:9.0f}  "
              f"{c['status']}" + (f"  sdpa mask {mask}" if mask else ""))
    hf = ((load(os.path.join(out, "runs", "hf_eager.estimate.json")) or {}).get("analytic") or {})
    hf = hf.get("hf-eager") or {}
    if hf:
        print(f"  trainmem's hf-eager profile (HF 4.30 / torch 2.0 autograd, sgd, no ckpt): "
              f"activations {gib(hf.get('activations'))}, peak {gib(hf.get('peak'))} GiB")
    summary["hf_eager_analytic"] = hf or None
else:
    print(f"PyTorch peer: {status.get('hf_peer', {}).get('status', 'not run')}: "
          f"{status.get('hf_peer', {}).get('detail', '')}")

# The HF step event by event: the real steady step's max_memory_allocated against trainmem's
# sequence (estimate --profile hf-eager|hf-sdpa --precision pure --adamw-impl foreach).
step_peer = load(os.path.join(out, "hf_step_peer.json"))
summary["hf_step_peer"] = step_peer
rows = []
if step_peer:
    print("HF step, event by event: the real step vs trainmem's sequence (4-layer LLaMA-7B, "
          "b 4, s 512, bf16, AdamW foreach, literal loop):")
    print("  attention  ckpt   real max_alloc  trainmem peak   trainmem - real")
    for c in step_peer.get("configs", []):
        est = load(os.path.join(out, "runs", f"hf_step_{c['attention']}.estimate.json")) or {}
        ours = None
        for r in est.get("runs", []):
            if (r.get("run") or {}).get("checkpointing") == c["checkpointing"]:
                ours = ((r.get("analytic") or {}).get("hf-" + c["attention"]) or {}).get("peak")
        real = c.get("max_memory_allocated") if c.get("status") == "ok" else None
        diff = (f"{ours - real:+,d} B ({100 * (ours - real) / real:+.2f}%)"
                if ours and real else "n/a")
        rows.append({"attention": c["attention"], "checkpointing": c["checkpointing"],
                     "real_max_memory_allocated": real, "trainmem_peak": ours,
                     "real_memory_reserved": c.get("memory_reserved"), "status": c["status"]})
        print(f"  {c['attention']:9s}  {c['checkpointing']:5s}  {gib(real)}      {gib(ours)}     "
              f"{diff}  {c['status']}")
else:
    print(f"HF step peer: {status.get('hf_step_peer', {}).get('status', 'not run')}: "
          f"{status.get('hf_step_peer', {}).get('detail', '')}")
summary["hf_step_comparison"] = rows

# Coefficient fit: from `sweep --fit`, else least squares here on the profile runs:
# per-layer activation bytes = c_sbh * s*b*h + c_as2b * a*s^2*b.
print("-" * 78)
sweep = load(os.path.join(out, "runs", "sweep.json"))
fit = None
if sweep and "fit" in sweep:
    fit = {"source": "trainmem sweep --fit", "fit": sweep["fit"]}
    led = sweep["fit"].get("ledger", {})
    print(f"sweep fit (ledger): {led.get('coefficients')} r2={led.get('r2')}")
else:
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "runs", "sweep_b*_s*.json"))):
        d = load(path)
        try:
            m, r = d["model"], d["run"]
            per_layer = d["measured"]["ledger"]["per_layer_activations"]
            rows.append((r["seq"] * r["batch"] * m["hidden"],
                         m["heads"] * r["seq"] ** 2 * r["batch"], per_layer))
        except Exception:
            pass
    if len(rows) >= 2:
        sxx = sum(a * a for a, _, _ in rows); sxy = sum(a * b for a, b, _ in rows)
        syy = sum(b * b for _, b, _ in rows)
        sxz = sum(a * z for a, _, z in rows); syz = sum(b * z for _, b, z in rows)
        det = sxx * syy - sxy * sxy
        c1 = (sxz * syy - syz * sxy) / det
        c2 = (sxx * syz - sxy * sxz) / det
        res = [z - (c1 * a + c2 * b) for a, b, z in rows]
        fit = {"source": "least squares over sweep_b*_s*.json (ledger per-layer activations)",
               "coefficients": {"sbh": c1, "as2b": c2}, "residuals": res, "points": len(rows)}
        print(f"fit over {len(rows)} runs: per-layer bytes = {c1:.3f}*sbh + {c2:.3f}*as^2b "
              f"(max |residual| {max(abs(x) for x in res):.0f} B)")
    else:
        print("coefficient fit: no sweep data")
summary["fit"] = fit

with open(os.path.join(out, ".summary.json.tmp"), "w") as f:
    json.dump(summary, f, indent=2)
os.replace(os.path.join(out, ".summary.json.tmp"), os.path.join(out, "summary.json"))
print("=" * 78)
print(f"all JSON under {out}; summary.json holds trainmem's and PyTorch's figures together")
EOF
}

# time_for NAME MIN_S: whether MIN_S (its useful minimum, scaled by MIN_PCT) is left before the
# deadline, less MARGIN_S; if not, NAME is recorded as skipped with the reason. No copy to
# $RESULTS per skipped step (a summary costs a python start): the next step that runs, or the
# exit trap, publishes these records.
time_for() {
  local min=$(($2 * MIN_PCT / 100)) left=$((DEADLINE_S - (SECONDS - T0) - MARGIN_S))
  ((min < 1)) && min=1  # timeout 0 would mean no limit at all
  ((left >= min)) && return 0
  say "$1: skipped: ${left}s left before the ${DEADLINE_S}s deadline, it needs ${min}s"
  record "$1" skipped 0 0 "deadline: ${left}s left of ${DEADLINE_S}s, the step needs at least ${min}s"
  return 1
}

# run_step NAME LIMIT_S MIN_S CMD... : runs CMD with LIMIT_S cut to what is left before the
# deadline (less MARGIN_S); skipped when less than MIN_S (the least it needs to be of use) is
# left. Logs to logs/NAME.log, records the outcome (ok | failed | timeout | oom (exit 3) |
# unavailable (a subcommand not built yet) | skipped) and publishes. The command runs in the
# background and the script waits for it, so SIGTERM/SIGINT reach the trap at once.
run_step() {
  local name=$1 limit=$2 min=$3
  shift 3
  time_for "$name" "$min" || return 99
  local left=$((DEADLINE_S - (SECONDS - T0) - MARGIN_S)) cut=""
  if ((left < limit)); then
    cut=" (own limit ${limit}s cut to the ${DEADLINE_S}s deadline)"
    limit=$left
  fi
  say "$name: [limit ${limit}s] $*"
  local t=$SECONDS rc status detail=""
  CURRENT_STEP=$name CURRENT_START=$SECONDS
  timeout --signal=TERM --kill-after=5 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1 </dev/null &
  STEP_PID=$!
  wait "$STEP_PID"
  rc=$?
  STEP_PID="" CURRENT_STEP=""
  case $rc in
    0) status=ok ;;
    3) status=oom ;;
    124 | 137) status=timeout detail="exceeded ${limit}s$cut" ;;
    *) status=failed ;;
  esac
  if ((rc == 2)) && grep -qiE "not built yet|not available|unknown subcommand|not expected" \
    "$OUT/logs/$name.log"; then
    status=unavailable
  fi
  [[ -z $detail ]] && detail=$(tail -n 3 "$OUT/logs/$name.log" | tr '\n' ' ' | cut -c1-300)
  say "$name: $status (rc $rc, $((SECONDS - t))s)"
  record "$name" "$status" "$rc" "$((SECONDS - t))" "$detail"
  publish "after $name"
  return $rc
}

# On exit (normal, error, or SIGTERM/SIGINT): stop the step in flight, record it as
# interrupted, write the final summary and copy everything to $RESULTS.
INTERRUPTED=""
on_signal() {
  # First: the same signal comes two or three times (kill to the group, then timeout signals
  # its child and its group again); one arriving before this line would re-enter here and exit
  # with the EXIT trap already spent, losing the interrupted record (seen in CI under load).
  trap '' TERM INT
  INTERRUPTED=$1
  exit $((128 + $2))
}
on_exit() {
  local rc=$?
  trap '' TERM INT  # a second signal (timeout signals the child, then its group) must not cut this short
  trap - EXIT
  if [[ -n $STEP_PID ]]; then
    kill -TERM "$STEP_PID" 2>/dev/null
    wait "$STEP_PID" 2>/dev/null
  fi
  if [[ -n $CURRENT_STEP ]]; then
    record "$CURRENT_STEP" interrupted "$rc" "$((SECONDS - CURRENT_START))" \
      "stopped by ${INTERRUPTED:-exit $rc} after $((SECONDS - CURRENT_START))s; log: logs/$CURRENT_STEP.log"
  fi
  if ((FINISHED)); then
    publish complete
  elif [[ -n $INTERRUPTED ]]; then
    echo "== [$((SECONDS - T0))s] interrupted by $INTERRUPTED${CURRENT_STEP:+ during $CURRENT_STEP}: results so far in ${RESULTS:-$OUT}"
    publish "interrupted by $INTERRUPTED${CURRENT_STEP:+ during $CURRENT_STEP}"
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'on_signal SIGTERM 15' TERM
trap 'on_signal SIGINT 2' INT

# ---------------------------------------------------------------- 0. preflight
# shellcheck source=tools/devdeps.sh
source "$ROOT/tools/devdeps.sh" functions
PREFLIGHT="$OUT/preflight.txt"
PF_FAIL=()
pf() {  # pf ok|FAIL|note WHAT TEXT
  printf '%-5s %-8s %s\n' "$1" "$2" "$3" | tee -a "$PREFLIGHT"
  [[ $1 == FAIL ]] && PF_FAIL+=("$2: $3")
  return 0
}
: >"$PREFLIGHT"
echo "== gpu_check preflight (deadline ${DEADLINE_S}s from now, BACKEND=$BACKEND, JOBS=$JOBS, output $OUT)" |
  tee -a "$PREFLIGHT"
missing_libs=$(devdeps_missing | tr '\n' ' ')
missing_libs=${missing_libs% }
need_bundle=0
case $REQUIRE_DEVDEPS in
  1) need_bundle=1 ;;
  0) need_bundle=0 ;;
  *) [[ -n $missing_libs ]] && need_bundle=1 ;;
esac
if verify_msg=$(devdeps_verify 2>&1); then
  verify_msg=${verify_msg#devdeps: }
  pf ok devdeps "$verify_msg${missing_libs:+ (the system lacks: $missing_libs)}"
elif verify_msg=${verify_msg#devdeps: } && ((need_bundle)); then
  pf FAIL devdeps "$verify_msg${missing_libs:+ (the system lacks: $missing_libs)}"
else
  pf note devdeps "not needed: every library is installed (${verify_msg})"
fi
if nvcc_v=$("$NVCC" --version 2>/dev/null | grep -i release); then
  pf ok nvcc "$NVCC: $nvcc_v"
else
  pf FAIL nvcc "$NVCC not found or not working (set CUDACXX)"
fi
if gpus=$(nvidia-smi -L 2>&1) && grep -q '^GPU ' <<<"$gpus"; then
  pf ok device "$(grep '^GPU ' <<<"$gpus" | head -n 2 | tr '\n' ' ')"
elif [[ $BACKEND == meta ]]; then
  pf note device "no device visible (nvidia-smi: $(head -n 1 <<<"$gpus" | cut -c1-120)); not fatal in a BACKEND=meta dry run"
else
  pf FAIL device "no device visible (nvidia-smi: $(head -n 1 <<<"$gpus" | cut -c1-120))"
fi
for d in "$(dirname "$BUILD")" "$OUT"; do
  mkdir -p "$d" 2>/dev/null
  free_kb=$(df -Pk "$d" 2>/dev/null | awk 'NR == 2 {print $4}')
  free_kb=${free_kb:-0}
  if ((free_kb / 1048576 >= MIN_FREE_GIB)); then
    pf ok disk "$((free_kb / 1048576)) GiB free under $d"
  else
    pf FAIL disk "$((free_kb / 1048576)) GiB free under $d, ${MIN_FREE_GIB} GiB needed (MIN_FREE_GIB)"
  fi
done
if ! "$PYTHON" -c 'import json' 2>/dev/null; then
  pf FAIL python "$PYTHON not found (set PYTHON)"
fi
if ((${#PF_FAIL[@]})); then
  echo "== PREFLIGHT FAILED after $(elapsed)s: nothing was built or run:" | tee -a "$PREFLIGHT"
  for r in "${PF_FAIL[@]}"; do echo "   $r"; done | tee -a "$PREFLIGHT"
  {
    echo "trainmem gpu_check: PREFLIGHT FAILED ($(date -Is)); nothing was built or run"
    for r in "${PF_FAIL[@]}"; do echo "  $r"; done
    echo "preflight.txt holds every check."
  } >"$OUT/summary.txt"
  {
    printf '{"schema": "trainmem-gpu-check/1", "state": "preflight failed", "preflight_failures": ['
    sep=""
    for r in "${PF_FAIL[@]}"; do printf '%s%s' "$sep" "$(json_str "$r")"; sep=", "; done
    printf '], "steps": []}\n'
  } >"$OUT/summary.json"
  if [[ -n $RESULTS ]]; then
    for f in "$PREFLIGHT" "$OUT/summary.txt" "$OUT/summary.json"; do put "$f"; done
  fi
  trap - EXIT
  exit 2
fi
echo "== preflight ok after $(elapsed)s" | tee -a "$PREFLIGHT"
put "$PREFLIGHT"

# ---------------------------------------------------------------- the machine
say "output: $OUT"
{
  echo "date: $(date -Is)"
  echo "host: $(hostname)"
  echo "git: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null) $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed files"
  echo "nvcc: $("$NVCC" --version 2>/dev/null | tail -n 1)"
  echo "cores: $(nproc 2>/dev/null), JOBS=$JOBS, deadline ${DEADLINE_S}s, margin ${MARGIN_S}s"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
} >"$OUT/machine.txt"
# In bash: mawk's printf "%d" stops at 2^31-1, which made every LLaMA-7B run "not fitting".
DEVICE_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null |
  head -n 1 | tr -dc '0-9')
DEVICE_TOTAL_BYTES=$((${DEVICE_MIB:-0} * 1048576))
say "device memory: $DEVICE_TOTAL_BYTES bytes"

# ---------------------------------------------------------------- 1. build and GPU tests
# Libraries: the system's, else the Debian packages carried in .devdeps (tools/devdeps.sh: the
# GPU machines have CUDA, CMake and a compiler, but no network and maybe none of these).
DEVDEPS_CMAKE_ARGS=()
t=$SECONDS
if devdeps_use >"$OUT/logs/devdeps.log" 2>&1; then
  record devdeps ok 0 "$((SECONDS - t))" "$(tail -n 1 "$OUT/logs/devdeps.log")"
else
  record devdeps failed 1 "$((SECONDS - t))" "$(tail -n 1 "$OUT/logs/devdeps.log")"
fi
say "$(tail -n 1 "$OUT/logs/devdeps.log")"
publish "after devdeps"
run_step configure 120 10 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTRAINMEM_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=90 \
  "${DEVDEPS_CMAKE_ARGS[@]}"
# Only what this script runs (the CPU test suite is CI's job): about 40% less to compile.
run_step build 360 30 cmake --build "$BUILD" -j "$JOBS" --target trainmem trainmem_gpu_tests \
  bench_gemm_cuda bench_step_cuda
BUILD_OK=$?
TM="$BUILD/trainmem"
if ((BUILD_OK != 0)); then
  # Stale binaries from an earlier build must not be measured as if they were this tree.
  say "no build (the build step's status is in steps.jsonl, its log in logs/build.log): the binaries' steps are left out"
  BUILD=/nonexistent
  TM=/nonexistent
fi

# CUDA_LAUNCH_BLOCKING=1: every launch waits for its kernel, so a fault is reported by the
# launch that caused it (the launcher's file:line), not by a later copy; the tests' helper
# (tests/gpu_test_util.hpp) names the first test after which the device was in error and
# gives later tests a fresh backend (or fails them saying why). The CPU references take well
# under a second per comparison: 150 s is ample.
if [[ -x $BUILD/trainmem_gpu_tests ]]; then
  run_step gpu_tests 150 30 env CUDA_LAUNCH_BLOCKING=1 "$BUILD/trainmem_gpu_tests" \
    --gtest_output="json:$OUT/gpu_tests.json"
fi

# ---------------------------------------------------------------- 2. measured runs
COMMON=(--model llama-7b --batch 8 --seq 512 --dtype fp16 --attention eager)
# Headroom for what no tensor owns (CUDA context, cuBLAS, pool rounding): 3 GiB.
HEADROOM=$((3 * 1024 * 1024 * 1024))
# fits NAME: whether the native peak of runs/NAME.estimate.json plus the headroom fits the device;
# records profile_NAME as not_fitting when it does not. No prediction: it runs anyway, said.
fits() {
  local predicted
  predicted=$("$PYTHON" -c 'import json,sys
try: print(int(json.load(open(sys.argv[1]))["analytic"]["native"]["peak"]))
except Exception: print(-1)' "$OUT/runs/$1.estimate.json" 2>/dev/null)
  predicted=${predicted:--1}
  if ((predicted > 0 && DEVICE_TOTAL_BYTES > 0 && predicted + HEADROOM > DEVICE_TOTAL_BYTES)); then
    say "$1: predicted peak $predicted B + headroom > device $DEVICE_TOTAL_BYTES B: does not fit, skipped"
    record "profile_$1" not_fitting 0 0 "predicted peak $predicted bytes + $HEADROOM headroom > device $DEVICE_TOTAL_BYTES bytes"
    publish "after profile_$1"
    return 1
  fi
  ((predicted <= 0)) && say "$1: no prediction (estimate unavailable): running it anyway"
  return 0
}
if [[ -x $TM ]]; then
  # Every prediction first (a second each): they are in the results even if no run follows.
  for opt in adamw sgd lomo; do
    for ck in none full; do
      name="llama7b_${opt}_${ck}"
      run_step "estimate_$name" 30 5 "$TM" estimate "${COMMON[@]}" --optimizer "$opt" \
        --checkpointing "$ck" --profile native --format json --output "$OUT/runs/$name.estimate.json"
    done
  done
  # QLoRA on all seven projections with bitsandbytes' 8-bit AdamW (bf16: 8-bit AdamW has no fp16
  # step), checkpointed: the 4-bit base quantized on the device and dequantized around each GEMM,
  # the adapters' rows and their 8-bit states.
  LORA=(--model llama-7b --batch 8 --seq 512 --dtype bf16 --attention flash --finetune qlora
    --lora-targets all-linear --optimizer adamw8bit --checkpointing full)
  run_step estimate_llama7b_qlora_adamw8bit 30 5 "$TM" estimate "${LORA[@]}" --profile native \
    --format json --output "$OUT/runs/llama7b_qlora_adamw8bit.estimate.json"
  for opt in adamw sgd lomo; do
    for ck in none full; do
      name="llama7b_${opt}_${ck}"
      time_for "profile_$name" 30 || continue
      fits "$name" || continue
      run_step "profile_$name" 150 30 "$TM" profile "${COMMON[@]}" --optimizer "$opt" \
        --checkpointing "$ck" --backend "$BACKEND" --steps 2 --format json \
        --output "$OUT/runs/$name.profile.json"
    done
  done
  # QLoRA, measured after the six: its prediction above, the same fit check.
  name=llama7b_qlora_adamw8bit
  if time_for "profile_$name" 30 && fits "$name"; then
    run_step "profile_$name" 150 30 "$TM" profile "${LORA[@]}" --backend "$BACKEND" --steps 2 \
      --format json --output "$OUT/runs/$name.profile.json"
  fi
fi

# ---------------------------------------------------------------- 3. GEMM rate and throughput
if [[ -x $BUILD/bench_gemm_cuda ]]; then
  run_step gemm_bf16 60 15 "$BUILD/bench_gemm_cuda" --dtype bf16 --json "$OUT/gemm_bf16.json"
fi
if [[ -x $BUILD/bench_step_cuda && $BACKEND == cuda ]]; then
  run_step throughput 120 40 "$BUILD/bench_step_cuda" --model llama-7b --batch 8 --seq 512 \
    --dtype fp16 --optimizer sgd --checkpointing none --steps 3 \
    --gemm-json "$OUT/gemm_bf16.json" --json "$OUT/throughput.json"
fi
if [[ -x $BUILD/bench_gemm_cuda ]]; then
  run_step gemm_fp16 60 15 "$BUILD/bench_gemm_cuda" --dtype fp16 --json "$OUT/gemm_fp16.json"
fi

# ---------------------------------------------------------------- 4. the PyTorch peer
# The analytic hf-eager profile of the same step, to set beside the peer's measurements.
if [[ -x $TM ]]; then
  run_step estimate_hf_eager 30 5 "$TM" estimate "${COMMON[@]}" --optimizer sgd \
    --checkpointing none --profile hf-eager --format json --output "$OUT/runs/hf_eager.estimate.json"
fi
# The peer's python gets the caller's LD_LIBRARY_PATH, never one pointing at the bundle's
# Debian libgfortran/OpenBLAS/fmt (tools/devdeps.sh exports none; this keeps it so).
if [[ $PEER_LD_LIBRARY_PATH_SET == set ]]; then
  PEER_ENV=(env LD_LIBRARY_PATH="$PEER_LD_LIBRARY_PATH")
else
  PEER_ENV=(env -u LD_LIBRARY_PATH)
fi
if "${PEER_ENV[@]}" "$PYTHON" -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
  run_step hf_peer 240 90 "${PEER_ENV[@]}" "$PYTHON" "$ROOT/tools/hf_peer.py" --model llama-7b \
    --batch 8 --seq 512 --dtype fp16 --optimizer sgd --attention eager,sdpa \
    --checkpointing none,full --steps 2 --output "$OUT/hf_peer.json"
  # The HF step event by event (docs/hf-step.md): the literal loop trainmem's sequence models
  # (out = model(...); backward; AdamW foreach step; zero_grad), a 4-layer LLaMA-7B (the same
  # per-layer shapes) in bf16, the pure recipe; the real steady step's max_memory_allocated
  # beside trainmem's sequence of the same configuration (its config.json written by the peer).
  run_step hf_step_peer 120 30 "${PEER_ENV[@]}" "$PYTHON" "$ROOT/tools/hf_peer.py" \
    --model llama-7b --layers 4 --batch 4 --seq 512 --dtype bf16 --optimizer adamw-foreach \
    --loop literal --attention eager,sdpa --checkpointing none,full --steps 2 \
    --write-config "$OUT/hf_step_peer.config.json" --output "$OUT/hf_step_peer.json"
  if [[ -x $TM ]]; then
    for attn in eager sdpa; do
      run_step "estimate_hf_step_$attn" 30 5 "$TM" estimate --model "$OUT/hf_step_peer.config.json" \
        --batch 4 --seq 512 --dtype bf16 --precision pure --adamw-impl foreach \
        --profile "hf-$attn" --checkpointing both --format json \
        --output "$OUT/runs/hf_step_$attn.estimate.json"
    done
  fi
else
  say "hf_peer: $PYTHON lacks torch with CUDA or transformers: peer not run"
  record hf_peer unavailable 0 0 "$PYTHON lacks torch with CUDA or transformers"
  record hf_step_peer unavailable 0 0 "$PYTHON lacks torch with CUDA or transformers"
  publish "after hf_peer"
fi

# ---------------------------------------------------------------- 5. sweep for the fit
SWEEP_MODEL="$OUT/llama7b-4layers.json"
cat >"$SWEEP_MODEL" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
 "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 4,
 "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "float16"}
EOF
if [[ -x $TM ]]; then
  SWEEP=(--model "$SWEEP_MODEL" --dtype fp16 --optimizer lomo --attention eager)
  if ! run_step sweep 180 40 "$TM" sweep "${SWEEP[@]}" --batch 1,2,4 --seq 128,256,512 --fit \
    --backend "$BACKEND" --steps 2 --format json --output "$OUT/runs/sweep.json"; then
    if grep -q '"step": "sweep", "status": "unavailable"' "$STEPS" &&
      grep -qE '"step": "profile_[a-z0-9_]+", "status": "(ok|oom)"' "$STEPS"; then
      say "sweep unavailable: profile runs over the grid instead, fitted in the summary"
      for b in 1 2 4; do
        for s in 128 256 512; do
          run_step "sweep_b${b}_s${s}" 60 15 "$TM" profile "${SWEEP[@]}" --batch "$b" --seq "$s" \
            --backend "$BACKEND" --steps 2 --profile native --format json \
            --output "$OUT/runs/sweep_b${b}_s${s}.json"
        done
      done
    fi
  fi
  # `compare` repeats the profile runs as one document: off by default (time), RUN_COMPARE=1.
  if [[ ${RUN_COMPARE:-0} == 1 ]]; then
    run_step compare 400 60 "$TM" compare "${COMMON[@]}" --optimizer sgd --checkpointing both \
      --backend "$BACKEND" --steps 2 --format json --output "$OUT/runs/llama7b_compare.json"
  fi
fi

# ---------------------------------------------------------------- 6. multi-rank (measured ranks), last
# Under mpirun: every rank's measured sharded step against its meta trace and the analytic, rank
# 0's gathered report. With NCCL (one rank per GPU): needs two or more GPUs. With the collectives
# through host memory (--collectives mpi): two ranks sharing the GPU(s), so a one-GPU machine
# runs them too (the sharded step's own checks: tests/mpi_test_sharded.cpp --backend cuda
# --collectives mpi, losses against the cpu). Needs mpirun and an MPI build; skipped with the
# reason otherwise.
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
GPUS=${GPUS:-0}
if [[ ! -x $TM ]]; then
  record multi_gpu skipped 0 0 "no trainmem binary"
elif ! command -v mpirun >/dev/null; then
  say "multi_rank: skipped: mpirun not found (openmpi-bin)"
  record multi_gpu skipped 0 0 "mpirun not found (openmpi-bin)"
else
  MPIRUN=(mpirun -np "$GPUS" --bind-to none)
  SHARED=(mpirun -np 2 --oversubscribe --bind-to none)
  if [[ $(id -u) == 0 ]]; then
    MPIRUN+=(--allow-run-as-root)
    SHARED+=(--allow-run-as-root)
  fi
  if ((GPUS >= 1)); then
    # Two ranks sharing the GPU(s), the collectives through host memory.
    for lay in "zero3:--zero 3" "tp2_sp:--tp 2 --sp" "pp2:--pp 2 --microbatches 3" \
      "cp2:--cp 2 --attention flash"; do
      # shellcheck disable=SC2086
      run_step "shared_gpu_${lay%%:*}" 120 30 "${SHARED[@]}" "$TM" profile --backend cuda \
        --collectives mpi --model tiny --batch 2 --seq 64 --world-size 2 ${lay#*:} --steps 2 \
        --format json --output "$OUT/runs/shared_gpu_${lay%%:*}.json"
    done
    if run_step build_mpi_test 240 60 cmake --build "$BUILD" -j "$JOBS" --target mpi_test_sharded; then
      run_step shared_gpu_sharded 180 40 "${SHARED[@]}" "$BUILD/mpi_test_sharded" --backend cuda \
        --collectives mpi
    fi
  fi
  if ((GPUS < 2)); then
    say "multi_gpu: skipped: this machine has $GPUS GPU(s); NCCL needs one GPU per rank, 2 or more"
    record multi_gpu skipped 0 0 "$GPUS GPU(s): the NCCL step needs one GPU per rank, 2 or more"
  else
    for zero in 1 3; do
      run_step "multi_gpu_zero$zero" 120 30 "${MPIRUN[@]}" "$TM" profile --backend cuda \
        --model tiny --batch 2 --seq 64 --world-size "$GPUS" --zero "$zero" --steps 2 \
        --format json --output "$OUT/runs/multi_gpu_zero$zero.json"
    done
    # Tensor parallelism with sp over NCCL (tiny's 4 heads: 2 or 4 GPUs per group).
    if ((GPUS % 2 == 0)); then
      run_step multi_gpu_tp2_sp 120 30 "${MPIRUN[@]}" "$TM" profile --backend cuda --model tiny \
        --batch 2 --seq 64 --world-size "$GPUS" --tp 2 --sp --steps 2 --format json \
        --output "$OUT/runs/multi_gpu_tp2_sp.json"
      # Pipeline stages (1F1B, messages through host memory over MPI), three micro-batches.
      run_step multi_gpu_pp2 120 30 "${MPIRUN[@]}" "$TM" profile --backend cuda --model tiny \
        --batch 2 --seq 64 --world-size "$GPUS" --pp 2 --microbatches 3 --steps 2 --format json \
        --output "$OUT/runs/multi_gpu_pp2.json"
    fi
  fi
fi

# ---------------------------------------------------------------- 7. summary
say "summary"
FINISHED=1
summarize complete >/dev/null 2>>"$OUT/logs/summary.log"
cat "$OUT/summary.txt"
say "done in $((SECONDS - T0))s"
[[ -n $RESULTS ]] && echo "results: $RESULTS/{summary.txt,summary.json,steps.jsonl,preflight.txt,gpu_check.tar.gz}"
exit 0
