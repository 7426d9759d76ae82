#!/usr/bin/env python3
"""The PyTorch peer of trainmem's measured runs: one HuggingFace LlamaForCausalLM training step.

Builds LLaMA-7B (or the sizes given) with random weights directly on the GPU in the training
dtype, then for each attention implementation (eager, sdpa) and checkpointing mode (off, on)
runs warm-up and timed steps of: zero the gradients (set to None), forward with labels = the
inputs (HF's shifted causal-LM loss over b*(s-1) positions, as trainmem's), backward, optimizer
step. Records, per configuration:
  - max_memory_allocated over a whole step (torch.cuda.reset_peak_memory_stats before it);
  - the memory growth during forward (memory_allocated after the forward minus before it:
    what autograd keeps, plus the logits and loss) and the forward's own peak;
  - the median step time and tokens/s;
  - status "ok", or "oom" (torch.cuda.OutOfMemoryError; the run goes on with the next
    configuration), or "error" with the message.
Writes one JSON document (schema "trainmem-peer/1") to --output (stdout when absent).

Needs torch with CUDA and transformers (present on the GPU machines; on the dev machine the
script only documents itself: it exits 3 with a message when either is missing or no GPU).

  python3 tools/hf_peer.py --batch 8 --seq 512 --dtype fp16 --output peer.json
"""
import argparse
import gc
import json
import statistics
import sys
import time

PRESETS = {
    # LLaMA-1 7B as in its HF config.json.
    "llama-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                     max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0,
                     tie_word_embeddings=False),
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-7b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=None, help="override the layer count")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw", "none"],
                    help="torch.optim.SGD (no momentum, no state) / AdamW (states in the "
                         "training dtype) / no update")
    ap.add_argument("--attention", default="eager,sdpa",
                    help="comma list of HF attn_implementation values")
    ap.add_argument("--checkpointing", default="none,full", help="comma list of none|full")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", default=None)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu only smoke-tests this script (memory figures are then 0)")
    ap.add_argument("--hidden", type=int, default=None, help="override (smoke tests)")
    ap.add_argument("--intermediate", type=int, default=None, help="override (smoke tests)")
    ap.add_argument("--heads", type=int, default=None, help="override (smoke tests)")
    ap.add_argument("--vocab", type=int, default=None, help="override (smoke tests)")
    return ap.parse_args()


