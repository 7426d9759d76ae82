#!/usr/bin/env python3
"""Counts what PyTorch autograd saves for a HuggingFace LLaMA training step, per code era.

This is the proof behind trainmem's `hf-eager` and `hf-sdpa` profiles (src/analytic/analytic_hf.cpp).
For several small, deliberately awkward configurations it builds the real LlamaForCausalLM of
one installed transformers release, runs one training forward, and records every tensor
autograd saves for backward through torch.autograd.graph.saved_tensors_hooks. Each storage is
counted once (by storage pointer); parameters are excluded. Storages are attributed to the part
of the model that saved them first: "embedding", "layer" (one decoder layer; all layers must
agree), "shared" (saved by several layers: HF checkpointing's mask and position ids, a model's
one RoPE table), "head" (final norm, lm_head, loss), "recompute" (checkpointing: what one layer
saves again while its forward is replayed in backward) and "inputs" (input_ids).

It also measures the training loop's own tensors (what the caller holds at the end of forward
beyond the saved tensors), for three loops:
  hf-model-loss  out = model(input_ids, labels=labels): the model computes the loss; the caller
                 holds `out` (its logits) until backward;
  shift-ce       logits = model(input_ids).logits; the caller computes the loss itself on
                 logits[..., :-1, :].contiguous() with CrossEntropyLoss (the LOMO paper's loop);
  none           logits = model(input_ids).logits and no loss;
and, for hf-model-loss without checkpointing, what `use_cache=True` adds (past_key_values).

Eras (the code a release range shares; --install knows each one's dependencies):
  4.28   transformers 4.28.0-4.29.x     (checked: 4.28.1, 4.29.2)
  4.30   transformers 4.30.x            (checked: 4.30.2; GQA configurations through the
                                         replica below, which adds 4.31's repeat_kv)
  4.31   transformers 4.31.0-4.35.x     (checked: 4.31.0, 4.33.3, 4.35.2)
  5      transformers 5.0-5.25          (checked: 5.25.0; eager and sdpa attention)
Each run writes (or updates) tests/data/hf_golden/<era>[-sdpa].json, one section per PyTorch
series: "<2.2" (run with Debian's python3-torch 1.13, /usr/bin/python3) and ">=2.2" (run with a
current PyTorch CPU wheel from PyPI in a virtual environment). A second release of an era that
saves exactly the same tensors is added to the section's `transformers_versions`; one that
differs is an error (the era would have to be split).

The families (--family mistral|qwen2|qwen3|llama; issue 16): FAMILY_CONFIGS, small awkward
configurations of the current release's MistralForCausalLM (every layer windowed, s above, at
and below sliding_window, head_dim != h/a, no window), Qwen2ForCausalLM (q/k/v biases, tied
embeddings, use_sliding_window from layer max_window_layers, a large vocabulary), Qwen3ForCausalLM
(q_norm/k_norm, head_dim != h/a, a window from a layer) and LlamaForCausalLM with Llama 3's
explicit head_dim and rope_scaling of type llama3, eager and sdpa, written to
tests/data/hf_golden/<family>-<era>[-sdpa].json (same structure; the document and every config
carry "family", and the config its own fields: sliding_window, window_from_layer, head_dim,
tied, rope_scaling). Two rules of these runs:
  - tensors passed to a layer as keyword arguments (mask, RoPE tables, position ids: built once
    per forward by the model) are "shared" even when only some layers save them;
  - layers of one kind (full causal or sliding window) must save the same tensors; when the
    windowed layers save a different list from layer 0's (SDPA: the mask and repeated k/v),
    it is recorded as the group "layer_sliding" (per_layer_bytes lists every layer).
Checked: transformers 5.25.0 with PyTorch 2.15.0 (pip wheel, CPU run), era 5.25 only.
  /tmp/venv-hf/bin/python tools/hf_saved_tensors.py --transformers /tmp/hf/5.25.0 \\
      --family qwen3 --attention sdpa

Install a release out of the way (no dependencies beyond what its LLaMA code imports):
  python3 tools/hf_saved_tensors.py --install 4.28.1 --target /tmp/hf/4.28.1
Run it under one PyTorch:
  /usr/bin/python3 tools/hf_saved_tensors.py --transformers /tmp/hf/4.28.1
  /tmp/venv-torch/bin/python tools/hf_saved_tensors.py --transformers /tmp/hf/5.25.0 \\
      --attention sdpa
(the virtual environment: `python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install
torch "numpy<2"`).

dtype: under PyTorch 1.13 the 16-bit configurations run in bfloat16, because 1.13 has no CPU
fp16 GEMM; under >= 2.2 they run in float16. fp16 and bf16 have the same width (2 bytes) and the
same type-promotion rules (16-bit x fp32 tensor -> fp32; softmax(dtype=float32) upcasts;
.to(16-bit) casts back), so every byte count is the one an fp16 run saves; nothing is attributed
by hand. fp32 configurations show that the upcasts become no-ops (the same storage) there.

SDPA on the CPU: PyTorch's CPU flash-attention kernel (_scaled_dot_product_flash_attention_for_cpu)
saves q, k, v, the output and an fp32 logsumexp (b, a, s), as the CUDA flash kernel does; the
CUDA memory-efficient kernel (chosen on a GPU when a mask tensor is passed) pads logsumexp to a
multiple of 32 positions. Only the CPU kernel runs here.

Checkpointing in the 5 era: HF 5 calls torch.utils.checkpoint with use_reentrant=False, whose
own saved_tensors_hooks hide the checkpointed layers' tensors from ours; those configurations
are left out of the 5 era's golden data (docs/formulas.md says what the profile assumes).
"""

