#!/usr/bin/env bash
# gpu_check.sh — everything trainmem can check on one GPU, in one go (< 8 minutes on an H200).
#
#   1. configure and build for sm_90 (-j16; the four targets it runs), run the GPU tests (every op against the CPU
#      reference, the model against the cpu backend, checkpointing equivalence, cuda ledger ==
#      meta ledger);
#   2. the GEMM rate of this GPU through trainmem's cuBLAS path (bf16 and fp16);
#   3. measured runs: LLaMA-7B, batch 8, seq 512, fp16, AdamW / SGD / LOMO, checkpointing off
#      and on. Each is predicted first (`trainmem estimate`, the native profile's peak); a run
#      predicted not to fit in this device's memory is reported as not fitting and skipped;
#   4. the training step's throughput (tokens/s) and its model FLOP utilisation against the
#      bf16 GEMM rate of step 2;
#   5. the PyTorch peer (tools/hf_peer.py: transformers' LlamaForCausalLM, random weights,
#      eager and sdpa attention, checkpointing off and on) where python3 has torch and
#      transformers;
#   6. a small sweep over (batch, seq) on a 4-layer LLaMA-7B (same per-layer shapes) for the
#      coefficient fit (`trainmem sweep --fit`, or profile runs and a least-squares fit here
#      when sweep is not available);
#   7. a one-screen summary, and summary.json holding trainmem's and PyTorch's figures side by
#      side.
# Every step has its own time limit; a step that fails, times out or is not available (a
# subcommand not built yet) is recorded as such and the script goes on. All output goes under
# one folder: $OUT if set, else out/gpu_check-<date>.
#
# Environment: OUT, BUILD (build folder, default build/gpu-sm90), JOBS (default 16),
# CUDACXX (nvcc), PYTHON (default python3), BUDGET_S (overall soft budget, default 450: steps
# that would start later are skipped and say so), RUN_COMPARE=1 (also run `trainmem compare`),
# BACKEND (default cuda; BACKEND=meta dry-runs the whole script without a GPU: the measured
# runs and the sweep then trace on the meta backend, the throughput step is skipped),
# RESULTS (a folder that receives three files at the end: summary.txt, summary.json and
# gpu_check.tar.gz holding the whole output folder; for a transport that returns few files).
# Libraries missing on the machine come from .devdeps (tools/devdeps.sh). On this project's
# lent GPU machines (docs/gpu.md):  tools/devdeps.sh fetch   here, then there
#   GPU_OUT=$OUT; OUT=/tmp/gpu_check RESULTS=$GPU_OUT bash tools/gpu_check.sh   (carry .devdeps)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/out/gpu_check-$(date +%Y%m%d-%H%M%S)}
BUILD=${BUILD:-$ROOT/build/gpu-sm90}
JOBS=${JOBS:-16}
PYTHON=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-450}
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
BACKEND=${BACKEND:-cuda}
mkdir -p "$OUT/logs" "$OUT/runs"
STEPS="$OUT/steps.jsonl"
: >"$STEPS"
T0=$SECONDS

say() { echo "== [$((SECONDS - T0))s] $*" | tee -a "$OUT/gpu_check.log"; }

# record NAME STATUS RC SECONDS DETAIL
record() {
  "$PYTHON" - "$@" >>"$STEPS" <<'EOF'
import json, sys
name, status, rc, secs, detail = sys.argv[1:6]
print(json.dumps({"step": name, "status": status, "rc": int(rc), "seconds": float(secs),
                  "detail": detail}))
EOF
}

