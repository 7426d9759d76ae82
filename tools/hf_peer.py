#!/usr/bin/env python3
"""The PyTorch peer of trainmem's measured runs: one HuggingFace LlamaForCausalLM training step.

Builds LLaMA-7B (or the sizes given) with random weights directly on the GPU in the training
dtype (under `with torch.device(...)`, through `_from_config`: no fp32 copy on the host), then
for each attention implementation (eager, sdpa) and checkpointing mode (off, on) runs one
warm-up step and timed steps of: zero the gradients (set to None), forward with labels = the
inputs (HF's shifted causal-LM loss over b*(s-1) positions, as trainmem's), backward, optimizer
step. Records, per configuration:
  - max_memory_allocated over a whole step (torch.cuda.reset_peak_memory_stats before it);
  - the memory growth during forward (memory_allocated after the forward minus before it:
    what autograd keeps, plus the logits and loss) and the forward's own peak;
  - the median step time and tokens/s;
  - what actually ran, observed during the warm-up step (not taken from the request):
    attention_effective ("sdpa" when every decoder layer's forward called
    torch.nn.functional.scaled_dot_product_attention, "eager" when none did) with the SDPA
    calls' mask/is_causal arguments (a mask tensor rules out the flash kernel), and
    checkpointing_effective ("full" when every decoder layer ran again during backward,
    "none" when none did) from forward pre-hooks on each decoder layer's input_layernorm. The warm-up step's
    time (warmup_ms) includes these probes; the timed steps run without them;
  - status "ok", or "oom" (torch.cuda.OutOfMemoryError; the run goes on with the next
    configuration), or "error" with the message.
Writes one JSON document (schema "trainmem-peer/1") to --output (stdout when absent).

Needs torch with CUDA and transformers (present on the GPU machines; elsewhere it exits 3 with a
message when either is missing or no GPU). `--device cpu` smoke-tests the script with tiny
sizes (memory figures are then 0; attention_effective / checkpointing_effective are still
observed):

  python3 tools/hf_peer.py --batch 8 --seq 512 --dtype fp16 --output peer.json
  python3 tools/hf_peer.py --device cpu --layers 2 --hidden 64 --intermediate 176 --heads 4 \
      --vocab 128 --batch 2 --seq 16 --steps 1 --attention eager,sdpa --checkpointing none,full

Versions checked (CPU smoke runs only, with the command above for sgd/adamw/none, 2026-12-02;
never yet run on a GPU): Python 3.12.1 with torch 2.11.0 (the PyPI wheel, +cu130, run on the
CPU) and transformers 5.17.0, 4.57.6, 4.56.2, 4.55.4, 4.46.3 and 4.30.2.
Differences between transformers versions that this script handles:
  - the dtype keyword of _from_config: `dtype` from 4.56 (`torch_dtype` warns from then on),
    `torch_dtype` before;
  - `attn_implementation` from 4.36; before it LLaMA attention is always eager;
  - `gradient_checkpointing_kwargs` from 4.35 (non-reentrant checkpointing asked for);
    before, HF calls torch.utils.checkpoint without use_reentrant (reentrant);
  - LlamaConfig(rope_theta=...) becomes rope_parameters in 5.x (same RoPE).
"""
import argparse
import gc
import json
import re
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
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw", "adamw-foreach", "none"],
                    help="torch.optim.SGD (no momentum, no state) / AdamW (states in the "
                         "training dtype; in pure fp16 its eps 1e-8 rounds to 0 and the loss "
                         "turns NaN after the first update: memory and time are unaffected; "
                         "the for-loop implementation, or foreach=True, PyTorch's default on a "
                         "GPU) / no update")
    ap.add_argument("--loop", default="zero-first", choices=["zero-first", "literal"],
                    help="zero-first: zero_grad, forward, backward, step (the output dropped "
                         "after each step); literal: out = model(...); out.loss.backward(); "
                         "opt.step(); opt.zero_grad(set_to_none=True), `out` alive until the next "
                         "step's forward returns: the loop trainmem's HF step sequence models "
                         "(docs/hf-step.md)")
    ap.add_argument("--write-config", default=None, metavar="PATH",
                    help="write the model's config.json there (trainmem estimate --model PATH)")
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
    args = ap.parse_args()
    for c in args.checkpointing.split(","):
        if c and c not in ("none", "full"):
            ap.error(f"--checkpointing: {c!r} is not one of none, full")
    if args.steps < 1:
        ap.error("--steps: at least 1 timed step")
    return args


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


