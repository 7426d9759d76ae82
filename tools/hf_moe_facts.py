#!/usr/bin/env python3
"""Facts about HuggingFace's Mixture-of-Experts classes, read from the real classes (issue 29).

Two records, both from the transformers release installed beside PyTorch (checked: transformers
5.25.0 with PyTorch 2.15.0, CPU wheel; no other release was run):

1. counts (default, and with --saved): for every MoE config in tests/data/configs/
   (mixtral-8x7b, qwen1.5-moe-a2.7b, qwen3-30b-a3b: the published config.json values; tiny-mixtral,
   tiny-qwen2-moe, tiny-qwen3-moe: small awkward shapes), builds the class the file names
   (MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM) on PyTorch's meta device, so
   no weight is allocated, and records sum(p.numel()) over model.parameters() plus a per-layer
   breakdown by parameter-name pattern (attention, qk_norm, norms, router, experts,
   shared_expert, shared_expert_gate, dense_mlp) and the parts outside the layers (embedding,
   final norm, lm_head). Writes tests/data/hf_moe/counts.json.

2. saved tensors (--saved): for each tiny config, one training step on the CPU in bf16 (eager
   attention, experts_implementation "eager": the per-expert Python loop; transformers 5.25's
   own default is "grouped_mm" where it can dispatch, recorded beside it as "default_experts"),
   forward with labels, output_router_logits False and (every family here supports it) True,
   then backward. Every tensor autograd saves is seen through
   torch.autograd.graph.saved_tensors_hooks; each storage is counted once (by storage pointer),
   parameters (and views of them, e.g. gate_up_proj[e]) are excluded. Each entry names the
   innermost module running when it was saved and the autograd node(s) holding it (found by
   walking the graph from the loss and unpacking every _saved_* attribute); it is attributed to
   the decoder layer that saved it first ("layer.N"), to "shared" when several layers saved the
   same storage, or to "outside" (embedding, final norm, head, loss, aux loss). Tensors the
   caller holds through the output beyond the saved ones (logits, router_logits) are listed as
   "held". The routing taken (tokens per expert per MoE layer, from the router's top-k indices)
   is recorded with it. Writes tests/data/hf_moe/<config>-saved.json and
   <config>-router-logits-saved.json, and <config>-grouped-mm-saved.json: the same step with
   experts_implementation "grouped_mm" (torch._grouped_mm on the CPU; where it fails, the file
   records the error: tiny-qwen3-moe's moe_intermediate_size 36 gives rows of 72 bytes, and
   _grouped_mm wants strides that are multiples of 16 bytes), <config>-sdpa-saved.json (SDPA
   attention) and <config>-fp32-saved.json (fp32 training), both with the eager experts. Saved
   tensors that only a node
   the loss does not reach holds (the aux loss's top-k indices) are marked "reached": false and
   left out of group_bytes (listed in unreached_bytes): they are freed before forward returns.
   Everything is seeded (torch.manual_seed(0) before the
   model is built and before the input ids are drawn, deterministic CPU kernels): two runs give
   identical files.

    PYTHONPATH=/tmp/bnbpy python3 tools/hf_moe_facts.py            # counts.json
    PYTHONPATH=/tmp/bnbpy python3 tools/hf_moe_facts.py --saved    # + the saved-tensor files

--check compares the files it would write with the stored ones (exit 1 on a difference).
"""
import argparse
import json
import pathlib
import re
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "data" / "configs"
OUT = ROOT / "tests" / "data" / "hf_moe"
PRESETS = ["mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b",
           "tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe"]
TINY = ["tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe"]
BATCH, SEQ = 2, 11  # T = 22 tokens: awkward, and enough for uneven routing

PATTERNS = [  # (category, regex on the name inside a decoder layer), first match wins
    ("qk_norm", r"self_attn\.(q_norm|k_norm)\."),
    ("attention", r"self_attn\."),
    ("norms", r"(input_layernorm|post_attention_layernorm)\."),
    ("shared_expert_gate", r"mlp\.shared_expert_gate\."),
    ("shared_expert", r"mlp\.shared_expert\."),
    ("router", r"mlp\.gate\.weight$"),
    ("experts", r"mlp\.experts\."),
    ("dense_mlp", r"mlp\.(gate_proj|up_proj|down_proj)\."),
]


def load(name, **kw):
    d = json.loads((CONFIGS / f"{name}.json").read_text())
    d.pop("transformers_version", None)
    d.pop("torch_dtype", None)
    arch = d["architectures"][0]
    return AutoConfig.for_model(d.pop("model_type"), **d, **kw), arch


