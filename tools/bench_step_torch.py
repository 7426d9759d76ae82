#!/usr/bin/env python3
"""The PyTorch side of bench/bench_step: one LLaMA training step on the CPU, timed.

The same model as trainmem's (tools/make_golden.py's hand-written LLaMA with HF semantics,
eager attention), fp32, AdamW over all parameters; one step = zero the gradients, forward,
backward, optimizer. Prints one JSON line: {"torch": version, "threads": n, "ms": [...],
"median_ms": m, "loss": first loss}. Run with the Debian interpreter that has torch:
/usr/bin/python3 tools/bench_step_torch.py --vocab 2048 --hidden 256 ... [--dtype bf16]
(PyPI's torch: PYTHONPATH=/opt/torch-pypi /usr/bin/python3 ..., a `pip install --target`).

--serve: the peer mode bench_step uses to interleave repetitions with its own. After the
warm-up step it prints one JSON line {"torch": version, "threads": n, "loss": first loss} and
then, for each line "step" read from stdin, runs one step and prints its time in ms on a line
of its own; end of input (or "quit") ends it. torch is imported here only: trainmem never
depends on it.

Plain torch ops only, no version-dependent path: checked (2026-12-02, tiny sizes) with Debian's
torch 1.13 and with torch 2.11.0 (same first loss; AdamW takes its single-tensor for-loop on
the CPU in both, so the versions time the same algorithm).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import llama_loss, param_shapes  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rms-eps", type=float, default=1e-5)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    ap.add_argument("--serve", action="store_true",
                    help="peer mode: a step per 'step' line on stdin, its ms on stdout")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="fp32, or 16-bit mixed precision: torch.autocast on the CPU with fp32 "
                         "weights and AdamW states (PyTorch's own recipe)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    V, h, i, L, a, k = (args.vocab, args.hidden, args.intermediate, args.layers, args.heads,
                        args.kv_heads)
    gen = torch.Generator().manual_seed(0)
    W = {}
    for name, shape in param_shapes(V, h, i, L, a, k, args.tied):
        w = torch.ones(shape) if len(shape) == 1 else 0.02 * torch.randn(shape, generator=gen)
        W[name] = w.requires_grad_(True)
    tokens = torch.randint(0, V, (args.batch, args.seq), generator=gen, dtype=torch.int32)
    opt = torch.optim.AdamW(list(W.values()), lr=1e-5, weight_decay=0.01)

    autocast_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            loss = llama_loss(W, tokens, V, h, i, L, a, k, args.tied, args.rms_eps,
                              args.rope_theta)
        loss.backward()
        opt.step()
        return loss.item()

    first = step()  # warm-up
    if args.serve:
        print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                          "dtype": args.dtype, "loss": first}), flush=True)
        for line in sys.stdin:
            if line.strip() != "step":
                break
            t0 = time.perf_counter()
            step()
            print("%.4f" % ((time.perf_counter() - t0) * 1e3), flush=True)
        return
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "dtype": args.dtype,
                      "ms": times, "median_ms": statistics.median(times), "loss": first}))


if __name__ == "__main__":
    main()