def version_tuple(text):
    """'5.17.0' -> (5, 17, 0); '4.57.0.dev0' -> (4, 57, 0)."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x or 0) for x in m.groups()) if m else (0, 0, 0)


def decoder_layers(model):
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise RuntimeError("model.model.layers not found: not a LlamaForCausalLM layout")
    return list(layers)


def build_model(torch, tf_version, LlamaConfig, LlamaForCausalLM, cfg_kwargs, attn, dtype, dev,
                seed):
    """The model in `dtype` with its parameters created on `dev` (random init runs there).

    Returns (model, notes). Reseeds first so that every attention variant gets the same weights.
    """
    notes = []
    config = LlamaConfig(**cfg_kwargs)
    config.use_cache = False  # training: no KV cache (the default is True in every version)
    kwargs = {}
    # transformers 4.56 renamed torch_dtype to dtype (the old name still works but warns).
    kwargs["dtype" if tf_version >= (4, 56) else "torch_dtype"] = dtype
    if tf_version >= (4, 36):
        kwargs["attn_implementation"] = attn
    else:
        notes.append(f"transformers {'.'.join(map(str, tf_version))} has no "
                     "attn_implementation: LLaMA attention is its eager code")
    torch.manual_seed(seed)
    if hasattr(torch.device, "__enter__"):  # torch >= 2.0: factory calls default to dev
        with dev:
            model = LlamaForCausalLM._from_config(config, **kwargs)
    else:
        model = LlamaForCausalLM._from_config(config, **kwargs)
        notes.append("torch < 2.0: built on the host, then moved")
    placed = {(p.device.type, p.dtype) for p in model.parameters()}
    if placed != {(dev.type, dtype)}:
        # Not expected with torch >= 2.0: say so rather than hide a host build in the timings.
        notes.append(f"parameters came out as {sorted(map(str, placed))}: moved with .to()")
        model.to(device=dev, dtype=dtype)
    model.train()
    return model, notes


class WarmupProbe:
    """Observes one training step: which attention code ran and whether layers recompute.

    - forward pre-hooks on each decoder layer's input norm (its first submodule) count its
      calls during forward and during backward (checkpointing re-runs each checkpointed layer
      in backward; pre-hooks, because torch's non-reentrant checkpoint may stop a
      recomputation before the layer returns; not on the layer itself, whose hooks
      transformers 5's recompute bypasses);
    - a TorchFunctionMode active during forward only sees every call of
      torch.nn.functional.scaled_dot_product_attention, however transformers imported it.
    """

    def __init__(self, torch, model):
        self.torch = torch
        self.layers = decoder_layers(model)
        self.phase = "forward"
        self.calls = {"forward": 0, "backward": 0}
        self.sdpa = []
        # On each layer's first submodule, its input norm: transformers 5's
        # GradientCheckpointingLayer recomputes through the layer's forward without its hooks
        # (measured with 5.25: a pre-hook on the layer never fires in backward), while every
        # submodule call goes through its own hooks in every version.
        self.handles = [getattr(layer, "input_layernorm", layer).register_forward_pre_hook(
            self._pre_hook) for layer in self.layers]
        mode_base = getattr(getattr(torch, "overrides", None), "TorchFunctionMode", None)
        self.mode = None
        if mode_base is not None:
            sdpa_fn = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
            probe = self

            class SdpaSeen(mode_base):
                def __torch_function__(self, func, types, args=(), kwargs=None):
                    kwargs = kwargs or {}
                    if sdpa_fn is not None and func is sdpa_fn:
                        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
                        causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
                        probe.sdpa.append((None if mask is None else list(mask.shape),
                                           bool(causal)))
                    return func(*args, **kwargs)

            self.mode = SdpaSeen()

    def _pre_hook(self, module, args):
        self.calls[self.phase] += 1

    def forward_mode(self):
        return self.mode if self.mode is not None else _NullContext()

    def close(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def report(self, entry, config_attn):
        n = len(self.layers)
        f, bw = self.calls["forward"], self.calls["backward"]
        entry["layer_calls"] = {"layers": n, "forward": f, "backward": bw}
        if f != n:
            ck = f"unknown ({f} layer calls in forward for {n} layers)"
        elif bw == 0:
            ck = "none"
        elif bw == n:
            ck = "full"
        else:
            ck = f"partial ({bw} of {n} layers recomputed)"
        entry["checkpointing_effective"] = ck
        entry["attention_config"] = config_attn
        if self.mode is None:
            entry["attention_effective"] = config_attn or "eager"
            entry["attention_probe"] = "not observed (torch has no TorchFunctionMode)"
            return
        k = len(self.sdpa)
        entry["sdpa_calls_per_forward"] = k
        if k:
            masks = sorted({"none" if m is None else "x".join(map(str, m)) for m, _ in self.sdpa})
            entry["sdpa_attn_mask"] = masks
            entry["sdpa_is_causal"] = sorted({c for _, c in self.sdpa})
        entry["attention_effective"] = ("sdpa" if k == n else "eager" if k == 0
                                        else f"mixed ({k} sdpa calls for {n} layers)")


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


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

    tf_version = version_tuple(transformers.__version__)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    dev = torch.device(args.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
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
    checkpointing = [c for c in args.checkpointing.split(",") if c]

    doc = {
        "schema": "trainmem-peer/1",
        "peer": "transformers.LlamaForCausalLM",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "device": torch.cuda.get_device_name(dev) if mem.cuda else "cpu (smoke test)",
        "device_total_bytes": torch.cuda.get_device_properties(dev).total_memory if mem.cuda
        else 0,
        "model": {"name": args.model, **cfg_kwargs},
        "run": {"batch": b, "seq": s, "dtype": args.dtype, "optimizer": args.optimizer,
                "steps": args.steps, "loop": args.loop},
        "configs": [],
    }

    for attn in [a for a in args.attention.split(",") if a]:
        model = opt = None
        try:
            t0 = time.perf_counter()
            model, build_notes = build_model(torch, tf_version, LlamaConfig, LlamaForCausalLM,
                                             cfg_kwargs, attn, dtype, dev, args.seed)
            mem.sync()
            build_s = time.perf_counter() - t0
            params = sum(p.numel() for p in model.parameters())
            config_attn = getattr(model.config, "_attn_implementation", None)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            oom = isinstance(e, oom_error) and "out of memory" in str(e).lower()
            for ck in checkpointing:
                doc["configs"].append({"attention": attn, "checkpointing": ck,
                                       "status": "oom" if oom else "error",
                                       "max_memory_allocated": mem.peak(),
                                       "error": f"building the model: {type(e).__name__}: "
                                                f"{str(e).splitlines()[0] if str(e) else ''}"})
            print(f"hf_peer: {attn}: building the model failed: {type(e).__name__}: {e}",
                  file=sys.stderr)
            model = None
            gc.collect()
            mem.release()
            continue

        if args.write_config:
            model.config.to_json_file(args.write_config)
        if args.optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.0, foreach=False)
        elif args.optimizer == "adamw":
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        elif args.optimizer == "adamw-foreach":
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        literal = args.loop == "literal"

        for ck in checkpointing:
            entry = {"attention": attn, "checkpointing": ck, "params": params,
                     "build_seconds": build_s}
            notes = list(build_notes)
            times, loss_v, out, probe = [], None, None, None
            try:
                if ck == "full":
                    if tf_version >= (4, 35):
                        model.gradient_checkpointing_enable(
                            gradient_checkpointing_kwargs={"use_reentrant": False})
                    else:
                        model.gradient_checkpointing_enable()
                        notes.append("reentrant torch.utils.checkpoint (transformers < 4.35)")
                else:
                    model.gradient_checkpointing_disable()
                for step in range(args.steps + 1):
                    if step == 0:
                        probe = WarmupProbe(torch, model)
                    if literal:
                        pass  # the previous step zeroed them at its end
                    elif opt is not None:
                        opt.zero_grad(set_to_none=True)
                    else:
                        model.zero_grad(set_to_none=True)
                    mem.sync()
                    mem.reset_peak()
                    start_alloc = mem.allocated()
                    t0 = time.perf_counter()
                    if probe is not None:
                        with probe.forward_mode():
                            out = model(input_ids=ids, labels=ids)
                        probe.phase = "backward"
                    else:
                        out = model(input_ids=ids, labels=ids)
                    mem.sync()
                    fwd_alloc = mem.allocated()
                    fwd_peak = mem.peak()
                    out.loss.backward()
                    if opt is not None:
                        opt.step()
                    if literal:
                        if opt is not None:
                            opt.zero_grad(set_to_none=True)
                        else:
                            model.zero_grad(set_to_none=True)
                    mem.sync()
                    dt_ms = (time.perf_counter() - t0) * 1e3
                    loss_v = float(out.loss.detach())
                    if not literal:
                        out = None
                    if step == 0:
                        probe.close()
                        probe.report(entry, config_attn)
                        probe = None
                        entry["warmup_ms"] = dt_ms
                        entry["warmup_loss"] = loss_v
                        continue
                    times.append(dt_ms)
                    # memory figures of the last timed step
                    entry.update({
                        "memory_before_forward": start_alloc,
                        "forward_growth": fwd_alloc - start_alloc,
                        "forward_peak": fwd_peak,
                        "max_memory_allocated": mem.peak(),
                        "memory_reserved": mem.reserved(),
                    })
                entry["status"] = "ok"
                entry["step_ms"] = times
                entry["median_step_ms"] = statistics.median(times)
                entry["tokens_per_s"] = (b * s) / (entry["median_step_ms"] / 1e3)
                entry["loss"] = loss_v
            except oom_error as e:
                entry["status"] = "oom" if "out of memory" in str(e).lower() else "error"
                entry["max_memory_allocated"] = mem.peak()
                entry["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
            except Exception as e:  # noqa: BLE001
                entry["status"] = "error"
                entry["error"] = f"{type(e).__name__}: {e}"
            finally:
                out = None
                if probe is not None:
                    probe.close()
                    probe = None
                if opt is not None:
                    opt.zero_grad(set_to_none=True)
                else:
                    model.zero_grad(set_to_none=True)
                gc.collect()
                mem.release()
            if notes:
                entry["note"] = "; ".join(notes)
            doc["configs"].append(entry)
            mismatch = [f"{k}: asked {want}, ran {entry[k + '_effective']}"
                        for k, want in (("attention", attn), ("checkpointing", ck))
                        if k + "_effective" in entry and entry[k + "_effective"] != want]
            print(f"hf_peer: {attn} checkpointing={ck}: {entry['status']}"
                  + (f", peak {entry.get('max_memory_allocated', 0) / 2**30:.2f} GiB, "
                     f"forward +{entry.get('forward_growth', 0) / 2**30:.2f} GiB, "
                     f"{entry.get('median_step_ms') or 0:.0f} ms/step"
                     if entry["status"] == "ok" else f" ({entry.get('error', '')})")
                  + (f" [MISMATCH {'; '.join(mismatch)}]" if mismatch else ""),
                  file=sys.stderr)
        opt = None
        model = None
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