def count(name):
    cfg, arch = load(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert type(model).__name__ == arch, (name, type(model).__name__)
    layers = {}
    outside = {}
    for pname, p in model.named_parameters():
        m = re.match(r"model\.layers\.(\d+)\.(.*)", pname)
        if not m:
            key = pname.rsplit(".", 1)[0]
            outside[key] = outside.get(key, 0) + p.numel()
            continue
        li, rest = int(m.group(1)), m.group(2)
        cat = next((c for c, rx in PATTERNS if re.search(rx, rest)), None)
        assert cat is not None, pname
        lay = layers.setdefault(li, {"kind": None, "total": 0, "by_category": {}, "by_name": {}})
        lay["by_category"][cat] = lay["by_category"].get(cat, 0) + p.numel()
        lay["by_name"][rest] = [list(p.shape), p.numel()]
        lay["total"] += p.numel()
    for li, lay in layers.items():
        lay["kind"] = "moe" if "experts" in lay["by_category"] else "dense"
    total = sum(p.numel() for p in model.parameters())
    assert total == sum(l["total"] for l in layers.values()) + sum(outside.values())
    # Layers of one kind have identical breakdowns: store each distinct one once.
    kinds = {}
    for li in sorted(layers):
        lay = layers[li]
        k = lay["kind"]
        if k in kinds:
            assert kinds[k] == {x: lay[x] for x in ("total", "by_category", "by_name")}, (name, li)
        else:
            kinds[k] = {x: lay[x] for x in ("total", "by_category", "by_name")}
    return {"class": arch, "total": total, "outside": outside,
            "layer_kinds": [layers[li]["kind"] for li in sorted(layers)],
            "per_layer": kinds,
            "moe_layers": sum(1 for l in layers.values() if l["kind"] == "moe"),
            "dense_layers": sum(1 for l in layers.values() if l["kind"] == "dense")}


# ----------------------------------------------------------------------------- saved tensors

def measure(name, router_logits, experts="eager", attn="eager", dtype=torch.bfloat16):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg, arch = load(name, output_router_logits=router_logits)
    default_experts = None
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn,
                                             experts_implementation=experts)
    default_experts = AutoModelForCausalLM.from_config(
        load(name)[0], attn_implementation="eager").config._experts_implementation
    model = model.to(dtype)
    model.train()
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
    labels = ids.clone()

    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    names = {m: n for n, m in model.named_modules()}
    stack = []
    hooks = []
    def push(mod, a):
        stack.append(names[mod])

    def pop(mod, a, o):
        stack.pop()

    for m in model.modules():
        hooks.append(m.register_forward_pre_hook(push))
        hooks.append(m.register_forward_hook(pop))
    routing = {}

    def router_hook(mod, a, out):
        li = int(re.match(r"model\.layers\.(\d+)\.", names[mod]).group(1))
        idx = out[2]
        routing[li] = torch.bincount(idx.reshape(-1), minlength=cfg.num_experts
                                     if hasattr(cfg, "num_experts") else cfg.num_local_experts
                                     ).tolist()
        routing[f"{li}.dtypes"] = {"router_logits": str(out[0].dtype).replace("torch.", ""),
                                   "top_k_weights": str(out[1].dtype).replace("torch.", ""),
                                   "top_k_index": str(out[2].dtype).replace("torch.", "")}
    for n, m in model.named_modules():
        if re.fullmatch(r"model\.layers\.\d+\.mlp\.gate", n):
            hooks.append(m.register_forward_hook(router_hook))

    packed = []  # handle -> record

    def pack(t):
        h = len(packed)
        packed.append({"t": t, "module": stack[-1] if stack else "(none)"})
        return h

    unpacked = []

    def unpack(h):
        unpacked.append(h)
        return packed[h]["t"]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = model(input_ids=ids, labels=labels)
        # Which node holds which handle: unpack every _saved_* attribute of the graph.
        holders = {}
        seen, todo = set(), [out.loss.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            for attr in dir(node):
                if not attr.startswith("_saved_"):
                    continue
                unpacked.clear()
                try:
                    getattr(node, attr)
                except Exception:
                    continue
                for i in unpacked:
                    holders.setdefault(i, set()).add(f"{type(node).__name__}.{attr[7:]}")
            todo.extend(fn for fn, _ in node.next_functions)
    for h in hooks:
        h.remove()

    storages = {}
    for i, r in enumerate(packed):
        t = r["t"]
        if not isinstance(t, torch.Tensor):
            continue
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr in param_ptrs:
            continue
        if t.device.type == "cpu" and t.dim() == 0 and st.nbytes() <= 8 and not t.requires_grad \
                and t.dtype == torch.float64:
            kind = "host_scalar"
        else:
            kind = "tensor"
        m = re.match(r"model\.layers\.(\d+)\.", r["module"])
        where = f"layer.{m.group(1)}" if m else "outside"
        e = storages.get(ptr)
        if e is None:
            e = storages[ptr] = {"bytes": st.nbytes(), "dtype": str(t.dtype).replace("torch.", ""),
                                 "shape": list(t.shape), "storage_elems": st.nbytes() // t.element_size(),
                                 "module": r["module"], "nodes": set(), "where": [], "kind": kind}
        e["nodes"] |= holders.get(i, {"(not reached from the loss)"})
        if where not in e["where"]:
            e["where"].append(where)
    out.loss.backward()

    groups = {}
    for ptr, e in storages.items():
        g = e["where"][0] if len(set(e["where"])) == 1 else "shared"
        rec = {k: e[k] for k in ("module", "shape", "storage_elems", "dtype", "bytes", "kind")}
        rec["nodes"] = sorted(e["nodes"])
        # Saved by a node the loss does not reach (the aux loss's top-k): freed with that node
        # before forward returns, so not held at the end of forward.
        rec["reached"] = "(not reached from the loss)" not in e["nodes"]
        if g == "shared":
            rec["saved_by"] = e["where"]
        groups.setdefault(g, []).append(rec)
    for g in groups.values():
        g.sort(key=lambda r: (r["module"], r["nodes"], r["shape"], r["dtype"]))
    held = []
    saved_ptrs = set(storages)
    for field in ("logits", "router_logits"):
        v = getattr(out, field, None)
        vals = v if isinstance(v, (tuple, list)) else ([v] if v is not None else [])
        for j, t in enumerate(vals):
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                held.append({"what": f"{field}[{j}]" if isinstance(v, (tuple, list)) else field,
                             "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                             "bytes": t.untyped_storage().nbytes(),
                             "also_saved": ptr in saved_ptrs})
    layer_kinds = ["moe" if type(l.mlp).__name__.endswith("SparseMoeBlock") else "dense"
                   for l in model.model.layers]
    doc = {
        "tool": "tools/hf_moe_facts.py --saved",
        "transformers": transformers.__version__, "torch": torch.__version__,
        "config": name, "class": arch, "batch": BATCH, "seq": SEQ, "tokens": BATCH * SEQ,
        "dtype": str(dtype).replace("torch.", ""), "attention": attn,
        "experts_implementation": experts,
        "default_experts": default_experts,
        "output_router_logits": router_logits,
        "counting": "saved_tensors_hooks, each storage once, parameters and their views excluded; "
                    "group = the decoder layer that saved it, 'shared' when several did, "
                    "'outside' otherwise; bytes = the whole storage",
        "layer_kinds": layer_kinds,
        "routing": {str(li): routing[li] for li in sorted(k for k in routing if isinstance(k, int))},
        "router_dtypes": routing.get(f"{next(i for i, k in enumerate(layer_kinds) if k == 'moe')}.dtypes"),
        "loss": round(float(out.loss.detach().float()), 4),
        "group_bytes": {g: sum(r["bytes"] for r in lst if r["kind"] == "tensor" and r["reached"])
                        for g, lst in sorted(groups.items())},
        "unreached_bytes": {g: sum(r["bytes"] for r in lst if not r["reached"])
                            for g, lst in sorted(groups.items())
                            if any(not r["reached"] for r in lst)},
        "groups": dict(sorted(groups.items())),
        "held": held,
    }
    return doc


def dump(path, doc, check):
    text = json.dumps(doc, indent=1) + "\n"
    if check:
        if not path.exists() or path.read_text() != text:
            print(f"differs: {path}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}", file=sys.stderr)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saved", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name in PRESETS:
        counts[name] = count(name)
        print(f"{name:18s} {counts[name]['class']:20s} {counts[name]['total']:>16,d}")
    doc = {"tool": "tools/hf_moe_facts.py",
           "method": "AutoModelForCausalLM.from_config(cfg) on the meta device, cfg from "
                     "tests/data/configs/<preset>.json; total = sum(p.numel()); per_layer: one "
                     "entry per layer kind (moe, dense), every layer of a kind checked equal",
           "transformers": transformers.__version__, "torch": torch.__version__,
           "counts": counts}
    rc = dump(OUT / "counts.json", doc, args.check)
    if args.saved:
        for name in TINY:
            for rl in (False, True):
                d = measure(name, rl)
                stem = f"{name}-router-logits-saved" if rl else f"{name}-saved"
                print(f"{stem:36s} {d['group_bytes']}", file=sys.stderr)
                rc |= dump(OUT / f"{stem}.json", d, args.check)
            # transformers 5.25's default experts implementation where it dispatches:
            # torch._grouped_mm over the tokens sorted by expert (output_router_logits False).
            try:
                d = measure(name, False, experts="grouped_mm")
            except RuntimeError as e:
                d = {"tool": "tools/hf_moe_facts.py --saved", "config": name,
                     "transformers": transformers.__version__, "torch": torch.__version__,
                     "experts_implementation": "grouped_mm", "dtype": "bfloat16",
                     "error": f"{type(e).__name__}: {e}"}
            print(f"{name + '-grouped-mm-saved':36s} {d.get('group_bytes', d.get('error'))}",
                  file=sys.stderr)
            rc |= dump(OUT / f"{name}-grouped-mm-saved.json", d, args.check)
            # SDPA attention (PyTorch's CPU flash kernel) and fp32 training, eager experts.
            for stem, kw in ((f"{name}-sdpa-saved", {"attn": "sdpa"}),
                             (f"{name}-fp32-saved", {"dtype": torch.float32})):
                d = measure(name, False, **kw)
                print(f"{stem:36s} {d['group_bytes']}", file=sys.stderr)
                rc |= dump(OUT / f"{stem}.json", d, args.check)
    return rc


if __name__ == "__main__":
    sys.exit(main())