class Mem:
    """torch.cuda's allocator statistics, or zeros on the CPU (smoke tests)."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self):
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()

    def allocated(self):
        return self.torch.cuda.memory_allocated() if self.cuda else 0

    def peak(self):
        return self.torch.cuda.max_memory_allocated() if self.cuda else 0

    def reserved(self):
        return self.torch.cuda.memory_reserved() if self.cuda else 0

    def release(self):
        if self.cuda:
            self.torch.cuda.empty_cache()


def fail(msg, code=3):
    print(f"hf_peer: {msg}", file=sys.stderr)
    sys.exit(code)


def main():
    args = parse_args()
    try:
        import torch
    except ImportError as e:
        fail(f"torch is not importable ({e}); the peer needs torch with CUDA")
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        fail(f"transformers is not importable ({e}); the peer needs it")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("torch.cuda.is_available() is False: no GPU for the peer")

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    dev = torch.device(args.device)
    mem = Mem(torch, dev)
    oom_error = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
    cfg_kwargs = dict(PRESETS[args.model])
    for flag, key in (("layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                      ("intermediate", "intermediate_size"), ("vocab", "vocab_size")):
        if getattr(args, flag):
            cfg_kwargs[key] = getattr(args, flag)
    if args.heads:
        cfg_kwargs["num_attention_heads"] = cfg_kwargs["num_key_value_heads"] = args.heads
    b, s = args.batch, args.seq
    torch.manual_seed(args.seed)
    ids = torch.randint(0, cfg_kwargs["vocab_size"], (b, s), device=dev)

    doc = {
        "schema": "trainmem-peer/1",
        "peer": "transformers.LlamaForCausalLM",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(dev) if mem.cuda else "cpu (smoke test)",
        "device_total_bytes": torch.cuda.get_device_properties(dev).total_memory if mem.cuda
        else 0,
        "model": {"name": args.model, **cfg_kwargs},
        "run": {"batch": b, "seq": s, "dtype": args.dtype, "optimizer": args.optimizer,
                "steps": args.steps},
        "configs": [],
    }

    for attn in [a for a in args.attention.split(",") if a]:
        model = None
        try:
            config = LlamaConfig(**cfg_kwargs)
            config.use_cache = False
            t0 = time.perf_counter()
            # Built on the GPU where torch allows it (random init there takes a second, not
            # minutes on the CPU); _from_config builds in the training dtype directly.
            def build():
                try:
                    return LlamaForCausalLM._from_config(config, attn_implementation=attn,
                                                         torch_dtype=dtype)
                except TypeError:  # older transformers: no attn_implementation keyword
                    config._attn_implementation = attn
                    return LlamaForCausalLM._from_config(config, torch_dtype=dtype)
            if hasattr(torch.device, "__enter__"):
                with dev:
                    model = build()
            else:  # torch < 2.0
                model = build()
            model.to(device=dev, dtype=dtype)
            model.train()
            tf_version = tuple(int(x) for x in transformers.__version__.split(".")[:2]
                               if x.isdigit())
            # attn_implementation exists from transformers 4.36; before, LLaMA is always eager.
            effective = (getattr(model.config, "_attn_implementation", None) or "eager"
                         if tf_version >= (4, 36) else "eager")
            build_s = time.perf_counter() - t0
            params = sum(p.numel() for p in model.parameters())
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            for ck in [c for c in args.checkpointing.split(",") if c]:
                doc["configs"].append({"attention": attn, "checkpointing": ck, "status": "error",
                                       "error": f"building the model: {type(e).__name__}: {e}"})
            model = None
            gc.collect()
            mem.release()
            continue

        if args.optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.0, foreach=False)
        elif args.optimizer == "adamw":
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        else:
            opt = None

        for ck in [c for c in args.checkpointing.split(",") if c]:
            entry = {"attention": attn, "attention_effective": effective, "checkpointing": ck,
                     "params": params, "build_seconds": build_s}
            times, loss_v = [], None
            try:
                if ck == "full":
                    try:
                        model.gradient_checkpointing_enable(
                            gradient_checkpointing_kwargs={"use_reentrant": False})
                    except TypeError:  # transformers < 4.35: reentrant checkpointing only
                        model.gradient_checkpointing_enable()
                        entry["note"] = "reentrant torch.utils.checkpoint (old transformers)"
                else:
                    model.gradient_checkpointing_disable()
                for step in range(args.steps + 1):
                    if opt is not None:
                        opt.zero_grad(set_to_none=True)
                    else:
                        model.zero_grad(set_to_none=True)
                    mem.sync()
                    mem.reset_peak()
                    start_alloc = mem.allocated()
                    t0 = time.perf_counter()
                    out = model(input_ids=ids, labels=ids)
                    mem.sync()
                    fwd_alloc = mem.allocated()
                    fwd_peak = mem.peak()
                    out.loss.backward()
                    if opt is not None:
                        opt.step()
                    mem.sync()
                    dt_ms = (time.perf_counter() - t0) * 1e3
                    loss_v = float(out.loss.detach())
                    del out
                    if step == 0:
                        entry["warmup_ms"] = dt_ms
                        # memory figures from the first (measured) step after warm-up below
                        continue
                    times.append(dt_ms)
                    entry.update({
                        "memory_before_forward": start_alloc,
                        "forward_growth": fwd_alloc - start_alloc,
                        "forward_peak": fwd_peak,
                        "max_memory_allocated": mem.peak(),
                        "memory_reserved": mem.reserved(),
                    })
                entry["status"] = "ok"
                entry["step_ms"] = times
                entry["median_step_ms"] = statistics.median(times) if times else None
                entry["tokens_per_s"] = (b * s) / (entry["median_step_ms"] / 1e3) if times else None
                entry["loss"] = loss_v
            except oom_error as e:
                entry["status"] = "oom" if "out of memory" in str(e).lower() else "error"
                entry["max_memory_allocated"] = mem.peak()
                entry["error"] = str(e).splitlines()[0]
            except Exception as e:  # noqa: BLE001
                entry["status"] = "error"
                entry["error"] = f"{type(e).__name__}: {e}"
            finally:
                out = None
                if opt is not None:
                    opt.zero_grad(set_to_none=True)
                else:
                    model.zero_grad(set_to_none=True)
                gc.collect()
                mem.release()
            doc["configs"].append(entry)
            print(f"hf_peer: {attn} checkpointing={ck}: {entry['status']}"
                  + (f", peak {entry.get('max_memory_allocated', 0) / 2**30:.2f} GiB, "
                     f"forward +{entry.get('forward_growth', 0) / 2**30:.2f} GiB, "
                     f"{entry.get('median_step_ms') or 0:.0f} ms/step"
                     if entry["status"] == "ok" else f" ({entry.get('error', '')})"),
                  file=sys.stderr)
        del opt
        del model
        gc.collect()
        mem.release()

    text = json.dumps(doc, indent=2)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