import argparse
import json
import math
import os
import subprocess
import sys

# ----------------------------------------------------------------------------- eras

_COMMON = ["packaging", "tqdm", "filelock", "regex", "requests", "pyyaml", "fsspec",
           "typing_extensions", "urllib3", "idna", "charset_normalizer", "certifi"]
# era -> (first, last) release (inclusive, as tuples) and what `import transformers` and the
# LLaMA code need besides torch and numpy.
ERAS = {
    "4.28": ((4, 28, 0), (4, 29, 99),
             ["huggingface_hub==0.16.4", "tokenizers==0.13.3", "safetensors==0.3.1"] + _COMMON),
    "4.30": ((4, 30, 0), (4, 30, 99),
             ["huggingface_hub==0.16.4", "tokenizers==0.13.3", "safetensors==0.3.1"] + _COMMON),
    "4.31": ((4, 31, 0), (4, 34, 99),
             ["huggingface_hub==0.17.3", "tokenizers==0.14.1", "safetensors==0.4.0"] + _COMMON),
    "4.35": ((4, 35, 0), (4, 35, 99),
             ["huggingface_hub==0.17.3", "tokenizers==0.14.1", "safetensors==0.4.0"] + _COMMON),
    "5.25": ((5, 25, 0), (5, 25, 99),
          ["huggingface_hub>=2.4,<3", "tokenizers>=0.23.1,<0.24", "safetensors>=0.8", "httpx2",
           "httpcore2", "h11", "truststore", "idna", "certifi", "packaging", "tqdm", "filelock",
           "regex", "pyyaml", "fsspec", "typing_extensions"]),
}


def version_tuple(v):
    parts = []
    for p in v.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def era_of(version):
    t = version_tuple(version)
    for era, (first, last, _) in ERAS.items():
        if first <= t <= last:
            return era
    raise SystemExit(f"transformers {version} is in no known era: {', '.join(ERAS)}")