# run_step NAME TIMEOUT_S CMD... : runs with a time limit, logs to logs/NAME.log, records the
# outcome (ok | failed | timeout | oom (exit 3) | unavailable (a subcommand not built yet)).
run_step() {
  local name=$1 limit=$2
  shift 2
  if ((SECONDS - T0 > BUDGET_S)); then
    say "$name: skipped (past the ${BUDGET_S}s budget)"
    record "$name" skipped 0 0 "past the ${BUDGET_S}s budget"
    return 99
  fi
  say "$name: $*"
  local t=$SECONDS rc status detail=""
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    3) status=oom ;;
    124 | 137) status=timeout detail="exceeded ${limit}s" ;;
    *) status=failed ;;
  esac
  if ((rc == 2)) && grep -qiE "not built yet|not available|unknown subcommand|not expected" \
    "$OUT/logs/$name.log"; then
    status=unavailable
  fi
  [[ -z $detail ]] && detail=$(tail -n 3 "$OUT/logs/$name.log" | tr '\n' ' ' | cut -c1-300)
  say "$name: $status (rc $rc, $((SECONDS - t))s)"
  record "$name" "$status" "$rc" "$((SECONDS - t))" "$detail"
  return $rc
}

# ---------------------------------------------------------------- 0. the machine
say "output: $OUT"
{
  echo "date: $(date -Is)"
  echo "host: $(hostname)"
  echo "git: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null) $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed files"
  echo "nvcc: $("$NVCC" --version 2>/dev/null | tail -n 1)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
} >"$OUT/machine.txt"
DEVICE_TOTAL_BYTES=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null |
  head -n 1 | awk '{printf "%d", $1 * 1048576}')
DEVICE_TOTAL_BYTES=${DEVICE_TOTAL_BYTES:-0}
say "device memory: $DEVICE_TOTAL_BYTES bytes"

# ---------------------------------------------------------------- 1. build and GPU tests
# Libraries: the system's, else the Debian packages carried in .devdeps (tools/devdeps.sh: the
# GPU machines have CUDA, CMake and a compiler, but no network and maybe none of these).
DEVDEPS_CMAKE_ARGS=()
# shellcheck source=tools/devdeps.sh
if source "$ROOT/tools/devdeps.sh" use >"$OUT/logs/devdeps.log" 2>&1; then
  record devdeps ok 0 0 "$(tail -n 1 "$OUT/logs/devdeps.log")"
else
  record devdeps failed 1 0 "$(tail -n 1 "$OUT/logs/devdeps.log")"
fi
say "$(tail -n 1 "$OUT/logs/devdeps.log")"
run_step configure 120 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTRAINMEM_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=90 \
  "${DEVDEPS_CMAKE_ARGS[@]}"
# Only what this script runs (the CPU test suite is CI's job): about 40% less to compile.
run_step build 420 cmake --build "$BUILD" -j "$JOBS" --target trainmem trainmem_gpu_tests \
  bench_gemm_cuda bench_step_cuda
BUILD_OK=$?
TM="$BUILD/trainmem"
if ((BUILD_OK != 0)); then
  # Stale binaries from an earlier build must not be measured as if they were this tree.
  say "build failed: see $OUT/logs/build.log; only the PyTorch peer and the summary follow"
  BUILD=/nonexistent
  TM=/nonexistent
fi

if [[ -x $BUILD/trainmem_gpu_tests ]]; then
  run_step gpu_tests 240 "$BUILD/trainmem_gpu_tests" --gtest_output="json:$OUT/gpu_tests.json"
fi

# ---------------------------------------------------------------- 2. GEMM rate
if [[ -x $BUILD/bench_gemm_cuda ]]; then
  run_step gemm_bf16 90 "$BUILD/bench_gemm_cuda" --dtype bf16 --json "$OUT/gemm_bf16.json"
  run_step gemm_fp16 90 "$BUILD/bench_gemm_cuda" --dtype fp16 --json "$OUT/gemm_fp16.json"
fi

