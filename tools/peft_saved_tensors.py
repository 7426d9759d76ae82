#!/usr/bin/env python3
"""Records what a real LoRA / QLoRA training step of a tiny LLaMA keeps (transformers + peft +
bitsandbytes, on the CPU).

This is the measurement behind docs/lora-plan.md section 8: it confirms or refutes the
[derived] claims of sections 1.7, 2.3-2.5, 2.7 and 4.2. For one small, deliberately awkward
LLaMA configuration (TINY below: h 64, i 304, which is not a multiple of 64 and makes the
gate/up/down matrices span two nested-absmax blocks, 2 layers, a 4, k 2, V 256, b 2, s 16) it
saves a random bf16 model with save_pretrained, loads it back per case, runs ONE training step
(forward with labels, loss, backward, torch.optim.AdamW step on the trainable parameters) and
records, per case:

  params          every parameter and buffer: name, class, shape, dtype, requires_grad,
                  untyped_storage().nbytes(); for a Params4bit also its quant_state tensors
                  (absmax, nested absmax, offset, code, nested code) with their bytes and the
                  bytes docs/formulas.md's 4-bit formula gives;
  trainable       the trainable element count (and peft's get_nb_trainable_parameters());
  gradients       which tensors have .grad after backward, dtype and bytes;
  optimizer       the optimizer's state tensors after one step, per parameter, bytes (each
                  storage once), bitsandbytes' is_paged mark (torch AdamW, or the case's
                  bitsandbytes optimizer);
  saved           the tensors autograd saves for backward (torch.autograd.graph.saved_tensors_hooks,
                  each storage once, parameters excluded), attributed to the innermost module
                  running when it was packed (forward hooks on every module) and named by the
                  autograd nodes that hold it (a walk of loss.grad_fn's graph); grouped per
                  decoder layer and per module. With reentrant checkpointing the layer replay
                  in backward is recorded under "recompute"; what the reentrant
                  CheckpointFunction keeps in ctx without save_for_backward (non-tensor
                  arguments such as the (cos, sin) tuple) is invisible to the hooks.
                  bitsandbytes' MatMul4Bit also keeps its tensors in ctx (ctx.tensors), so
                  those are read from the graph's nodes instead (custom_function_ctx_tensors);
  dtypes          the dtype of the embedding output, of every decoder layer's input (the
                  residual stream), of the input every lora_A reads and whether that input is
                  the wrapper's own input storage (no copy) or a new tensor.

Cases (tests/data/hf_peft/<case>.json):
  lora-bf16             bf16 model, no autocast, LoraConfig(r=8, target_modules="all-linear",
                        lora_dropout=0), get_peft_model's default autocast_adapter_dtype=True
  lora-bf16-dropout     the same with lora_dropout=0.1 (the CPU dropout's saved tensors)
  qlora-nf4-dq          BitsAndBytesConfig(load_in_4bit, nf4, double quant, compute bf16),
                        loaded from the saved bf16 model with device_map="cpu";
                        prepare_model_for_kbit_training(use_gradient_checkpointing=False);
                        LoRA as lora-bf16
  qlora-nf4-dq-ckpt     the same with prepare_model_for_kbit_training's default
                        use_gradient_checkpointing=True (it passes {} to transformers, which
                        hands torch.utils.checkpoint no use_reentrant)
  qlora-nf4-dq-noprep   the 4-bit model without prepare_model_for_kbit_training (get_peft_model
                        freezes the base); bf16 embedding, norms, lm_head and residual
  qlora-nf4-dq-dropout  qlora-nf4-dq with lora_dropout=0.1 (dropout on an fp32 residual)
  qlora-nf4-dq-r20-adamw8bit        qlora-nf4-dq at rank 20, bitsandbytes' AdamW8bit
  qlora-nf4-dq-r20-paged-adamw8bit  the same with PagedAdamW8bit (on the CPU bitsandbytes falls
                                    back to ordinary tensors and says so: the warning is kept)
  lora-bf16-r20-paged-adamw         lora-bf16 at rank 20, PagedAdamW (32-bit states)
  lora-bf16-model       lora-bf16 with get_peft_model(..., autocast_adapter_dtype=False)
                        (trainmem's --lora-dtype model); skipped by peft before 0.11, which
                        has no such argument
  qlora-nf4-dq-model    qlora-nf4-dq the same way

The same script measures older peft releases (`--peft-version`, docs/formulas.md, "peft
eras"): put that release first on PYTHONPATH and write to tests/data/hf_peft/peft-<version>
(peft 0.10.0, 0.11.1, 0.12.0 and 0.18.1 import with transformers 5.25; measured 2026-12-06 on
an AMD Zen 4, with USE_HUB_KERNELS=0 and the libraries tools/peft_golden.py's docstring lists).

Releases (checked): torch 2.15.0 (the +cu132 wheel, run on the CPU), transformers 5.25.0,
peft 0.21.2, bitsandbytes 0.50.2 (PyPI releases on PYTHONPATH, here /tmp/bnbpy, as for
tools/bnb_goldens.py). Every JSON file records the versions it was made with. Run:
  PYTHONPATH=/tmp/bnbpy python3 tools/peft_saved_tensors.py [--out tests/data/hf_peft] [--case NAME]
CPU only: it never calls a CUDA API. CUDA autocast (case C of lora-plan 2.4) cannot run here.
"""