def install(version, target):
    deps = ERAS[era_of(version)][2]
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--target", target, "--no-deps",
           f"transformers=={version}"] + deps
    print(" ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)

if __name__ == "__main__" and "--install" in sys.argv:
    # Runs with any python3 (no torch needed): installs one release out of the way.
    _ap = argparse.ArgumentParser()
    _ap.add_argument("--install", required=True, metavar="VERSION")
    _ap.add_argument("--target", required=True, metavar="DIR")
    _a = _ap.parse_args()
    install(_a.install, _a.target)
    sys.exit(0)

# --transformers DIR must come first on the path, before torch imports anything.
if "--transformers" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--transformers") + 1])

import torch  # noqa: E402
import torch.utils.checkpoint  # noqa: E402
from torch import nn  # noqa: E402

def torch_series():
    return "<2.2" if version_tuple(torch.__version__) < (2, 2, 0) else ">=2.2"


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

    def forward(self, input_ids, labels=None, use_cache=False):
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
        if labels is None:
            return None, logits, None
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        shift_logits = shift_logits.view(-1, self.vocab)
        shift_labels = shift_labels.view(-1)
        loss = nn.CrossEntropyLoss()(shift_logits, shift_labels)
        return loss, logits, None




def replica_forward(model, input_ids, labels, use_cache):
    return model(input_ids, labels, use_cache=use_cache)


# ----------------------------------------------------------------------------- the real one

FAMILY_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}


def load_transformers(family="llama"):
    import transformers
    config_name, model_name = FAMILY_CLASSES[family]
    return (transformers.__version__, getattr(transformers, config_name),
            getattr(transformers, model_name))


def build_hf(hf, c, attention):
    version, Config, ForCausalLM = hf
    kw = dict(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["intermediate"],
              num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
              max_position_embeddings=2048, tie_word_embeddings=c.get("tied", False))
    if version_tuple(version) >= (4, 31, 0):
        kw["num_key_value_heads"] = c["kv_heads"]
    if version_tuple(version) >= (4, 36, 0):
        kw["attn_implementation"] = attention
    family = c.get("family", "llama")
    # The families' own fields (config.json keys, as the released configs spell them).
    if family == "mistral":
        kw["sliding_window"] = c.get("sliding_window")  # every layer; None: full causal
    if family in ("qwen2", "qwen3"):
        w = c.get("sliding_window")
        kw["use_sliding_window"] = w is not None
        kw["sliding_window"] = w if w is not None else 4096
        kw["max_window_layers"] = c.get("window_from_layer", 0)
    if family == "qwen3":
        kw["head_dim"] = c.get("head_dim", c["hidden"] // c["heads"])
    if family in ("llama", "mistral") and c.get("head_dim"):
        kw["head_dim"] = c["head_dim"]
    if c.get("rope_scaling"):
        kw["rope_scaling"] = dict(c["rope_scaling"])
    return ForCausalLM(Config(**kw))


def hf_forward(model, input_ids, labels, use_cache):
    kw = {"use_cache": use_cache}
    if labels is not None:
        kw["labels"] = labels
    out = model(input_ids=input_ids, **kw)
    keys = list(out.keys())  # 5.x names it `cache`, earlier releases `past_key_values`
    cache = out["cache"] if "cache" in keys else out.get("past_key_values")
    return out.loss, out.logits, cache


def shift_ce(logits, labels):
    """The loss a caller computes on returned logits (the LOMO paper's loop)."""
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    return nn.CrossEntropyLoss()(shift_logits.view(-1, shift_logits.shape[-1]),
                                 shift_labels.view(-1))


LOOPS = ("hf-model-loss", "shift-ce", "none")


def run_loop(forward, model, input_ids, labels, loop, use_cache=False):
    """Runs one training forward of `loop`; returns (loss or None, what the caller holds)."""
    if loop == "hf-model-loss":
        loss, logits, cache = forward(model, input_ids, labels, use_cache)
        return loss, [("logits", logits)] + cache_tensors(cache)
    _, logits, cache = forward(model, input_ids, None, use_cache)
    held = [("logits", logits)] + cache_tensors(cache)
    if loop == "shift-ce":
        return shift_ce(logits, labels), held
    return None, held  # no loss: only the model's own saved tensors


def cache_tensors(cache):
    """The tensors of past_key_values: a tuple of (k, v) per layer, or a Cache object."""
    out = []

    def walk(x, depth):
        if depth > 6 or x is None:
            return
        if isinstance(x, torch.Tensor):
            out.append(("past_key_values", x))
        elif isinstance(x, (tuple, list)):
            for y in x:
                walk(y, depth + 1)
        elif hasattr(x, "__dict__"):
            for y in vars(x).values():
                walk(y, depth + 1)
    walk(cache, 0)
    return out

# ----------------------------------------------------------------------------- counting

def storage_key(t):
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr(), s.nbytes()


DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
               torch.int64: "int64", torch.int32: "int32", torch.bool: "bool",
               torch.float64: "fp64"}


