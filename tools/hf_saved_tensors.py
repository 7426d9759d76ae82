#!/usr/bin/env python3
"""Counts what PyTorch autograd saves for a HuggingFace LLaMA training step (eager attention).

This is the proof behind trainmem's `hf-eager` profile (src/analytic/analytic_hf.cpp). For several small,
deliberately awkward configurations it builds LlamaForCausalLM as transformers 4.30 writes it,
runs one forward with labels (the loss on shifted contiguous logits), and records every tensor
autograd saves for backward through torch.autograd.graph.saved_tensors_hooks. Each storage is
counted once (by storage pointer); parameters are excluded. Storages are attributed to the part
of the model that saved them first: "embedding", "layer" (one decoder layer; all layers must
agree), "shared" (saved by several layers: HF checkpointing's mask and position ids), "head"
(final norm, lm_head, loss), "recompute" (checkpointing: what one layer saves again while its
forward is replayed in backward) and "inputs" (input_ids).

Two implementations are run and must agree exactly:
  - transformers 4.30.x itself when it can be imported (install it out of the way, e.g.
    `pip install --target /tmp/hf430 --no-deps transformers==4.30.2 huggingface_hub==0.16.4
    tokenizers==0.13.3 safetensors==0.3.1 packaging tqdm filelock regex requests pyyaml fsspec
    typing_extensions urllib3 idna charset_normalizer certifi` and run with PYTHONPATH=/tmp/hf430);
  - a line-by-line replica of 4.30's modeling_llama.py below, which also handles GQA the way
    4.31 added it (repeat_kv), for configurations 4.30 cannot express.

dtype: the 16-bit configurations run in bfloat16, because PyTorch 1.13 on the CPU has no fp16
GEMM. fp16 and bf16 have the same width (2 bytes) and the same type-promotion rules (16-bit x
fp32 tensor -> fp32; softmax(dtype=float32) upcasts; .to(16-bit) casts back), so every byte count
is the one an fp16 run saves; nothing is attributed by hand. fp32 configurations show that the
upcasts become no-ops (the same storage) there.

Usage: /usr/bin/python3 tools/hf_saved_tensors.py [--output tests/data/hf_eager_golden.json]
"""

import argparse
import json
import math
import sys

import torch
import torch.utils.checkpoint
from torch import nn

# ----------------------------------------------------------------------------- the replica
# transformers 4.30.2 modeling_llama.py, op for op (training path: no past_key_values).


def make_causal_mask(bsz, tgt_len, dtype, device):
    mask = torch.full((tgt_len, tgt_len), torch.tensor(torch.finfo(dtype).min, device=device),
                      device=device)
    mask_cond = torch.arange(mask.size(-1), device=device)
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    mask = mask.to(dtype)
    return mask[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len)


def expand_mask(mask, dtype, tgt_len):
    bsz, src_len = mask.size()
    expanded_mask = mask[:, None, None, :].expand(bsz, 1, tgt_len, src_len).to(dtype)
    inverted_mask = 1.0 - expanded_mask
    return inverted_mask.masked_fill(inverted_mask.to(torch.bool), torch.finfo(dtype).min)


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