import argparse
import json
import os
import sys
import tempfile
import warnings

import torch

DEV = torch.device("cpu")

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=304, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, tie_word_embeddings=False)
B, S = 2, 16
R = 8

CASES = ["lora-bf16", "lora-bf16-dropout", "qlora-nf4-dq", "qlora-nf4-dq-ckpt",
         "qlora-nf4-dq-noprep", "qlora-nf4-dq-dropout",
         "qlora-nf4-dq-r20-adamw8bit", "qlora-nf4-dq-r20-paged-adamw8bit",
         "lora-bf16-r20-paged-adamw", "lora-bf16-model", "qlora-nf4-dq-model"]
# The optimizer cases: rank 20 so that some adapters reach bitsandbytes' min_8bit_size (4,096
# elements: gate/up lora_B and down lora_A are 304 x 20 = 6,080, not a multiple of its 256-element
# blocks) and the others (q/k/v/o, 64 x 20 = 1,280) keep 32-bit states.
OPTIMIZERS = {"-r20-adamw8bit": "bnb.optim.AdamW8bit",
              "-r20-paged-adamw8bit": "bnb.optim.PagedAdamW8bit",
              "-r20-paged-adamw": "bnb.optim.PagedAdamW"}


def case_optimizer(case):
    """(suffix, class name) of the case's bitsandbytes optimizer, or ("", torch's AdamW)."""
    for suffix, cls in OPTIMIZERS.items():
        if case.endswith(suffix):
            return suffix, cls
    return "", "torch.optim.AdamW"


def case_base(case):
    """The case without its optimizer suffix: what the model and LoRA are built as."""
    return case[:-len(case_optimizer(case)[0])] if case_optimizer(case)[0] else case


def case_rank(case):
    return 20 if case_optimizer(case)[0] else R

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
               torch.int64: "int64", torch.int32: "int32", torch.bool: "bool",
               torch.float64: "fp64", torch.uint8: "u8"}


def dn(dt):
    return DTYPE_NAMES.get(dt, str(dt))


def storage_key(t):
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def tensor_rec(t):
    return {"shape": list(t.shape), "dtype": dn(t.dtype), "bytes": storage_key(t)[1]}


