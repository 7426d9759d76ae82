#!/usr/bin/env python3
"""Golden data for the model test: a hand-written PyTorch LLaMA (HuggingFace semantics).

Builds a tiny LLaMA exactly as transformers' LlamaForCausalLM computes it with eager attention
(pre-norm RMSNorm as HF's LlamaRMSNorm, rotate-half RoPE, GQA by repeating kv heads, SwiGLU
MLP, final norm, untied or tied LM head, the shifted causal-LM cross-entropy), runs forward and
backward, and writes under tests/data/:

  golden_<name>_config.json          HF config.json of the model (loadable by --model)
  golden_<name>_weights.safetensors  fp32 weights under HF names (loadable by --weights)
  golden_<name>_tokens.bin           batch x seq int32 little-endian ids (loadable by --tokens)
  golden_<name>_expected.safetensors `loss` (fp32 [1]) and every parameter gradient under its
                                     HF name, fp32: the format of `trainmem profile --dump`

The weights are fp32 values; the forward/backward runs in float64 by default (--compute fp32
to run it in fp32) so that the stored loss and gradients are the exact answer for those
weights, rounded once to fp32. The test needs no PyTorch.

Run with the Debian interpreter that has torch: /usr/bin/python3 tools/make_golden.py

The families (issue 16; --families): tiny_mistral, tiny_qwen2, tiny_qwen3, tiny_llama3 are made
with the REAL transformers classes (MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
LlamaForCausalLM), built with Config.from_dict() from the very config.json written for trainmem,
eager attention, fp32 weights AND fp32 compute (HF's RMSNorm casts to fp32, so a float64 run of
the real classes would not be exact anyway); the loss is the model's own
(model(input_ids, labels=input_ids).loss: the shifted causal-LM mean over b·(s−1)). Every
parameter is randomised, biases and norm weights included (a missing bias or q/k-norm gradient
shows), and the RoPE inverse frequencies the model uses are checked against an independent
computation (rope_theta, Llama 3's rope_scaling). s = 16 exceeds the windows (5, 6). Run with a
PyTorch that can import the current transformers, e.g.
  /tmp/venv-hf/bin/python tools/make_golden.py --families --transformers /tmp/hf/5.25.0
(transformers installed out of the way by tools/hf_saved_tensors.py --install 5.25.0 --target
/tmp/hf/5.25.0). Checked with transformers 5.25.0, PyTorch 2.15.0.

The mixture-of-experts goldens (issue 29; --families, made alone with --only): tiny_mixtral
(MixtralForCausalLM: 4 experts of width 32 (Mixtral's intermediate_size), top 2, renormalised
top-k weights, 4 heads / 2 kv heads, no window), tiny_qwen3_moe (Qwen3MoeForCausalLM: 6 experts
of width moe_intermediate_size 32, top 2, norm_topk_prob false so the unnormalised path is
covered, every layer MoE (decoder_sparse_step 1, mlp_only_layers []), head_dim 16, q/k norms)
and tiny_qwen2_moe (Qwen2MoeForCausalLM: as tiny_qwen3_moe but Qwen2's attention, head_dim
48/4 = 12 with randomised q/k/v biases, and in every MoE block a shared expert, a dense SwiGLU of
width shared_expert_intermediate_size 40 (mlp.shared_expert.{gate,up,down}_proj.weight), scaled
per token by sigmoid(x·W_sgᵀ) with mlp.shared_expert_gate.weight (1, h) and added to the routed
experts' sum), b 2, s 16, no router logits in the loss (but see tiny_mixtral_aux), fp32 weights and compute as above, eager
attention and the experts' eager implementation (experts_implementation "eager" in the config's
kwargs: the per-expert loop of MixtralExperts/Qwen3MoeExperts/Qwen2MoeExperts.forward, not 5.x's
default "grouped_mm"). The routers (mlp.gate.weight), the 3-D experts (mlp.experts.gate_up_proj
(E, 2·m, h), mlp.experts.down_proj (E, h, m)), the shared expert and its gate are randomised like
every matrix (0.2·N(0, 1): the gate's logits have a std of about 0.2·sqrt(48) ≈ 1.4 times the
normed input's rms, so the sigmoid values spread; a range under 0.3 in a layer fails). Routing
must be robust, since trainmem routes in fp32 itself: forward hooks on every router and MoE block
check, for every token and layer, that the k-th minus the (k+1)-th router probability exceeds
ROUTING_MIN_GAP (1e-3), that the top-k probabilities are distinct by more than 1e-6 and that
every expert gets a token; if not, the weights are drawn again with the next seed. Each block's
output is also checked against a float64 computation by hand (gate = gate_up_proj's first m
rows; the shared expert times its sigmoid gate added: without the sigmoid the check fails, by
0.59 relative). The expected file's metadata records the seed used, the seeds rejected, the
minimum gap and top-k separation, the tokens routed to each expert per layer (routing_l<l>:
expert 0, 1, ...), for tiny_qwen2_moe the shared gate's sigmoid range per layer
(shared_gate_sigmoid_l<l>: min,max) and the transformers and torch versions. Made on 2026-12-06
with the PyPI releases (transformers 5.25.0, torch 2.15.0+cu132, on the CPU) by
  LD_LIBRARY_PATH=<libcufile, libnvshmem_host, NCCL 2.32: see tools/peft_golden.py> \
  USE_HUB_KERNELS=0 PYTHONPATH=/tmp/bnbpy:/tmp/bnbdeps \
  python3 tools/make_golden.py --families --only tiny_mixtral,tiny_qwen3_moe
(seed 1234 was rejected for both: gaps 2.4e-4 and 8.6e-4; seed 1235 taken), and tiny_qwen2_moe
the same way with --only tiny_qwen2_moe (seed 1234 taken: min gap 1.89e-3, sigmoid values
0.014-0.97, loss 5.04799604). --only leaves the other families' files untouched: rerun here,
the dense families' weights and tokens came out byte-identical but three expected files differed
at fp32 rounding (~1.5e-6 relative), so the committed ones were kept.

tiny_mixtral_aux (--only tiny_mixtral_aux) is tiny_mixtral with the router's load-balancing loss
in the loss: the same config keys and sizes (hence, for the same seed, byte-identical weights and
tokens) but output_router_logits true and router_aux_loss_coef 0.5 (large, so that the aux loss
visibly moves the gradients; the default 0.001 would not). The stored loss is the model's own,
which in transformers 5.25 MixtralForCausalLM.forward is loss_function(logits, labels) +
router_aux_loss_coef · load_balancing_loss_func(router_logits, E, k, attention_mask=None), and
the gradients are those of that sum. load_balancing_loss_func (5.25.0, modeling_mixtral.py):
per layer the softmax of the router's raw logits in their own dtype (not the router's .float();
fp32 here), the top-k RECOMPUTED from that softmax, then without an attention mask
tokens_per_expert = (top-k counts summed over layers) / (L·T) and router_prob_per_expert =
(softmax summed over layers' tokens) / (L·T), aux = E · sum(tokens_per_expert ·
router_prob_per_expert): Switch's f·P summed, the top-k counts NOT divided by k (so balanced
routing gives k, not 1). The script checks: out.router_logits are the routers' own outputs,
loss == ce + coef·aux_loss exactly (ce = model.loss_function on the same logits, equal to
tiny_mixtral's loss), the aux loss recomputed by hand in float64 (aux_loss_reference) matches to
1e-6 relative, its top-k is the routers' choice, and ||coef·d aux/dW_router|| / ||d ce/dW_router||
> 0.05 in every layer. Its metadata adds output_router_logits, router_aux_loss_coef, aux_loss
(HF's), ce_loss, aux_loss_fp64 (by hand) and router_grad_aux_ratio_l<l>. Made on 2026-12-06 as
the other MoE goldens (seed 1234 rejected, 1235 taken; routing as tiny_mixtral's 13,24,3,24 and
21,13,12,18): loss 6.49386597 = ce 5.40232515 + 0.5 · aux 2.18308187 (by hand 2.18308173369,
6.0e-8 relative); router-gradient ratios 0.140 (layer 0) and 0.728 (layer 1). The gradients of
lm_head, model.norm and the last layer's experts equal tiny_mixtral's bit for bit (the aux loss
does not reach them); the others differ by 7-83 % of their max.

tiny_qwen2_moe_mixed (--only tiny_qwen2_moe_mixed) is tiny_qwen2_moe with 3 layers, layer 1 dense
(mlp_only_layers [1]: a Qwen2MoeMLP of width intermediate_size 128) and the load-balancing loss
(output_router_logits, coef 0.5), which HF computes over the two MoE layers' router logits only.
The MoE checks run on layers 0 and 2 (moe_blocks), the aux loss's logits are matched to them in
order. Made on 2026-12-06, transformers 5.25.0 and torch 2.15.0+cu132 on the CPU, as above (seed
1234 taken: min gap 1.66e-3; routing_l0 22,6,4,5,17,10, routing_l2 7,12,3,8,20,14): loss
7.05788660 = ce 5.88262653 + 0.5 · aux 2.350519896 (by hand 2.3505197126, 7.8e-8 relative);
router-gradient ratios 0.477 (layer 0) and 1.812 (layer 2).
"""
import sys