class Rotary(nn.Module):
    def __init__(self, dim, max_pos=2048, base=10000):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq)
        t = torch.arange(max_pos, dtype=inv_freq.dtype)
        freqs = torch.einsum("i,j->ij", t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos()[None, None, :, :], persistent=False)
        self.register_buffer("sin_cached", emb.sin()[None, None, :, :], persistent=False)

    def forward(self, x, seq_len):
        return (self.cos_cached[:, :, :seq_len, ...].to(dtype=x.dtype),
                self.sin_cached[:, :, :seq_len, ...].to(dtype=x.dtype))


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids):
    cos = cos.squeeze(1).squeeze(0)
    sin = sin.squeeze(1).squeeze(0)
    cos = cos[position_ids].unsqueeze(1)
    sin = sin[position_ids].unsqueeze(1)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):  # transformers 4.31 (GQA); identity when n_rep == 1
    batch, kv_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, kv_heads * n_rep, slen, head_dim)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.hidden_size = c["hidden"]
        self.num_heads = c["heads"]
        self.num_kv = c["kv_heads"]
        self.head_dim = self.hidden_size // self.num_heads
        self.q_proj = nn.Linear(self.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(self.hidden_size, self.num_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(self.hidden_size, self.num_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, self.hidden_size, bias=False)
        self.rotary_emb = Rotary(self.head_dim)

    def forward(self, hidden_states, attention_mask, position_ids):
        bsz, q_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads,
                                                       self.head_dim).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(bsz, q_len, self.num_kv,
                                                     self.head_dim).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(bsz, q_len, self.num_kv,
                                                       self.head_dim).transpose(1, 2)
        kv_seq_len = key_states.shape[-2]
        cos, sin = self.rotary_emb(value_states, seq_len=kv_seq_len)
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin,
                                                        position_ids)
        key_states = repeat_kv(key_states, self.num_heads // self.num_kv)
        value_states = repeat_kv(value_states, self.num_heads // self.num_kv)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(
            self.head_dim)
        attn_weights = attn_weights + attention_mask
        attn_weights = torch.max(
            attn_weights,
            torch.tensor(torch.finfo(attn_weights.dtype).min, device=attn_weights.device))
        attn_weights = nn.functional.softmax(attn_weights, dim=-1,
                                             dtype=torch.float32).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2)
        attn_output = attn_output.reshape(bsz, q_len, self.hidden_size)
        return self.o_proj(attn_output)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["hidden"], c["intermediate"], bias=False)
        self.down_proj = nn.Linear(c["intermediate"], c["hidden"], bias=False)
        self.up_proj = nn.Linear(c["hidden"], c["intermediate"], bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden"])
        self.post_attention_layernorm = RMSNorm(c["hidden"])

    def forward(self, hidden_states, attention_mask, position_ids, past_key_value=None):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, attention_mask, position_ids)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return (hidden_states,)


class ReplicaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c["layers"])])
        self.norm = RMSNorm(c["hidden"])
        self.gradient_checkpointing = False


class ReplicaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = ReplicaModel(c)
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)
        self.vocab = c["vocab"]

    def gradient_checkpointing_enable(self):
        self.model.gradient_checkpointing = True

    def forward(self, input_ids, labels, use_cache=False):
        m = self.model
        batch_size, seq_length = input_ids.shape
        position_ids = torch.arange(0, seq_length, dtype=torch.long)
        position_ids = position_ids.unsqueeze(0).view(-1, seq_length)
        inputs_embeds = m.embed_tokens(input_ids)
        attention_mask = torch.ones((batch_size, seq_length), dtype=torch.bool)
        causal = make_causal_mask(batch_size, seq_length, inputs_embeds.dtype, inputs_embeds.device)
        attention_mask = expand_mask(attention_mask, inputs_embeds.dtype, seq_length) + causal
        hidden_states = inputs_embeds
        for layer in m.layers:
            if m.gradient_checkpointing and self.training:
                def custom_forward(*inputs, module=layer):
                    return module(*inputs)
                hidden_states = torch.utils.checkpoint.checkpoint(
                    custom_forward, hidden_states, attention_mask, position_ids, None)[0]
            else:
                hidden_states = layer(hidden_states, attention_mask, position_ids)[0]
        hidden_states = m.norm(hidden_states)
        logits = self.lm_head(hidden_states)
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        shift_logits = shift_logits.view(-1, self.vocab)
        shift_labels = shift_labels.view(-1)
        loss = nn.CrossEntropyLoss()(shift_logits, shift_labels)
        return loss, logits, None


# ----------------------------------------------------------------------------- the real one