def count(model, run, backward, by_kwargs=False):
    """Runs `run` (one training forward) under the hooks, and the backward when `backward` (to
    see a checkpointed layer's replay). Returns the saved storages, the autograd nodes that hold
    each, and the storages the caller holds that autograd did not save."""
    params = {storage_key(p)[0] for p in model.parameters()}
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

    # The tensors the model passes to its layers as keyword arguments (the mask, the RoPE
    # tables, position ids): built once per forward outside the layers, so a storage among them
    # is "shared" even when only some layers save it (a sliding-window mask that only the
    # windowed layers of a Qwen2 model keep). Needs with_kwargs (PyTorch >= 2.0).
    layer_args = set()

    def pre_layer(idx):
        def hook(module, args, kwargs):
            state["where"] = f"layer.{idx}"

            def walk(x, depth=0):
                if isinstance(x, torch.Tensor):
                    layer_args.add(storage_key(x)[0])
                elif isinstance(x, (tuple, list)) and depth < 3:
                    for y in x:
                        walk(y, depth + 1)
            for v in kwargs.values():
                walk(v)
        return hook

    handles = [model.model.embed_tokens.register_forward_pre_hook(pre("embedding")),
               model.model.embed_tokens.register_forward_hook(post_embedding),
               model.model.norm.register_forward_pre_hook(pre("head"))]
    for idx, layer in enumerate(model.model.layers):
        if by_kwargs:
            handles.append(layer.register_forward_pre_hook(pre_layer(idx), with_kwargs=True))
        else:
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
        if ptr in layer_args and where.startswith("layer."):
            where = "shared"
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
        loss, held = run()
        saved_by = saved_by_nodes(loss.grad_fn) if loss is not None else {}
        if backward:
            state["phase"] = "recompute"
            state["where"] = "between"
            loss.backward()
    for h in handles:
        h.remove()
    return saved, saved_by, caller_held(held, saved, params)


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
                out.setdefault(storage_key(v)[0], set()).add(node.name())
        stack += [f for f, _ in node.next_functions]
    return out


def caller_held(held, saved, params):
    """The storages the caller holds (logits, past key/values) that autograd did not save."""
    seen, out = set(), []
    for what, t in held:
        ptr, nbytes = storage_key(t)
        if ptr in saved or ptr in params or ptr in seen:
            continue
        seen.add(ptr)
        out.append({"what": what, "shape": list(t.shape), "dtype": DTYPE_NAMES[t.dtype],
                    "bytes": nbytes})
    return sorted(out, key=lambda e: (e["what"], e["bytes"], e["dtype"]))


def groups_of(saved, saved_by, input_ptrs, n_layers, layer_kinds=None):
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
    kinds = layer_kinds or ["full"] * n_layers
    # Layers of one kind (full causal, or sliding window) must save the same tensors; a kind
    # that saves differently from layer 0's gets its own group, "layer_<kind>".
    first_of = {}
    for idx, kind in enumerate(kinds):
        first_of.setdefault(kind, idx)
        if layer_sigs[idx] != layer_sigs[first_of[kind]]:
            raise SystemExit(f"{kind} layers saved different tensors: " + repr(layer_sigs))
    groups["layer"] = sorted(per_layer_lists[0], key=key)
    for kind, idx in first_of.items():
        if layer_sigs[idx] != layer_sigs[0]:
            groups["layer_" + kind] = sorted(per_layer_lists[idx], key=key)
    rsigs = [sorted((e["bytes"], e["dtype"], e["shape"]) for e in lst) for lst in recompute_lists]
    if any(sig != rsigs[0] for sig in rsigs):
        raise SystemExit("replayed layers saved different tensors: " + repr(rsigs))
    groups["recompute"] = sorted(recompute_lists[0], key=key)
    for g in ("embedding", "shared", "head", "inputs", "host_scalars"):
        groups[g] = sorted(groups[g], key=key)
    return groups, per_layer