# ---------------------------------------------------------------- 3. measured runs
COMMON=(--model llama-7b --batch 8 --seq 512 --dtype fp16 --attention eager)
# Headroom for what no tensor owns (CUDA context, cuBLAS, pool rounding): 3 GiB.
HEADROOM=$((3 * 1024 * 1024 * 1024))
if [[ -x $TM ]]; then
  for opt in adamw sgd lomo; do
    for ck in none full; do
      name="llama7b_${opt}_${ck}"
      run_step "estimate_$name" 60 "$TM" estimate "${COMMON[@]}" --optimizer "$opt" \
        --checkpointing "$ck" --profile native --format json --output "$OUT/runs/$name.estimate.json"
      predicted=$("$PYTHON" -c 'import json,sys
try: print(int(json.load(open(sys.argv[1]))["analytic"]["native"]["peak"]))
except Exception: print(-1)' "$OUT/runs/$name.estimate.json" 2>/dev/null)
      predicted=${predicted:--1}
      if ((predicted > 0 && DEVICE_TOTAL_BYTES > 0 && predicted + HEADROOM > DEVICE_TOTAL_BYTES)); then
        say "$name: predicted peak $predicted B + headroom > device $DEVICE_TOTAL_BYTES B: does not fit, skipped"
        record "profile_$name" not_fitting 0 0 "predicted peak $predicted bytes + $HEADROOM headroom > device $DEVICE_TOTAL_BYTES bytes"
        continue
      fi
      ((predicted <= 0)) && say "$name: no prediction (estimate unavailable): running it anyway"
      run_step "profile_$name" 180 "$TM" profile "${COMMON[@]}" --optimizer "$opt" \
        --checkpointing "$ck" --backend "$BACKEND" --steps 2 --format json \
        --output "$OUT/runs/$name.profile.json"
    done
  done
  # `compare` repeats the runs above as one document: off by default (time), RUN_COMPARE=1.
  if [[ ${RUN_COMPARE:-0} == 1 ]]; then
    run_step compare 400 "$TM" compare "${COMMON[@]}" --optimizer sgd --checkpointing both \
      --backend "$BACKEND" --steps 2 --format json --output "$OUT/runs/llama7b_compare.json"
  else
    record compare skipped 0 0 "set RUN_COMPARE=1 (the profile runs above cover the same runs)"
  fi
fi

# ---------------------------------------------------------------- 3b. multi-rank (measured ranks)
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
  if ((GPUS < 2)); then
    say "multi_gpu: skipped: this machine has $GPUS GPU(s); NCCL needs one GPU per rank, 2 or more"
    record multi_gpu skipped 0 0 "$GPUS GPU(s): the NCCL step needs one GPU per rank, 2 or more"
  else
    for zero in 1 3; do
      run_step "multi_gpu_zero$zero" 240 "${MPIRUN[@]}" "$TM" profile --backend cuda \
        --model tiny --batch 2 --seq 64 --world-size "$GPUS" --zero "$zero" --steps 2 \
        --format json --output "$OUT/runs/multi_gpu_zero$zero.json"
    done
    # Tensor parallelism with sp over NCCL (tiny's 4 heads: 2 or 4 GPUs per group).
    if ((GPUS % 2 == 0)); then
      run_step multi_gpu_tp2_sp 240 "${MPIRUN[@]}" "$TM" profile --backend cuda --model tiny \
        --batch 2 --seq 64 --world-size "$GPUS" --tp 2 --sp --steps 2 --format json \
        --output "$OUT/runs/multi_gpu_tp2_sp.json"
      # Pipeline stages (1F1B, messages through host memory over MPI), three micro-batches.
      run_step multi_gpu_pp2 240 "${MPIRUN[@]}" "$TM" profile --backend cuda --model tiny \
        --batch 2 --seq 64 --world-size "$GPUS" --pp 2 --microbatches 3 --steps 2 --format json \
        --output "$OUT/runs/multi_gpu_pp2.json"
    fi
  fi
  if ((GPUS >= 1)); then
    # Two ranks sharing the GPU(s), the collectives through host memory.
    if run_step build_mpi_test 300 cmake --build "$BUILD" -j "$JOBS" --target mpi_test_sharded; then
      run_step shared_gpu_sharded 300 "${SHARED[@]}" "$BUILD/mpi_test_sharded" --backend cuda \
        --collectives mpi
    fi
    for lay in "zero3:--zero 3" "tp2_sp:--tp 2 --sp" "pp2:--pp 2 --microbatches 3"; do
      # shellcheck disable=SC2086
      run_step "shared_gpu_${lay%%:*}" 180 "${SHARED[@]}" "$TM" profile --backend cuda \
        --collectives mpi --model tiny --batch 2 --seq 64 --world-size 2 ${lay#*:} --steps 2 \
        --format json --output "$OUT/runs/shared_gpu_${lay%%:*}.json"
    done
  fi
fi

# ---------------------------------------------------------------- 4. throughput
if [[ -x $BUILD/bench_step_cuda && $BACKEND == cuda ]]; then
  run_step throughput 180 "$BUILD/bench_step_cuda" --model llama-7b --batch 8 --seq 512 \
    --dtype fp16 --optimizer sgd --checkpointing none --steps 3 \
    --gemm-json "$OUT/gemm_bf16.json" --json "$OUT/throughput.json"
fi

# ---------------------------------------------------------------- 5. the PyTorch peer
# The analytic hf-eager profile of the same step, to set beside the peer's measurements.
if [[ -x $TM ]]; then
  run_step estimate_hf_eager 60 "$TM" estimate "${COMMON[@]}" --optimizer sgd \
    --checkpointing none --profile hf-eager --format json --output "$OUT/runs/hf_eager.estimate.json"
fi
if "$PYTHON" -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
  run_step hf_peer 300 "$PYTHON" "$ROOT/tools/hf_peer.py" --model llama-7b --batch 8 --seq 512 \
    --dtype fp16 --optimizer sgd --attention eager,sdpa --checkpointing none,full --steps 2 \
    --output "$OUT/hf_peer.json"
else
  say "hf_peer: $PYTHON lacks torch with CUDA or transformers: peer not run"
  record hf_peer unavailable 0 0 "$PYTHON lacks torch with CUDA or transformers"
fi

# ---------------------------------------------------------------- 6. sweep for the fit
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
  if ! run_step sweep 240 "$TM" sweep "${SWEEP[@]}" --batch 1,2,4 --seq 128,256,512 --fit \
    --backend "$BACKEND" --steps 2 --format json --output "$OUT/runs/sweep.json"; then
    if grep -q '"step": "sweep", "status": "unavailable"' "$STEPS" &&
      grep -qE '"step": "profile_[a-z0-9_]+", "status": "(ok|oom)"' "$STEPS"; then
      say "sweep unavailable: profile runs over the grid instead, fitted in the summary"
      for b in 1 2 4; do
        for s in 128 256 512; do
          run_step "sweep_b${b}_s${s}" 60 "$TM" profile "${SWEEP[@]}" --batch "$b" --seq "$s" \
            --backend "$BACKEND" --steps 2 --profile native --format json \
            --output "$OUT/runs/sweep_b${b}_s${s}.json"
        done
      done
    fi
  fi
fi

# ---------------------------------------------------------------- 7. summary
say "summary"
"$PYTHON" - "$OUT" "$DEVICE_TOTAL_BYTES" <<'EOF' | tee "$OUT/summary.txt"
import glob, json, os, sys

out, device_total = sys.argv[1], int(sys.argv[2] or 0)
GiB = 2**30


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception:
        return None


def gib(x):
    return f"{x / GiB:7.2f}" if isinstance(x, (int, float)) and x >= 0 else "      -"


steps = [json.loads(l) for l in open(os.path.join(out, "steps.jsonl")) if l.strip()]
status = {s["step"]: s for s in steps}
summary = {"schema": "trainmem-gpu-check/1", "device_total_bytes": device_total,
           "steps": steps}

print("=" * 78)
print(f"trainmem gpu_check — {out}")
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
    print(f"GPU tests: {status.get('gpu_tests', {}).get('status', 'not run')}")

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

with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
print("=" * 78)
print(f"all JSON under {out}; summary.json holds trainmem's and PyTorch's figures together")
EOF
say "done in $((SECONDS - T0))s"
if [[ -n ${RESULTS:-} ]]; then
  mkdir -p "$RESULTS"
  cp "$OUT/summary.txt" "$OUT/summary.json" "$RESULTS/" 2>/dev/null
  tar -czf "$RESULTS/gpu_check.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")" &&
    echo "results: $RESULTS/{summary.txt,summary.json,gpu_check.tar.gz}"
fi