def try_transformers():
    try:
        import transformers  # noqa: F401
        from transformers import LlamaConfig, LlamaForCausalLM
    except Exception as e:  # not installed: the replica alone
        return None, f"transformers not importable ({type(e).__name__})"
    if not transformers.__version__.startswith("4.30."):
        return None, f"transformers {transformers.__version__} is not 4.30.x"
    return (LlamaConfig, LlamaForCausalLM, transformers.__version__), None


def build_hf(hf, c):
    LlamaConfig, LlamaForCausalLM, _ = hf
    cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["hidden"],
                      intermediate_size=c["intermediate"], num_hidden_layers=c["layers"],
                      num_attention_heads=c["heads"], max_position_embeddings=2048,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def run_hf(model, input_ids, labels, use_cache):
    out = model(input_ids=input_ids, labels=labels, use_cache=use_cache)
    return out.loss, out.logits, out.past_key_values


# ----------------------------------------------------------------------------- counting

def storage_key(t):
    s = t.storage()
    return s.data_ptr(), s.nbytes()


DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
               torch.int64: "int64", torch.int32: "int32", torch.bool: "bool",
               torch.float64: "fp64"}


def count(model, run, input_ids, labels, checkpointing):
    """Runs forward (+ backward when checkpointing, to see the recompute) under the hooks."""
    params = {p.storage().data_ptr() for p in model.parameters()}
    state = {"where": "prologue", "phase": "forward", "next_layer": 0}
    saved = {}  # storage ptr -> record
    keep = []   # keeps every saved tensor alive: no storage address is reused meanwhile

    def pre(name):
        def hook(module, args):
            state["where"] = name
        return hook

    def post_layer(idx):
        def hook(module, args, out):
            state["where"] = "between"
            state["next_layer"] = idx + 1
        return hook

    def post_embedding(module, args, out):
        state["where"] = "between"

    handles = [model.model.embed_tokens.register_forward_pre_hook(pre("embedding")),
               model.model.embed_tokens.register_forward_hook(post_embedding),
               model.model.norm.register_forward_pre_hook(pre("head"))]
    for idx, layer in enumerate(model.model.layers):
        handles.append(layer.register_forward_pre_hook(pre(f"layer.{idx}")))
        handles.append(layer.register_forward_hook(post_layer(idx)))

    def pack(t):
        keep.append(t)
        ptr, nbytes = storage_key(t)
        if ptr in params:
            return t
        where = state["where"]
        if where == "between":
            # A custom Function (checkpoint's CheckpointFunction) packs what it saved after its
            # forward returned, i.e. after the layer's forward hook ran: it is that layer's.
            where = f"layer.{state['next_layer'] - 1}"
        if state["phase"] == "recompute":
            where = "recompute." + where
        rec = saved.get(ptr)
        if rec is None:
            saved[ptr] = {"ptr": ptr, "bytes": nbytes, "dtype": DTYPE_NAMES[t.dtype],
                          "shape": list(t.shape), "where": [where]}
        elif where not in rec["where"]:
            rec["where"].append(where)
        return t

    def unpack(t):
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss, logits, past = run(model, input_ids, labels)
        saved_by = saved_by_nodes(loss.grad_fn)
        if checkpointing:
            state["phase"] = "recompute"
            state["where"] = "between"
            loss.backward()
    for h in handles:
        h.remove()
    held = caller_held(logits, past, saved, params)
    return saved, saved_by, held


def saved_by_nodes(root):
    """storage ptr -> names of the autograd nodes whose saved variables hold it."""
    out, seen, stack = {}, set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        tensors = []
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    v = getattr(node, attr)
                except Exception:
                    continue
                tensors += v if isinstance(v, (tuple, list)) else [v]
        try:
            tensors += list(node.saved_tensors)  # custom Functions (checkpoint)
        except Exception:
            pass
        for v in tensors:
            if isinstance(v, torch.Tensor):
                out.setdefault(v.storage().data_ptr(), set()).add(node.name())
        stack += [f for f, _ in node.next_functions]
    return out