def signature(entry):
    """What must agree between two releases of one era (or transformers and the replica)."""
    sig = {g: sorted((e["bytes"], e["dtype"], tuple(e["shape"])) for e in lst)
           for g, lst in entry["groups"].items()}
    for loop, rec in entry.get("loops", {}).items():
        sig["loop." + loop] = (sorted((e["bytes"], e["dtype"], tuple(e["shape"]))
                                      for e in rec["head"]),
                               [(e["what"], e["bytes"], e["dtype"]) for e in rec["held"]])
    sig["use_cache"] = entry.get("use_cache_held")
    return sig


def layer_kinds(c):
    """"sliding" for the layers that use the sliding window, "full" for the others."""
    w = c.get("sliding_window")
    first = c.get("window_from_layer", 0)
    return ["sliding" if w is not None and l >= first else "full" for l in range(c["layers"])]


def measure(c, impl, hf, attention):
    """One configuration: the saved tensors of hf-model-loss (with the replay under
    checkpointing), the head and caller-held tensors of each loop, and what use_cache adds."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[c["run_dtype"]]

    def fresh():
        torch.manual_seed(0)
        m = build_hf(hf, c, attention) if impl == "hf" else ReplicaForCausalLM(c)
        m = m.to(dtype)
        m.train()
        if c["checkpointing"] == "full":
            m.gradient_checkpointing_enable()
        return m

    forward = hf_forward if impl == "hf" else replica_forward
    by_kwargs = "family" in c  # the families' runs (PyTorch >= 2.0): layer kwargs are shared
    kinds = layer_kinds(c)
    ckpt = c["checkpointing"] == "full"
    torch.manual_seed(1)
    input_ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))
    labels = input_ids.clone()
    # labels[..., 1:].contiguous() is a view of labels when b = 1 (the slice is contiguous):
    # nll_loss then saves the caller's labels themselves, not a copy.
    input_ptrs = {storage_key(input_ids)[0], storage_key(labels)[0]}
    model = fresh()
    saved, saved_by, held = count(
        model, lambda: run_loop(forward, model, input_ids, labels, "hf-model-loss"), ckpt,
        by_kwargs)
    groups, per_layer = groups_of(saved, saved_by, input_ptrs, c["layers"], kinds)
    loops = {}
    for loop in LOOPS:
        model = fresh()
        s2, sb2, held2 = count(
            model, lambda: run_loop(forward, model, input_ids, labels, loop), False, by_kwargs)
        g2, _ = groups_of(s2, sb2, input_ptrs, c["layers"], kinds)
        loops[loop] = {"head": g2["head"], "head_bytes": sum(e["bytes"] for e in g2["head"]),
                       "held": held2, "held_bytes": sum(e["bytes"] for e in held2)}
    use_cache = None
    if not ckpt:
        model = fresh()
        s3, _, held3 = count(
            model, lambda: run_loop(forward, model, input_ids, labels, "hf-model-loss", True),
            False, by_kwargs)
        # What use_cache=True adds: the past key/values the caller holds beyond the saved
        # tensors, plus any change of the saved tensors themselves (in 5.x the cache's
        # contiguous copies are what matmul then saves, instead of its own copies).
        use_cache = (sum(e["bytes"] for e in held3 if e["what"] == "past_key_values") +
                     sum(r["bytes"] for r in s3.values()) -
                     sum(r["bytes"] for r in saved.values() if not any(
                         w.startswith("recompute.") for w in r["where"])))
    return groups, per_layer, loops, use_cache

CONFIGS = [
    # name, hidden, intermediate, heads, kv_heads, vocab, layers, batch, seq, dtype, ckpt
    ("h40-a5-i71", 40, 71, 5, 5, 97, 2, 3, 7, "16", "none"),
    ("h48-a6-i130-b2-s9", 48, 130, 6, 6, 101, 3, 2, 9, "16", "none"),
    ("h64-a4-b1-s5", 64, 176, 4, 4, 256, 2, 1, 5, "16", "none"),
    ("h24-a1-single-head", 24, 40, 1, 1, 53, 2, 2, 6, "16", "none"),
    ("h40-a5-i71-fp32", 40, 71, 5, 5, 97, 2, 3, 7, "fp32", "none"),
    ("h40-a5-i71-ckpt", 40, 71, 5, 5, 97, 3, 3, 7, "16", "full"),
    ("h48-a6-ckpt-fp32", 48, 130, 6, 6, 101, 2, 2, 9, "fp32", "full"),
    ("h48-a6-k2-gqa", 48, 130, 6, 2, 101, 2, 2, 9, "16", "none"),
    ("h48-a6-k3-gqa-ckpt", 48, 130, 6, 3, 101, 2, 2, 9, "16", "full"),
]


# The families (--family): small awkward configurations of the current release's
# MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM (transformers 5.x: no checkpointing,
# whose use_reentrant=False hides the layers from the hooks). Keys as in CONFIGS, plus the
# family's own: sliding_window (None: full causal), window_from_layer (Qwen's
# max_window_layers: the first windowed layer), head_dim (Qwen3: decoupled from h/a), tied.
# Mistral: every layer windowed. Qwen2: q/k/v biases always. Qwen3: q_norm and k_norm always.
def _fc(family, name, h, i, a, k, V, L, b, s, dt, **extra):
    c = {"family": family, "name": name, "hidden": h, "intermediate": i, "heads": a,
         "kv_heads": k, "vocab": V, "layers": L, "batch": b, "seq": s, "dtype": dt}
    c.update(extra)
    return c


FAMILY_CONFIGS = {
    "mistral": [
        # s 9 > window 4: HF builds the windowed mask; GQA k 2
        _fc("mistral", "m-h48-a6-k2-w4-s9", 48, 130, 6, 2, 101, 2, 2, 9, "16", sliding_window=4),
        # b 1, no GQA, s 7 > window 3
        _fc("mistral", "m-h40-a5-w3-b1-s7", 40, 71, 5, 5, 97, 2, 1, 7, "16", sliding_window=3),
        # s 6 < window 8: SDPA may take the pure causal path (no mask)
        _fc("mistral", "m-h40-a5-k1-w8-s6", 40, 71, 5, 1, 97, 2, 3, 6, "16", sliding_window=8),
        # k 1 with a mask (s 7 > window 3): repeat_kv's expand of one kv head is a view
        _fc("mistral", "m-h40-a5-k1-w3-s7", 40, 71, 5, 1, 97, 2, 2, 7, "16", sliding_window=3),
        # s == window: the mask is still built (kv_length >= window)
        _fc("mistral", "m-h48-a6-k3-w7-s7", 48, 130, 6, 3, 101, 2, 2, 7, "16", sliding_window=7),
        _fc("mistral", "m-h40-a5-k5-w3-s7-fp32", 40, 71, 5, 5, 97, 2, 3, 7, "fp32",
            sliding_window=3),
        # head_dim 16 != h/a 8 (Mistral-Nemo's kind: 128 at h 5120, a 32), s 9 > window 5
        _fc("mistral", "m-h48-a6-k2-d16-w5-s9", 48, 130, 6, 2, 101, 2, 2, 9, "16", head_dim=16,
            sliding_window=5),
        # no window at all (Mistral v0.2+ configs: sliding_window null)
        _fc("mistral", "m-h24-a1-nowindow", 24, 40, 1, 1, 53, 2, 2, 6, "16", sliding_window=None),
    ],
    "qwen2": [
        # biases, tied, windowed from layer 1 of 3, s 9 > window 4, GQA
        _fc("qwen2", "q2-h48-a6-k2-tied-w4-from1", 48, 130, 6, 2, 101, 3, 2, 9, "16",
            tied=True, sliding_window=4, window_from_layer=1),
        # biases, untied, no window, b 1
        _fc("qwen2", "q2-h40-a5-untied-b1", 40, 71, 5, 5, 97, 2, 1, 7, "16", tied=False),
        # every layer windowed (max_window_layers 0), no GQA
        _fc("qwen2", "q2-h40-a5-tied-w3-from0", 40, 71, 5, 5, 97, 2, 3, 7, "16", tied=True,
            sliding_window=3, window_from_layer=0),
        _fc("qwen2", "q2-h48-a6-k3-tied-w5-from1-fp32", 48, 130, 6, 3, 101, 2, 2, 9, "fp32",
            tied=True, sliding_window=5, window_from_layer=1),
        # a large-vocabulary head relative to h (V 1000 >> h 24), tied, a = 1
        _fc("qwen2", "q2-h24-a1-V1000-tied", 24, 40, 1, 1, 1000, 2, 2, 6, "16", tied=True),
    ],
    "qwen3": [
        # head_dim 16 with h 40, a 4 (a·d = 64 != h), GQA k 2, q/k norms
        _fc("qwen3", "q3-h40-a4-k2-d16", 40, 71, 4, 2, 97, 2, 2, 7, "16", head_dim=16),
        # head_dim 12 < h/a = 16 (a·d = 36 < h 48), k 1, b 1
        _fc("qwen3", "q3-h48-a3-k1-d12-b1", 48, 130, 3, 1, 101, 2, 1, 9, "16", head_dim=12),
        # head_dim == h/a (Qwen3-8B's shape: 4096/32 = 128), tied
        _fc("qwen3", "q3-h48-a6-k2-d8-tied", 48, 130, 6, 2, 101, 2, 2, 9, "16", head_dim=8,
            tied=True),
        _fc("qwen3", "q3-h40-a4-k2-d16-fp32", 40, 71, 4, 2, 97, 2, 3, 7, "fp32", head_dim=16),
        # Qwen3 with use_sliding_window from layer 1 (s 9 > window 4)
        _fc("qwen3", "q3-h40-a4-k2-d16-w4-from1", 40, 71, 4, 2, 97, 2, 2, 9, "16", head_dim=16,
            sliding_window=4, window_from_layer=1),
    ],
    # Llama 3.x on the current release: explicit head_dim and rope_scaling of type llama3.
    "llama": [
        _fc("llama", "l3-h48-a6-k2-d16-rope-llama3", 48, 130, 6, 2, 101, 2, 2, 9, "16",
            head_dim=16, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 16}),
        _fc("llama", "l3-h48-a6-k2-tied-rope-llama3", 48, 130, 6, 2, 101, 2, 1, 9, "16",
            tied=True, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 16}),
    ],
}


def golden_path(out_dir, era, attention, family=None):
    stem = era if family is None else f"{family}-{era}"
    return os.path.join(out_dir, stem + ("-sdpa" if attention == "sdpa" else "") + ".json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transformers", required=True,
                    help="folder holding one transformers release (see --install)")
    ap.add_argument("--attention", default="eager", choices=["eager", "sdpa"],
                    help="attention implementation (sdpa: the 5 era only)")
    ap.add_argument("--output-dir", default="tests/data/hf_golden")
    ap.add_argument("--family", choices=sorted(FAMILY_CONFIGS),
                    help="the families' configurations (FAMILY_CONFIGS) of the current release, "
                         "written to <family>-<era>[-sdpa].json; without it: LLaMA's CONFIGS, "
                         "written to <era>[-sdpa].json")
    args = ap.parse_args()
    hf = load_transformers(args.family or "llama")
    version = hf[0]
    era = era_of(version)
    if args.attention == "sdpa" and era != "5.25":
        raise SystemExit(f"transformers {version}: sdpa is measured for the 5 era only")
    if args.family and era != "5.25":
        raise SystemExit(f"transformers {version}: the families are measured for the 5 era only")
    half = torch.bfloat16 if torch_series() == "<2.2" else torch.float16
    half_name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[half]
    results = []
    todo = []
    if args.family:
        for fc in FAMILY_CONFIGS[args.family]:
            c = {k: v for k, v in fc.items() if k != "dtype"}
            c["run_dtype"] = half_name if fc["dtype"] == "16" else fc["dtype"]
            c["checkpointing"] = "none"
            todo.append(c)
    else:
        for (name, h, i, a, k, V, L, b, s, dt, ck) in CONFIGS:
            todo.append({"name": name, "hidden": h, "intermediate": i, "heads": a, "kv_heads": k,
                         "vocab": V, "layers": L, "batch": b, "seq": s,
                         "run_dtype": half_name if dt == "16" else dt, "checkpointing": ck})
    for c in todo:
        name, k, a, ck = c["name"], c["kv_heads"], c["heads"], c["checkpointing"]
        gqa_unsupported = k < a and version_tuple(version) < (4, 31, 0)
        if gqa_unsupported and era != "4.30":
            print(f"{name:24s} skipped: transformers {version} has no GQA", file=sys.stderr)
            continue
        if ck == "full" and era == "5.25":
            print(f"{name:24s} skipped: HF 5 checkpoints with use_reentrant=False (hidden from "
                  "saved_tensors_hooks)", file=sys.stderr)
            continue
        if gqa_unsupported:  # 4.30 cannot express GQA: the replica (4.30 + 4.31's repeat_kv)
            impls = ["replica (4.30 op for op, 4.31 repeat_kv)"]
            groups, per_layer, loops, _ = measure(c, "replica", None, "eager")
            use_cache = None  # the replica returns no past_key_values
        else:
            impls = [f"transformers {version}"]
            groups, per_layer, loops, use_cache = measure(c, "hf", hf, args.attention)
            if era == "4.30":  # the replica must agree with the real code
                rg, rpl, rloops, ruse = measure(c, "replica", None, "eager")
                mine = signature({"groups": groups, "loops": loops, "use_cache_held": use_cache})
                # (the replica returns no past_key_values: use_cache is the real code's alone)
                theirs = signature({"groups": rg, "loops": rloops, "use_cache_held": use_cache})
                if mine != theirs or rpl != per_layer:
                    raise SystemExit(f"{name}: transformers and the replica disagree:\n"
                                     f"{mine}\n{theirs}")
                impls.append("replica (4.30 op for op)")
        entry = dict(c)
        entry["implementations"] = impls
        entry["per_layer_bytes"] = per_layer
        entry["group_bytes"] = {g: sum(e["bytes"] for e in lst) for g, lst in groups.items()}
        entry["groups"] = groups
        entry["loops"] = loops
        if use_cache is not None:
            entry["use_cache_held"] = use_cache
        results.append(entry)
        gb = entry["group_bytes"]
        print(f"{name:24s} layer {gb['layer']:8d}  head {gb['head']:8d}  shared {gb['shared']:6d}"
              f"  recompute {gb['recompute']:8d}  held {loops['hf-model-loss']['held_bytes']:7d}"
              f"  [{'; '.join(impls)}]", file=sys.stderr)

    path = golden_path(args.output_dir, era, args.attention, args.family)
    doc = {"generator": "tools/hf_saved_tensors.py", "era": era, "attention": args.attention,
           "family": args.family or "llama",
           "counting": "saved_tensors_hooks, each storage once, parameters excluded, attributed "
                       "to the part that saved it first; storages saved by several layers: shared",
           "dtype_note": "16-bit configurations run in bf16 under PyTorch 1.13 (no CPU fp16 "
                         "GEMM) and in fp16 under >= 2.2; same width and promotion rules",
           "runs": []}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
    run = {"torch": torch.__version__, "torch_series": torch_series(),
           "transformers_versions": [version], "configs": results}
    for n, old in enumerate(doc["runs"]):
        if old["torch_series"] != run["torch_series"]:
            continue
        if version in old["transformers_versions"] and len(old["transformers_versions"]) == 1:
            doc["runs"][n] = run  # a fresh run of the same release replaces it
            break
        # Another release of the era: it must save exactly what the recorded one saves.
        old_by_name = {e["name"]: e for e in old["configs"]}
        for e in results:
            o = old_by_name.get(e["name"])
            if o is None or signature(o) != signature(e):
                raise SystemExit(f"transformers {version} differs from "
                                 f"{old['transformers_versions']} on {e['name']}: era {era} "
                                 "would have to be split")
        if version not in old["transformers_versions"]:
            old["transformers_versions"].append(version)
        print(f"{version} saves what {old['transformers_versions'][0]} saves: added to era {era}",
              file=sys.stderr)
        break
    else:
        doc["runs"].append(run)
    doc["runs"].sort(key=lambda r: r["torch_series"])
    os.makedirs(args.output_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