def formula_4bit(n, blocksize, double_quant):
    """docs/formulas.md / lora-plan 1.6."""
    nb = -(-n // blocksize)
    if double_quant:
        return -(-n // 2) + nb + 4 * (-(-nb // 256)) + 4 + 64 + 1024
    return -(-n // 2) + 4 * nb + 64


# ----------------------------------------------------------------------------- building

def save_base(tmp):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(**TINY)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp)
    return cfg


def build(case, tmp):
    from transformers import LlamaForCausalLM, BitsAndBytesConfig
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    notes = []
    rank = case_rank(case)
    case = case_base(case)
    dropout = 0.1 if case.endswith("-dropout") else 0.0
    if case.startswith("lora-bf16"):
        model = LlamaForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16, device_map="cpu")
    else:
        q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
        model = LlamaForCausalLM.from_pretrained(tmp, quantization_config=q, device_map="cpu",
                                                 dtype=torch.bfloat16)
        if case in ("qlora-nf4-dq", "qlora-nf4-dq-dropout", "qlora-nf4-dq-model"):
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        elif case == "qlora-nf4-dq-ckpt":
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                model = prepare_model_for_kbit_training(model)
            notes += [str(x.message) for x in w]
    cfg = LoraConfig(r=rank, target_modules="all-linear", lora_dropout=dropout,
                     task_type="CAUSAL_LM")
    if case.endswith("-model"):
        # autocast_adapter_dtype=False (trainmem's --lora-dtype model); peft before 0.11 has no
        # such argument (its adapters follow the base weight's dtype).
        import inspect
        if "autocast_adapter_dtype" not in inspect.signature(get_peft_model).parameters:
            return None, ["this peft has no autocast_adapter_dtype"]
        model = get_peft_model(model, cfg, autocast_adapter_dtype=False)
    else:
        model = get_peft_model(model, cfg)
    model.train()
    return model, notes


# ----------------------------------------------------------------------------- recording

def params_of(model):
    out, seen, total = [], set(), 0
    items = [(n, p, "parameter") for n, p in model.named_parameters()]
    items += [(n, b, "buffer") for n, b in model.named_buffers()]
    for name, t, kind in items:
        ptr, nbytes = storage_key(t)
        rec = {"name": name, "kind": kind, "class": type(t).__name__, "shape": list(t.shape),
               "dtype": dn(t.dtype), "requires_grad": bool(t.requires_grad), "bytes": nbytes}
        if ptr not in seen:
            seen.add(ptr)
            total += nbytes
        else:
            rec["shared_storage"] = True
        qs = getattr(t, "quant_state", None)
        if qs is not None:
            n = 1
            for x in qs.shape:
                n *= x
            parts = {"absmax": qs.absmax, "code": qs.code}
            if getattr(qs, "nested", False) or qs.state2 is not None:
                parts["offset"] = qs.offset
                parts["nested_absmax"] = qs.state2.absmax
                parts["nested_code"] = qs.state2.code
            q = {k: tensor_rec(v) for k, v in parts.items()}
            qbytes = 0
            for v in parts.values():
                p2, nb2 = storage_key(v)
                if p2 not in seen:
                    seen.add(p2)
                    total += nb2
                qbytes += nb2
            rec["quant_state"] = {
                "tensors": q, "blocksize": qs.blocksize, "quant_type": qs.quant_type,
                "dtype": dn(qs.dtype), "weight_shape": list(qs.shape), "n": n,
                "nested_blocksize": qs.state2.blocksize if qs.state2 is not None else None,
                "bytes_measured": nbytes + qbytes,
                "bytes_formula": formula_4bit(n, qs.blocksize, qs.state2 is not None)}
        out.append(rec)
    return out, total


def saved_by_nodes(root, params, ctx_held):
    """storage ptr -> names of the autograd nodes whose saved variables hold it
    (as tools/hf_saved_tensors.py), and how many nodes of each name the graph has."""
    out, seen, stack, names = {}, set(), [root], {}
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names[node.name()] = names.get(node.name(), 0) + 1
        tensors = []
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    v = getattr(node, attr)
                except Exception:
                    continue
                tensors += v if isinstance(v, (tuple, list)) else [v]
        try:
            tensors += list(node.saved_tensors)  # custom Functions (MatMul4Bit, checkpoint)
        except Exception:
            pass
        # MatMul4Bit keeps its tensors in ctx.tensors, not save_for_backward: invisible to the
        # hooks, so they are read from the node (a custom Function's node is its ctx).
        held = getattr(node, "tensors", None)
        if isinstance(held, (tuple, list)):
            ctx_held.setdefault(node.name(), []).append(
                [None if v is None else {"class": type(v).__name__, "dtype": dn(v.dtype),
                                         "shape": list(v.shape),
                                         "is_parameter": storage_key(v)[0] in params}
                 for v in held])
        for v in tensors:
            if isinstance(v, torch.Tensor):
                out.setdefault(storage_key(v)[0], set()).add(node.name())
        stack += [f for f, _ in node.next_functions]
    return out, dict(sorted(names.items()))


def layer_of(module_name):
    parts = module_name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        return int(parts[i + 1]), ".".join(parts[i + 2:])
    return None, module_name


def step(model, case):
    torch.manual_seed(1)
    ids = torch.randint(0, TINY["vocab_size"], (B, S), device=DEV)
    labels = ids.clone()
    params = {storage_key(p)[0] for p in model.parameters()}
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            params.add(storage_key(qs.absmax)[0])
            params.add(storage_key(qs.code)[0])
            if qs.state2 is not None:
                for t in (qs.offset, qs.state2.absmax, qs.state2.code):
                    params.add(storage_key(t)[0])
    inputs = {storage_key(ids)[0], storage_key(labels)[0]}

    state = {"stack": [], "phase": "forward"}
    saved, keep = {}, []
    dtypes = {"embedding_output": None, "layer_inputs": {}, "lora_A_inputs": {},
              "final_norm_input": None}
    handles = []
    wrapper_inputs = {}

    def first_tensor(args, kwargs, key):
        if args and isinstance(args[0], torch.Tensor):
            return args[0]
        v = kwargs.get(key)
        return v if isinstance(v, torch.Tensor) else None

    for name, mod in model.named_modules():
        short = name.replace("base_model.model.", "", 1)

        def pre(m, args, kwargs, short=short):
            state["stack"].append(short)
            x = first_tensor(args, kwargs, "hidden_states")
            if x is None or state["phase"] != "forward":
                return
            li, rel = layer_of(short)
            if li is not None and rel == "":
                dtypes["layer_inputs"][str(li)] = dn(x.dtype)
            if short == "model.norm":
                dtypes["final_norm_input"] = dn(x.dtype)
            if short.endswith(("_proj",)) and hasattr(m, "lora_A"):
                wrapper_inputs[short] = (storage_key(x)[0], dn(x.dtype))
            if ".lora_A." in short:
                wrapper = short.split(".lora_A.")[0]
                wp = wrapper_inputs.get(wrapper)
                dtypes["lora_A_inputs"][short] = {
                    "dtype": dn(x.dtype), "shape": list(x.shape),
                    "wrapper_input_dtype": wp[1] if wp else None,
                    "same_storage_as_wrapper_input": bool(wp and wp[0] == storage_key(x)[0])}

        def post(m, args, out, short=short):
            if state["stack"] and state["stack"][-1] == short:
                state["stack"].pop()
            if short == "model.embed_tokens" and state["phase"] == "forward":
                dtypes["embedding_output"] = dn(out.dtype)

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post))

    def pack(t):
        keep.append(t)
        ptr, nbytes = storage_key(t)
        if ptr in params:
            return t
        where = state["stack"][-1] if state["stack"] else "(no module)"
        if state["phase"] == "recompute":
            where = "recompute:" + where
        rec = saved.get(ptr)
        if rec is None:
            saved[ptr] = {"ptr": ptr, "bytes": nbytes, "dtype": dn(t.dtype),
                          "shape": list(t.shape), "modules": [where],
                          "input_ids_or_labels": ptr in inputs}
        elif where not in rec["modules"]:
            rec["modules"].append(where)
        return t

    with warnings.catch_warnings(record=True) as wlist:
        warnings.simplefilter("always")
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(input_ids=ids, labels=labels)
            loss = out.loss
            state["phase"] = "between"
            ctx_held = {}
            by_node, graph_nodes = saved_by_nodes(loss.grad_fn, params, ctx_held)
            state["phase"] = "recompute"
            state["stack"] = []
            loss.backward()
    for h in handles:
        h.remove()
    step_warnings = sorted({str(w.message)[:300] for w in wlist})
    held = {"logits": tensor_rec(out.logits),
            "logits_saved_by_autograd": storage_key(out.logits)[0] in saved}

    # saved tensors, grouped
    entries = []
    for rec in saved.values():
        e = {k: rec[k] for k in ("shape", "dtype", "bytes", "modules")}
        e["saved_by"] = sorted(by_node.get(rec["ptr"], []))
        if rec["input_ids_or_labels"]:
            e["input_ids_or_labels"] = True
        first = rec["modules"][0]
        recompute = first.startswith("recompute:")
        li, rel = layer_of(first.replace("recompute:", ""))
        e["group"] = ("recompute" if recompute else "forward") + \
            (f".layer.{li}" if li is not None else "." + (rel.split(".")[0] or "root"))
        e["module"] = rel
        entries.append(e)
    entries.sort(key=lambda e: (e["group"], e["module"], -e["bytes"]))
    per_group, per_module = {}, {}
    for e in entries:
        per_group[e["group"]] = per_group.get(e["group"], 0) + e["bytes"]
        key = e["group"] + ":" + e["module"]
        per_module[key] = per_module.get(key, 0) + e["bytes"]

    # gradients
    grads, gbytes = [], 0
    for name, p in model.named_parameters():
        if p.grad is not None:
            r = {"name": name, "dtype": dn(p.grad.dtype), "shape": list(p.grad.shape),
                 "bytes": storage_key(p.grad)[1],
                 "all_zero": bool((p.grad == 0).all())}
            grads.append(r)
            gbytes += r["bytes"]
    frozen_with_grad = [g["name"] for g in grads
                        if not dict(model.named_parameters())[g["name"]].requires_grad]

    # optimizer: each state storage counted once (bitsandbytes shares its two 256-entry quantile
    # maps between every 8-bit parameter); "shared" marks a storage an earlier parameter holds.
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    ocls = case_optimizer(case)[1]
    owarn = []
    if ocls == "torch.optim.AdamW":
        opt = torch.optim.AdamW([p for _, p in trainable], lr=1e-3)
    else:
        import bitsandbytes as bnb
        cls = {"bnb.optim.AdamW8bit": bnb.optim.AdamW8bit,
               "bnb.optim.PagedAdamW8bit": bnb.optim.PagedAdamW8bit,
               "bnb.optim.PagedAdamW": bnb.optim.PagedAdamW}[ocls]
        opt = cls([p for _, p in trainable], lr=1e-3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt.step()
    owarn += sorted({str(x.message) for x in w})
    ostates, obytes, oseen = [], 0, set()
    for n, p in trainable:
        st = opt.state.get(p, {})
        recs = {}
        for k, v in st.items():
            if not isinstance(v, torch.Tensor):
                continue
            r = tensor_rec(v)
            r["is_paged"] = bool(getattr(v, "is_paged", False))
            key = storage_key(v)
            r["shared"] = key[0] in oseen
            oseen.add(key[0])
            recs[k] = r
        b = sum(r["bytes"] for r in recs.values() if not r["shared"])
        obytes += b
        ostates.append({"name": n, "param_dtype": dn(p.dtype), "numel": p.numel(),
                        "state": recs, "bytes": b})

    return {"loss": float(loss.detach()), "dtypes": dtypes, "caller_held": held,
            "graph_nodes": graph_nodes,
            "custom_function_ctx_tensors": {k: sorted(v, key=str) for k, v in ctx_held.items()},
            "saved": entries, "saved_bytes_per_group": per_group,
            "saved_bytes_per_module": per_module,
            "saved_bytes_total": sum(e["bytes"] for e in entries),
            "gradients": grads, "gradient_bytes": gbytes,
            "frozen_params_with_grad": frozen_with_grad,
            "optimizer": {"class": ocls, "states": ostates, "bytes": obytes,
                          "warnings": owarn},
            "warnings": step_warnings}


def run_case(case, tmp):
    import transformers, peft, bitsandbytes
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "peft": peft.__version__, "bitsandbytes": bitsandbytes.__version__,
                "python": sys.version.split()[0]}
    model, notes = build(case, tmp)
    if model is None:
        return None
    ptab, pbytes = params_of(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    nb = model.get_nb_trainable_parameters()
    base = model.base_model.model
    gc = getattr(base, "is_activation_checkpointing", None)
    if gc is None:
        gc = getattr(base, "is_gradient_checkpointing", None)
    res = step(model, case)
    doc = {"case": case, "versions": versions, "device": "cpu",
           "config": dict(TINY, batch=B, seq=S, lora_r=case_rank(case), lora_alpha=8,
                          target_modules="all-linear",
                          lora_dropout=0.1 if case_base(case).endswith("-dropout") else 0.0),
           "gradient_checkpointing": gc, "build_warnings": notes,
           "params": ptab, "params_bytes": pbytes,
           "trainable_elements": trainable,
           "peft_get_nb_trainable_parameters": list(nb)}
    doc.update(res)
    return doc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "data", "hf_peft"))
    ap.add_argument("--case", action="append", choices=CASES)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        save_base(tmp)
        for case in a.case or CASES:
            doc = run_case(case, tmp)
            if doc is None:
                print(f"{case}: skipped (this peft has no autocast_adapter_dtype)")
                continue
            path = os.path.join(a.out, case + ".json")
            with open(path, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=False)
                f.write("\n")
            print(f"{case}: params {doc['params_bytes']} B, trainable "
                  f"{doc['trainable_elements']}, grads {doc['gradient_bytes']} B, "
                  f"adamw {doc['optimizer']['bytes']} B, saved {doc['saved_bytes_total']} B "
                  f"-> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