def caller_held(logits, past, saved, params):
    """Bytes the returned output keeps alive beyond the saved tensors (logits, past kv)."""
    tensors = [logits]
    for kv in past or ():
        tensors += list(kv)
    seen, total = set(), 0
    for t in tensors:
        ptr, nbytes = storage_key(t)
        if ptr in saved or ptr in params or ptr in seen:
            continue
        seen.add(ptr)
        total += nbytes
    return total


def groups_of(saved, saved_by, input_ptrs, n_layers):
    groups = {"embedding": [], "layer": [], "shared": [], "head": [], "recompute": [],
              "inputs": [], "host_scalars": []}
    per_layer = [0] * n_layers
    per_layer_lists = [[] for _ in range(n_layers)]
    recompute_lists = [[] for _ in range(n_layers)]
    for rec in saved.values():
        entry = {"shape": rec["shape"], "dtype": rec["dtype"], "bytes": rec["bytes"],
                 "saved_by": sorted(saved_by.get(rec["ptr"], []))}
        forward_where = [w for w in rec["where"] if not w.startswith("recompute.")]
        if rec["ptr"] in input_ptrs:  # input_ids; labels when b = 1 (see below)
            groups["inputs"].append(entry)
        elif rec["dtype"] == "fp64" and not rec["shape"]:
            # A Python number wrapped as a 0-dim double tensor (e.g. the divisor of
            # `scores / math.sqrt(d)`): a CPU tensor even in a GPU run, so no device memory.
            groups["host_scalars"].append(entry)
        elif not forward_where:  # first saved while a layer was replayed in backward
            idx = int(rec["where"][0].split(".")[-1])
            recompute_lists[idx].append(entry)
        elif len(forward_where) > 1:
            groups["shared"].append(entry)
        elif forward_where[0].startswith("layer."):
            idx = int(forward_where[0].split(".")[1])
            per_layer[idx] += rec["bytes"]
            per_layer_lists[idx].append(entry)
        else:
            groups[forward_where[0]].append(entry)
    key = lambda e: (e["bytes"], e["dtype"], e["shape"])
    layer_sigs = [sorted((e["bytes"], e["dtype"], e["shape"]) for e in lst)
                  for lst in per_layer_lists]
    if any(sig != layer_sigs[0] for sig in layer_sigs):
        raise SystemExit("layers saved different tensors: " + repr(layer_sigs))
    groups["layer"] = sorted(per_layer_lists[0], key=key)
    rsigs = [sorted((e["bytes"], e["dtype"], e["shape"]) for e in lst) for lst in recompute_lists]
    if any(sig != rsigs[0] for sig in rsigs):
        raise SystemExit("replayed layers saved different tensors: " + repr(rsigs))
    groups["recompute"] = sorted(recompute_lists[0], key=key)
    for g in ("embedding", "shared", "head", "inputs", "host_scalars"):
        groups[g] = sorted(groups[g], key=key)
    return groups, per_layer


def signature(groups):
    return {g: sorted((e["bytes"], e["dtype"], tuple(e["shape"])) for e in lst)
            for g, lst in groups.items()}


def measure(c, impl, hf):
    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[c["run_dtype"]]
    model = build_hf(hf, c) if impl == "hf" else ReplicaForCausalLM(c)
    model = model.to(dtype)
    model.train()
    ckpt = c["checkpointing"] == "full"
    if ckpt:
        model.gradient_checkpointing_enable()
    input_ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))
    labels = input_ids.clone()
    runner = run_hf if impl == "hf" else (lambda m, i, l, u: m(i, l, use_cache=u))
    saved, saved_by, _ = count(model, lambda m, i, l: runner(m, i, l, False), input_ids, labels,
                               ckpt)
    # labels[..., 1:].contiguous() is a view of labels when b = 1 (the slice is contiguous):
    # nll_loss then saves the caller's labels themselves, not a copy.
    input_ptrs = {input_ids.storage().data_ptr(), labels.storage().data_ptr()}
    groups, per_layer = groups_of(saved, saved_by, input_ptrs, c["layers"])
    held = None
    if impl == "hf" and not ckpt:
        # What a caller keeping the output with use_cache=True (4.30's default) also holds.
        model.zero_grad(set_to_none=True)
        _, _, held = count(model, lambda m, i, l: runner(m, i, l, True), input_ids, labels,
                            False)
    return groups, per_layer, held