# --transformers DIR must come first on the path, before torch imports anything.
if "--transformers" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--transformers") + 1])
import argparse
import copy
import json
import math
import os
import struct

import torch

CONFIGS = {
    # name: (vocab, hidden, intermediate, layers, heads, kv_heads, tied, batch, seq)
    "tiny_gqa": (96, 48, 128, 2, 6, 2, False, 2, 16),
    "tiny_tied": (64, 32, 96, 2, 2, 2, True, 3, 9),
}
RMS_EPS = 1e-5
ROPE_THETA = 10000.0


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, torch tensor) written in order, fp32 or int32."""
    header = {}
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        dtype = {torch.float32: "F32", torch.int32: "I32"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def param_shapes(V, h, i, L, a, k, tied):
    d = h // a
    shapes = [("model.embed_tokens.weight", (V, h))]
    for l in range(L):
        p = f"model.layers.{l}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (a * d, h)),
            (p + "self_attn.k_proj.weight", (k * d, h)),
            (p + "self_attn.v_proj.weight", (k * d, h)),
            (p + "self_attn.o_proj.weight", (h, a * d)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
        ]
    shapes.append(("model.norm.weight", (h,)))
    if not tied:
        shapes.append(("lm_head.weight", (V, h)))
    return shapes


def rms_norm(x, w, eps):
    # LlamaRMSNorm: variance in fp32 (here: the compute dtype), weight * normalised.
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(s, d, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    t = torch.arange(s, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def llama_loss(W, tokens, V, h, i, L, a, k, tied, rms_eps=RMS_EPS, rope_theta=ROPE_THETA):
    b, s = tokens.shape
    d = h // a
    dtype = W["model.embed_tokens.weight"].dtype
    cos, sin = rope_cos_sin(s, d, rope_theta, dtype)
    x = W["model.embed_tokens.weight"][tokens.long()]  # (b, s, h)
    mask = torch.full((s, s), float("-inf"), dtype=dtype).triu(1)
    for l in range(L):
        p = f"model.layers.{l}."
        res = x
        xn = rms_norm(x, W[p + "input_layernorm.weight"], rms_eps)
        q = (xn @ W[p + "self_attn.q_proj.weight"].T).view(b, s, a, d).transpose(1, 2)
        kk = (xn @ W[p + "self_attn.k_proj.weight"].T).view(b, s, k, d).transpose(1, 2)
        v = (xn @ W[p + "self_attn.v_proj.weight"].T).view(b, s, k, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        kk = kk * cos + rotate_half(kk) * sin
        rep = a // k  # repeat_kv: query head j reads kv head j // rep
        if rep > 1:
            kk = kk.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        scores = q @ kk.transpose(2, 3) / math.sqrt(d) + mask
        probs = torch.softmax(scores, dim=-1)
        o = (probs @ v).transpose(1, 2).reshape(b, s, a * d)
        x = res + o @ W[p + "self_attn.o_proj.weight"].T
        res = x
        xn = rms_norm(x, W[p + "post_attention_layernorm.weight"], rms_eps)
        g = xn @ W[p + "mlp.gate_proj.weight"].T
        u = xn @ W[p + "mlp.up_proj.weight"].T
        x = res + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], rms_eps)
    head = W["model.embed_tokens.weight"] if tied else W["lm_head.weight"]
    logits = x @ head.T
    # HF causal-LM loss: predict token t+1 from positions <= t, mean over b*(s-1).
    shift_logits = logits[:, :-1, :].reshape(-1, V)
    shift_labels = tokens[:, 1:].reshape(-1).long()
    return torch.nn.functional.cross_entropy(shift_logits, shift_labels)


def make(name, out_dir, compute_dtype, seed):
    V, h, i, L, a, k, tied, b, s = CONFIGS[name]
    gen = torch.Generator().manual_seed(seed)
    weights = []
    for pname, shape in param_shapes(V, h, i, L, a, k, tied):
        if len(shape) == 1:  # RMSNorm weights: around 1, not all 1, so their gradients matter
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:  # larger than HF's 0.02 so that attention is far from uniform
            w = 0.2 * torch.randn(shape, generator=gen)
        weights.append((pname, w.to(torch.float32)))
    tokens = torch.randint(0, V, (b, s), generator=gen, dtype=torch.int32)

    W = {n: w.to(compute_dtype).requires_grad_(True) for n, w in weights}
    loss = llama_loss(W, tokens, V, h, i, L, a, k, tied)
    loss.backward()

    # Cross-check: the same in fp32 (printed, so a reader sees the fp32 rounding level).
    W32 = {n: w.clone().requires_grad_(True) for n, w in weights}
    loss32 = llama_loss(W32, tokens, V, h, i, L, a, k, tied)
    loss32.backward()
    worst = max(((W32[n].grad.double() - W[n].grad.double()).abs().max().item()
                 / max(W[n].grad.abs().max().item(), 1e-30)) for n, _ in weights)

    prefix = os.path.join(out_dir, f"golden_{name}")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": V, "hidden_size": h, "intermediate_size": i,
        "num_hidden_layers": L, "num_attention_heads": a, "num_key_value_heads": k,
        "max_position_embeddings": 256, "rms_norm_eps": RMS_EPS, "rope_theta": ROPE_THETA,
        "tie_word_embeddings": tied, "torch_dtype": "float32", "hidden_act": "silu",
    }
    with open(prefix + "_config.json", "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    meta = {"batch": b, "seq": s, "seed": seed, "compute": str(compute_dtype),
            "generator": "tools/make_golden.py"}
    write_safetensors(prefix + "_weights.safetensors", weights, meta)
    with open(prefix + "_tokens.bin", "wb") as f:
        f.write(tokens.numpy().astype("<i4").tobytes())
    expected = [("loss", loss.detach().reshape(1).to(torch.float32))]
    expected += [(n, W[n].grad.to(torch.float32)) for n, _ in weights]
    write_safetensors(prefix + "_expected.safetensors", expected, meta)
    print(f"{name}: loss {loss.item():.8f} (fp32 run {loss32.item():.8f}); "
          f"fp32 vs {compute_dtype} worst gradient error relative to the tensor's max: {worst:.2e}")


# The families' tiny presets (issue 16), as config.json: exactly the shapes the issue fixes.
_TINY = {"vocab_size": 96, "hidden_size": 48, "intermediate_size": 128, "num_hidden_layers": 2,
         "max_position_embeddings": 256, "torch_dtype": "float32", "hidden_act": "silu"}
FAMILIES = {
    # name: (config.json, batch, seq)
    "tiny_mistral": (dict(_TINY, architectures=["MistralForCausalLM"], model_type="mistral",
                          num_attention_heads=6, num_key_value_heads=2, rms_norm_eps=1e-5,
                          rope_theta=1e4, sliding_window=5, tie_word_embeddings=False), 2, 16),
    "tiny_qwen2": (dict(_TINY, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                        num_attention_heads=6, num_key_value_heads=2, rms_norm_eps=1e-6,
                        rope_theta=1e6, use_sliding_window=True, sliding_window=6,
                        max_window_layers=1, tie_word_embeddings=True), 2, 16),
    "tiny_qwen3": (dict(_TINY, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        rms_norm_eps=1e-6, rope_theta=1e6, attention_bias=False,
                        use_sliding_window=False, tie_word_embeddings=False), 2, 16),
    "tiny_llama3": (dict(_TINY, architectures=["LlamaForCausalLM"], model_type="llama",
                         num_attention_heads=6, num_key_value_heads=2, rms_norm_eps=1e-5,
                         rope_theta=5e5, tie_word_embeddings=True,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 16}), 2, 16),
    # Mixture of experts (issue 29): Mixtral's intermediate_size is the experts' width; Mixtral
    # always renormalises its top-k weights, Qwen3-MoE here does not (norm_topk_prob false).
    "tiny_mixtral": (dict(_TINY, architectures=["MixtralForCausalLM"], model_type="mixtral",
                          intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                          num_local_experts=4, num_experts_per_tok=2, output_router_logits=False,
                          router_jitter_noise=0.0, sliding_window=None, rms_norm_eps=1e-5,
                          rope_theta=1e6, tie_word_embeddings=False), 2, 16),
    "tiny_qwen3_moe": (dict(_TINY, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                            intermediate_size=128, moe_intermediate_size=32,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=6, num_experts_per_tok=2, norm_topk_prob=False,
                            decoder_sparse_step=1, mlp_only_layers=[],
                            output_router_logits=False, use_sliding_window=False,
                            rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False), 2, 16),
    # Qwen2-MoE: Qwen2's attention (q/k/v biases: Qwen2MoeConfig.qkv_bias defaults to true and is
    # left out, as the released configs do) and, in every MoE block, a shared expert (a dense
    # SwiGLU of width shared_expert_intermediate_size) scaled by sigmoid(shared_expert_gate(x)).
    "tiny_qwen2_moe": (dict(_TINY, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
                            intermediate_size=128, moe_intermediate_size=32,
                            shared_expert_intermediate_size=40,
                            num_attention_heads=4, num_key_value_heads=2,
                            num_experts=6, num_experts_per_tok=2, norm_topk_prob=False,
                            decoder_sparse_step=1, mlp_only_layers=[],
                            output_router_logits=False, use_sliding_window=False,
                            rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False), 2, 16),
}
# Mixtral with the router's load-balancing loss in the loss: tiny_mixtral's config (same keys, same
# sizes, so the same weights and tokens for the same seed) but output_router_logits true and a
# router_aux_loss_coef of 0.5 (the default 0.001 would barely move the gradients): the model's
# loss is then cross-entropy + 0.5 · aux_loss (MixtralForCausalLM.forward).
FAMILIES["tiny_mixtral_aux"] = (dict(FAMILIES["tiny_mixtral"][0], output_router_logits=True,
                                     router_aux_loss_coef=0.5), 2, 16)
# Qwen2-MoE with a dense layer among its MoE ones (mlp_only_layers [1] of 3 layers: Qwen2MoeMLP
# of width intermediate_size 128 there) and the load-balancing loss over the two MoE layers only
# (coef 0.5): load_balancing_loss_func concatenates the routers' logits, and a dense layer has
# no router.
FAMILIES["tiny_qwen2_moe_mixed"] = (dict(FAMILIES["tiny_qwen2_moe"][0], num_hidden_layers=3,
                                         mlp_only_layers=[1], output_router_logits=True,
                                         router_aux_loss_coef=0.5), 2, 16)
# Every routing decision of the MoE goldens must be robust (trainmem routes in fp32 itself): for
# every token of every layer, prob[k-th] - prob[(k+1)-th] > ROUTING_MIN_GAP, the top-k
# probabilities distinct by > ROUTING_MIN_SEPARATION, and every expert given a token; otherwise
# make_family draws new weights with the next seed. The router weights are drawn as the other
# matrices (0.2·N(0, 1)): over seeds 1234-1263 that scale gave the largest median of the minimum
# gap among 0.05-0.5 (smaller: near-uniform probabilities; larger: peaked, with tiny k-th and
# (k+1)-th probabilities).
ROUTING_MIN_GAP = 1e-3
ROUTING_MIN_SEPARATION = 1e-6


def expected_inv_freq(cfg):
    """RoPE inverse frequencies from the config alone (HF's default and llama3 rules)."""
    d = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    r = cfg.get("rope_scaling")
    if not r:
        return inv
    assert r["rope_type"] == "llama3"
    low_wl = r["original_max_position_embeddings"] / r["low_freq_factor"]
    high_wl = r["original_max_position_embeddings"] / r["high_freq_factor"]
    out = []
    for f in inv.tolist():
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(f)
        elif wl > low_wl:
            out.append(f / r["factor"])
        else:
            smooth = ((r["original_max_position_embeddings"] / wl - r["low_freq_factor"]) /
                      (r["high_freq_factor"] - r["low_freq_factor"]))
            out.append((1 - smooth) * f / r["factor"] + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def moe_blocks(model):
    """(layer index, MoE block) of every layer whose MLP is a mixture of experts."""
    return [(l, layer.mlp) for l, layer in enumerate(model.model.layers)
            if hasattr(layer.mlp, "experts")]


def moe_reference(block, x, k, normalise):
    """The MoE block's output by hand, in float64, from its input x (T, h): softmax router, top-k
    (renormalised when `normalise`), and per chosen expert e: down_e(silu(g) * u) with g the first
    m rows of gate_up_proj[e] times x and u the last m rows, weighted and summed; plus, where the
    block has a shared expert (Qwen2-MoE), sigmoid(x·W_sgᵀ) · down_s(silu(gate_s x) * up_s x).
    Returns (output (T, h), the shared expert's sigmoid gate values (T,) or None)."""
    with torch.no_grad():
        x = x.double()
        probs = torch.softmax(x @ block.gate.weight.double().T, dim=-1)
        top, idx = probs.topk(k, dim=-1)
        if normalise:
            top = top / top.sum(-1, keepdim=True)
        gate_up = block.experts.gate_up_proj.double()
        down = block.experts.down_proj.double()
        m = down.shape[-1]
        y = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(k):
                e = idx[t, j]
                g, u = gate_up[e, :m] @ x[t], gate_up[e, m:] @ x[t]
                y[t] += top[t, j] * (down[e] @ (torch.nn.functional.silu(g) * u))
        sig = None
        if hasattr(block, "shared_expert"):
            se = block.shared_expert
            gs = x @ se.gate_proj.weight.double().T
            us = x @ se.up_proj.weight.double().T
            shared = (torch.nn.functional.silu(gs) * us) @ se.down_proj.weight.double().T
            sig = torch.sigmoid(x @ block.shared_expert_gate.weight.double().T)  # (T, 1)
            y += sig * shared
            sig = sig.reshape(-1)
        return y, sig


def check_routing(cfg, model, seen):
    """The routing of the forward just run (seen: layer -> router output and block input/output).
    Returns (None, facts) when every decision is robust, else (why, facts)."""
    k = cfg["num_experts_per_tok"]
    E = cfg.get("num_local_experts", cfg.get("num_experts"))
    normalise = cfg["model_type"] == "mixtral" or bool(cfg.get("norm_topk_prob"))
    facts = {"min_gap": math.inf, "min_separation": math.inf, "counts": {}, "sigmoid": {}}
    why = None
    for l, block in moe_blocks(model):
        logits, scores, idx = seen[("router", l)]
        x, out = seen[("block", l)]
        probs = torch.softmax(logits.float(), dim=-1)  # both routers: softmax of fp32 logits
        srt = probs.sort(dim=-1, descending=True).values
        gap = (srt[:, k - 1] - srt[:, k]).min().item()
        sep = (srt[:, :k - 1] - srt[:, 1:k]).min().item() if k > 1 else math.inf
        counts = torch.bincount(idx.reshape(-1), minlength=E)
        facts["min_gap"] = min(facts["min_gap"], gap)
        facts["min_separation"] = min(facts["min_separation"], sep)
        facts["counts"][l] = counts.tolist()
        if why is None and gap <= ROUTING_MIN_GAP:
            why = f"layer {l}: k-th minus (k+1)-th router probability {gap:.3g}"
        elif why is None and sep <= ROUTING_MIN_SEPARATION:
            why = f"layer {l}: two top-k router probabilities {sep:.3g} apart"
        elif why is None and counts.min().item() == 0:
            why = f"layer {l}: an expert gets no token ({counts.tolist()})"
        if why is None:
            # HF's choice is the top-k of those probabilities, its weights the (renormalised)
            # top-k values, and the block's output the float64 computation by hand.
            top, want = probs.topk(k, dim=-1)
            assert torch.equal(idx.sort(-1).values, want.sort(-1).values), (l, idx, want)
            if normalise:
                top = top / top.sum(-1, keepdim=True)
            assert torch.allclose(scores.float(), top, rtol=1e-6, atol=1e-7), (l, scores, top)
            ref, sig = moe_reference(block, x, k, normalise)
            err = (out.double() - ref).abs().max().item() / ref.abs().max().item()
            assert err < 1e-5, (l, err)
            if sig is not None:  # the shared expert's gate: (min, max) of its sigmoid values
                facts["sigmoid"][l] = (sig.min().item(), sig.max().item())
                # spread, not all ~0.5, so that a gate left out or applied wrongly shows
                assert sig.max().item() - sig.min().item() > 0.3, (l, facts["sigmoid"][l])
    return why, facts


def aux_loss_reference(cfg, router_logits):
    """The Switch-Transformer load-balancing loss by hand, in float64, from every layer's router
    logits ((T, E) each): per token the softmax over its E logits and the one-hot (k, E) of its
    top-k experts; tokens_per_expert = mean over all layers' tokens of the one-hot (k, E),
    router_prob_per_expert = mean over all layers' tokens of the softmax (E);
    aux = E · sum(tokens_per_expert · router_prob_per_expert). Returns (aux, top-k indices per
    layer)."""
    E, k = cfg.get("num_local_experts", cfg.get("num_experts")), cfg["num_experts_per_tok"]
    with torch.no_grad():
        probs = [torch.softmax(g.double(), dim=-1) for g in router_logits]
        idx = [p.topk(k, dim=-1).indices for p in probs]
        one_hot = torch.cat([torch.nn.functional.one_hot(i, E) for i in idx]).double()  # (LT, k, E)
        tokens_per_expert = one_hot.mean(0)  # (k, E)
        router_prob_per_expert = torch.cat(probs).mean(0)  # (E,)
        aux = E * (tokens_per_expert * router_prob_per_expert.unsqueeze(0)).sum()
    return aux.item(), idx


def make_family(name, out_dir, seed):
    import transformers
    cfg, b, s = FAMILIES[name]
    Config = getattr(transformers, cfg["architectures"][0].replace("ForCausalLM", "Config"))
    Model = getattr(transformers, cfg["architectures"][0])
    moe = "num_experts_per_tok" in cfg
    impl = dict(attn_implementation="eager")
    if moe:
        # The experts' per-expert loop (MixtralExperts.forward / Qwen3MoeExperts.forward), not
        # transformers 5.x's default "grouped_mm": `experts_implementation` in the config's
        # kwargs sets config._experts_implementation, which the @use_experts_implementation
        # wrapper reads on each call ("eager" is no registered function: the class's own forward).
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
        impl["experts_implementation"] = "eager"
        assert ALL_EXPERTS_FUNCTIONS.get_interface("eager", make_family) is make_family
    rejected = []
    while True:  # dense families: once; MoE: until every routing decision is robust
        # A deep copy: from_dict() writes into nested dicts (rope_scaling gains rope_theta).
        hf_cfg = Config.from_dict(copy.deepcopy(dict(cfg, **impl)))
        torch.manual_seed(seed)
        model = Model(hf_cfg).to(torch.float32)
        model.train()
        inv = model.model.rotary_emb.inv_freq.double()
        want = expected_inv_freq(cfg)
        assert torch.allclose(inv, want, rtol=1e-6, atol=0), (name, inv, want)
        if cfg.get("sliding_window") and cfg["model_type"] != "mistral":
            kinds = ["sliding_attention" if l >= cfg["max_window_layers"] else "full_attention"
                     for l in range(cfg["num_hidden_layers"])]
            assert list(hf_cfg.layer_types) == kinds, (hf_cfg.layer_types, kinds)

        gen = torch.Generator().manual_seed(seed)
        weights = []
        with torch.no_grad():
            for pname, p in model.named_parameters():  # tied: lm_head is embed_tokens, listed once
                if pname.endswith("norm.weight"):  # RMSNorm weights (q_norm/k_norm too): around 1
                    w = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
                elif pname.endswith(".bias"):  # biases large enough that a missing one shows
                    w = 0.3 * torch.randn(p.shape, generator=gen)
                else:  # matrices, the MoE routers (mlp.gate.weight) and 3-D experts included
                    w = 0.2 * torch.randn(p.shape, generator=gen)
                p.copy_(w)
                weights.append((pname, w.to(torch.float32)))
        tokens = torch.randint(0, cfg["vocab_size"], (b, s), generator=gen, dtype=torch.int32)
        ids = tokens.long()
        model.zero_grad()
        seen, hooks = {}, []
        if moe:
            assert model.config._experts_implementation == "eager", model.config._experts_implementation
            blocks = moe_blocks(model)
            # every layer MoE, but Qwen's mlp_only_layers (tiny_qwen2_moe_mixed)
            dense = cfg.get("mlp_only_layers", [])
            assert [l for l, _ in blocks] == [l for l in range(cfg["num_hidden_layers"])
                                              if l not in dense], name
            for l, block in blocks:
                hooks.append(block.gate.register_forward_hook(
                    lambda mod, inp, out, l=l: seen.__setitem__(
                        ("router", l), tuple(t.detach().clone() for t in out))))
                hooks.append(block.register_forward_hook(
                    lambda mod, inp, out, l=l: seen.__setitem__(
                        ("block", l), (inp[0].detach().reshape(-1, inp[0].shape[-1]).clone(),
                                       out.detach().reshape(-1, out.shape[-1]).clone()))))
        out = model(input_ids=ids, labels=ids, use_cache=False)
        loss = out.loss
        for hk in hooks:
            hk.remove()
        if not moe:
            break
        why, routing = check_routing(cfg, model, seen)
        if why is None:
            break
        print(f"{name}: seed {seed} rejected ({why}); next seed")
        rejected.append(seed)
        seed += 1
    ce = loss  # the cross-entropy part: all of the loss unless the aux loss is in it
    aux = None
    if cfg.get("output_router_logits"):
        # MixtralForCausalLM.forward: loss = loss_function(logits, labels) and then, with
        # output_router_logits, loss += router_aux_loss_coef * load_balancing_loss_func(
        # router_logits, E, k, attention_mask=None).
        coef = cfg["router_aux_loss_coef"]
        assert model.router_aux_loss_coef == coef and hf_cfg.output_router_logits is True
        blocks = moe_blocks(model)
        rl = out.router_logits
        assert isinstance(rl, tuple) and len(rl) == len(blocks), type(rl)
        # the recorded logits are the routers' own (T, E) outputs, one per MoE layer in order (a
        # dense layer records none)
        for j, (l, _) in enumerate(blocks):
            assert torch.equal(rl[j].detach(), seen[("router", l)][0]), l
        ce = model.loss_function(out.logits, ids, cfg["vocab_size"]).detach()
        hf_aux = out.aux_loss.detach()
        assert torch.equal(loss.detach(), ce + coef * hf_aux), (loss.item(), ce.item(), hf_aux.item())
        mine, idx = aux_loss_reference(cfg, [g.detach() for g in rl])
        for j, (l, _) in enumerate(blocks):  # the top-k of the float64 softmax: the routers' choice
            assert torch.equal(idx[j].sort(-1).values, seen[("router", l)][2].sort(-1).values), l
        rel = abs(hf_aux.item() - mine) / abs(mine)
        assert rel <= 1e-6, (hf_aux.item(), mine, rel)
        # The aux loss's share of each router's gradient (d aux / d W_router, before backward).
        routers = [block.gate.weight for _, block in blocks]
        aux_grads = torch.autograd.grad(out.aux_loss, routers, retain_graph=True)
        aux = {"coef": coef, "hf": hf_aux.item(), "fp64": mine, "rel": rel, "ce": ce.item()}
    loss.backward()
    grads = dict(model.named_parameters())
    if aux is not None:
        # ||coef · d aux/dW|| / ||d ce/dW|| per router: the aux loss must visibly move the gradient
        aux["router_grad_ratio"] = {}
        for (l, _), w, ga in zip(moe_blocks(model), routers, aux_grads):
            g_ce = w.grad - coef * ga
            ratio = (coef * ga).norm().item() / g_ce.norm().item()
            assert ratio > 0.05, (l, ratio)
            aux["router_grad_ratio"][l] = ratio
    # The loss by hand from the logits (the shifted mean), a check of the HF loss's reduction.
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
        ref = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, cfg["vocab_size"]),
                                                ids[:, 1:].reshape(-1))
    assert abs(ref.item() - ce.item()) <= 1e-6 * abs(ref.item()), (ref.item(), ce.item())
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    if cfg.get("sliding_window"):
        # The window must matter at this s: the same weights without it give another loss.
        full = copy.deepcopy(dict(cfg, attn_implementation="eager"))
        full["sliding_window"] = None
        full["use_sliding_window"] = False
        other = Model(Config.from_dict(full)).to(torch.float32)
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            no_window = other(input_ids=ids, labels=ids, use_cache=False).loss.item()
        assert abs(no_window - loss.item()) > 1e-4, (name, no_window, loss.item())
        print(f"{name}: without the window the loss would be {no_window:.8f}")

    prefix = os.path.join(out_dir, f"golden_{name}")
    with open(prefix + "_config.json", "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    meta = {"batch": b, "seq": s, "seed": seed, "compute": "torch.float32",
            "generator": "tools/make_golden.py --families",
            "reference": f"transformers {transformers.__version__} "
                         f"{cfg['architectures'][0]}, eager attention, PyTorch {torch.__version__}"}
    if moe:
        meta["reference"] += ", eager experts"
        meta.update({
            "transformers": transformers.__version__, "torch": torch.__version__,
            "experts_implementation": model.config._experts_implementation,
            "seeds_rejected": ",".join(map(str, rejected)) or "none",
            # min over every token and MoE layer of prob[k-th] - prob[(k+1)-th] (fp32 softmax),
            # and of the gaps between the top-k probabilities themselves
            "min_routing_gap": f"{routing['min_gap']:.6g}",
            "min_topk_separation": f"{routing['min_separation']:.6g}"})
        for l, counts in routing["counts"].items():  # tokens routed to expert 0, 1, ... in layer l
            meta[f"routing_l{l}"] = ",".join(map(str, counts))
        for l, (lo, hi) in routing["sigmoid"].items():  # shared expert's gate: min,max sigmoid
            meta[f"shared_gate_sigmoid_l{l}"] = f"{lo:.6g},{hi:.6g}"
    if aux is not None:  # loss = ce_loss + router_aux_loss_coef * aux_loss
        meta.update({
            "output_router_logits": "true", "router_aux_loss_coef": repr(aux["coef"]),
            "aux_loss": f"{aux['hf']:.9g}", "ce_loss": f"{aux['ce']:.9g}",
            # the aux loss recomputed by hand in float64 from the router logits (1e-6 relative)
            "aux_loss_fp64": f"{aux['fp64']:.12g}"})
        for l, r in aux["router_grad_ratio"].items():  # ||coef·d aux/dW_router|| / ||d ce/dW_router||
            meta[f"router_grad_aux_ratio_l{l}"] = f"{r:.4g}"
    write_safetensors(prefix + "_weights.safetensors", weights, meta)
    with open(prefix + "_tokens.bin", "wb") as f:
        f.write(tokens.numpy().astype("<i4").tobytes())
    expected = [("loss", loss.detach().reshape(1).to(torch.float32))]
    for n, _ in weights:
        g = grads[n].grad
        assert g is not None and g.abs().max().item() > 0, f"{name}: {n} has no gradient"
        if n.endswith(("experts.gate_up_proj", "experts.down_proj")):  # every expert's slice
            assert all(g[e].abs().max().item() > 0 for e in range(g.shape[0])), n
        expected.append((n, g.to(torch.float32)))
    write_safetensors(prefix + "_expected.safetensors", expected, meta)
    print(f"{name}: loss {loss.item():.8f} ({len(weights)} parameters; "
          f"{cfg['architectures'][0]} of transformers {transformers.__version__})")
    if moe:
        print(f"{name}: seed {seed} (rejected: {meta['seeds_rejected']}), min routing gap "
              f"{meta['min_routing_gap']}, min top-k separation {meta['min_topk_separation']}, "
              + "; ".join(f"routing_l{l} {meta[f'routing_l{l}']}" for l in routing["counts"]))
        if aux is not None:
            print(f"{name}: loss {loss.item():.8f} = ce_loss {aux['ce']:.8f} + "
                  f"{aux['coef']} * aux_loss {aux['hf']:.9f} (float64 by hand {aux['fp64']:.12f}, "
                  f"relative difference {aux['rel']:.2e}); router gradient "
                  "||coef·d aux|| / ||d ce||: "
                  + "; ".join(f"l{l} {r:.4g}" for l, r in aux["router_grad_ratio"].items()))
        if routing["sigmoid"]:
            print(f"{name}: shared expert gate sigmoid range (min,max) "
                  + "; ".join(f"l{l} {meta[f'shared_gate_sigmoid_l{l}']}"
                              for l in routing["sigmoid"]))
        for n, w in weights:
            if ".mlp." in n:
                print(f"  {n} {list(w.shape)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
    ap.add_argument("--compute", choices=["fp64", "fp32"], default="fp64")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--families", action="store_true",
                    help="the families' goldens from the real transformers classes (FAMILIES)")
    ap.add_argument("--transformers", metavar="DIR",
                    help="folder holding a transformers release, put first on sys.path")
    ap.add_argument("--only", metavar="NAME", action="append",
                    help="with --families: make only these (repeat or comma-separate), e.g. "
                         "--only tiny_mixtral,tiny_qwen3_moe; the others' files are not touched")
    args = ap.parse_args()
    only = [n for o in (args.only or []) for n in o.split(",") if n]
    if only and not args.families:
        ap.error("--only goes with --families")
    for n in only:
        if n not in FAMILIES:
            ap.error(f"--only {n}: not a family ({', '.join(FAMILIES)})")
    os.makedirs(args.out, exist_ok=True)
    if args.families:
        for name in FAMILIES:
            if not only or name in only:
                make_family(name, args.out, args.seed)
        return
    dtype = torch.float64 if args.compute == "fp64" else torch.float32
    for name in CONFIGS:
        make(name, args.out, dtype, args.seed)


if __name__ == "__main__":
    main()