CONFIGS = [
    # name, hidden, intermediate, heads, kv_heads, vocab, layers, batch, seq, run dtype, ckpt
    ("h40-a5-i71", 40, 71, 5, 5, 97, 2, 3, 7, "bf16", "none"),
    ("h48-a6-i130-b2-s9", 48, 130, 6, 6, 101, 3, 2, 9, "bf16", "none"),
    ("h64-a4-b1-s5", 64, 176, 4, 4, 256, 2, 1, 5, "bf16", "none"),
    ("h24-a1-single-head", 24, 40, 1, 1, 53, 2, 2, 6, "bf16", "none"),
    ("h40-a5-i71-fp32", 40, 71, 5, 5, 97, 2, 3, 7, "fp32", "none"),
    ("h40-a5-i71-ckpt", 40, 71, 5, 5, 97, 3, 3, 7, "bf16", "full"),
    ("h48-a6-ckpt-fp32", 48, 130, 6, 6, 101, 2, 2, 9, "fp32", "full"),
    ("h48-a6-k2-gqa", 48, 130, 6, 2, 101, 2, 2, 9, "bf16", "none"),
    ("h48-a6-k3-gqa-ckpt", 48, 130, 6, 3, 101, 2, 2, 9, "bf16", "full"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output", default="tests/data/hf_eager_golden.json")
    ap.add_argument("--require-transformers", action="store_true",
                    help="fail unless transformers 4.30.x is importable")
    args = ap.parse_args()
    hf, why_not = try_transformers()
    if hf is None and args.require_transformers:
        raise SystemExit(why_not)
    results = []
    for (name, h, i, a, k, V, L, b, s, dt, ck) in CONFIGS:
        c = {"name": name, "hidden": h, "intermediate": i, "heads": a, "kv_heads": k,
             "vocab": V, "layers": L, "batch": b, "seq": s, "run_dtype": dt,
             "checkpointing": ck}
        groups, per_layer, _ = measure(c, "replica", None)
        impls = ["replica (4.30 op for op" + (", 4.31 repeat_kv)" if k < a else ")")]
        held = None
        if hf is not None and k == a:
            g2, pl2, held = measure(c, "hf", hf)
            if signature(g2) != signature(groups) or pl2 != per_layer:
                raise SystemExit(f"{name}: transformers and the replica disagree:\n"
                                 f"{signature(g2)}\n{signature(groups)}")
            groups = g2  # keep the real model's node names
            impls.insert(0, f"transformers {hf[2]}")
        entry = dict(c)
        entry["implementations"] = impls
        entry["per_layer_bytes"] = per_layer
        entry["group_bytes"] = {g: sum(e["bytes"] for e in lst) for g, lst in groups.items()}
        entry["groups"] = groups
        if held is not None:
            entry["caller_held_use_cache_bytes"] = held
        results.append(entry)
        print(f"{name:24s} layer {entry['group_bytes']['layer']:8d}  head "
              f"{entry['group_bytes']['head']:8d}  shared {entry['group_bytes']['shared']:6d}  "
              f"recompute {entry['group_bytes']['recompute']:8d}  [{'; '.join(impls)}]",
              file=sys.stderr)
    doc = {
        "generator": "tools/hf_saved_tensors.py",
        "torch": torch.__version__,
        "transformers": hf[2] if hf else None,
        "transformers_note": why_not,
        "dtype_note": "16-bit configurations run in bf16 (same width and promotion rules as "
                      "fp16; PyTorch 1.13 has no CPU fp16 GEMM); bytes are storage sizes",
        "counting": "saved_tensors_hooks, each storage once, parameters excluded, attributed to "
                    "the part that saved it first; storages saved by several layers: shared",
        "configs": results,
    }
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
