#!/usr/bin/env python3
"""Per-rank parameter, master, gradient and AdamW-state storage of DeepSpeed ZeRO-3, measured.

This is the measurement groundwork for modelling DeepSpeed ZeRO stage 3 (no offload) byte-exactly,
next to tools/fsdp2_states.py for FSDP2: it runs real DeepSpeed ZeRO-3 on the CPU (DeepSpeed's
"cpu" accelerator, gloo backend) with N processes, one rank each, does two training steps and then
records what every rank holds, tensor by tensor, as storage:

  - every parameter: name, global shape (`p.ds_shape`), numel (`p.ds_numel`), the numel, dtype and
    storage bytes of its partition `p.ds_tensor`, the partition's offset (in elements) into the
    storage it lives in, how many real elements and how many padding elements this rank holds,
    and the parameter's total padding `ds_tensor.numel() * N - numel`;
  - the parameter partitions' totals: sum of numel x element size, and the bytes of the distinct
    storages behind them (one: ZeRO-3 moves every partition into the flat `lp_param_buffer`);
  - the fp32 master partitions `optimizer.fp32_partitioned_groups_flat` (numel, bytes, and whether
    they share storage with the parameter partitions), and that their `.grad` is freed after step;
  - the AdamW states held by the wrapped `torch.optim.AdamW` (`exp_avg`, `exp_avg_sq`, `step`),
    per state tensor and in total;
  - the gradient partitions `optimizer.grad_partitions_flat_buffer` (numel, dtype, bytes; every
    parameter's gradient partition is a view of it at the parameter's offset);
  - the reduce ("IPG") bucket `optimizer.ipg_buckets[dtype].buffer` (numel, dtype, bytes);
  - every other tensor the process still holds after the steps, found by a gc sweep over all live
    tensors, attributed by storage to the categories above or named here:
      inf_or_nan_tracker  torch.zeros(1, bool)                       stage3.py:335
      _global_grad_norm   fp64 scalar (get_norm_dtype(), zero/utils.py:59-63, used at
                          stage3.py:2457), kept by the optimizer (stage3.py:2897) and the engine
                          (engine.py:3518-3519)
      module buffers      LlamaRotaryEmbedding's inv_freq and original_inv_freq (transformers', not
                          DeepSpeed's): ZeRO-3 partitions parameters only, and in bf16 mode it
                          casts parameters only, buffers stay fp32 (engine.py:2084-2088)
    anything else lands in `unattributed_tensors` (empty in every golden). The sweep sees tensors
    reachable from Python objects; tensors only C++ holds (autograd graph, gloo) it cannot see.
Totals are given as "bytes" (numel x element size of the tensors of a category) and, for the
rank, as the bytes of all distinct storages counted once ("distinct_storage_bytes").

The model: transformers' LlamaForCausalLM built from a LlamaConfig (no download, seed 0), 3 decoder
layers, 4 heads, 2 KV heads (head_dim 32), untied embeddings, eager attention, shapes:
  even  hidden 128, intermediate 352, vocabulary 1000;
  odd   hidden 128, intermediate 353, vocabulary 1001.
Every numel is a multiple of hidden 128, so in both shapes N = 2 and 4 divide every parameter
(no padding) and only N = 3 pads (36 elements in all for "even", 47 for "odd").
It is built in fp32; DeepSpeed casts the parameters to bf16 itself when "bf16": {"enabled": true}
(and keeps fp32 master partitions); "fp32" is the same config with bf16 disabled.
The recipe: torch.optim.AdamW(model.parameters(), lr=1e-3) as client optimizer,
deepspeed.initialize(model=model, optimizer=opt, config=DS_CONFIG) with
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0 (every parameter is
  partitioned), "reduce_bucket_size": 200000 (the default 5e8 would allocate a 1 GB bucket per
  rank)}, everything else at DeepSpeed's defaults (the resolved values are recorded per file,
  "zero_resolved": prefetch bucket 5e7, max live parameters 1e9, max reuse distance 1e9,
  sub_group_size 1e9, contiguous_gradients, overlap_comm, reduce_scatter), train_micro_batch 2,
  "zero_allow_untested_optimizer": true, "zero_force_ds_cpu_optimizer": false.
Two steps: random token ids (batch 2, sequence 16, seed 1000 + rank), labels = ids,
loss = engine(input_ids=ids, labels=ids).loss; engine.backward(loss); engine.step().
N = 2, 3 and 4; one torch.multiprocessing.spawn per configuration (DeepSpeed keeps global state).

How to run (DeepSpeed, torch and transformers importable; no GPU, no network):
    DS_ACCELERATOR=cpu PYTHONPATH=/tmp/dspy /tmp/venv-torch/bin/python \\
        tools/deepspeed_zero3_states.py --write tests/data/deepspeed_zero3
        runs all 12 configurations (9-20 s each on two cores, about 3 minutes in all), writes
        tests/data/deepspeed_zero3/llama-<even|odd>-<bf16|fp32>-np<N>.json, then runs the check;
    ... tools/deepspeed_zero3_states.py --nprocs 2 --shapes odd --dtypes bf16
        the same for a subset, printing only (no --write);
    python3 tools/deepspeed_zero3_states.py --check tests/data/deepspeed_zero3
        no torch or DeepSpeed needed: re-reads the JSON files and prints, for every configuration
        and rank, the closed form next to the measured totals; exit status 1 on any mismatch.
(The script sets DS_ACCELERATOR=cpu itself in the workers.)

The closed form, per rank k of N, for parameters i of numel n_i in model order, model element
size e (2 for bf16, 4 for fp32), reduce_bucket_size R (file:line are DeepSpeed 0.19.8,
deepspeed/runtime/...):
    P_i  = ceil(n_i / N)                  partition numel, the same on every rank:
           _aligned_size = n + _padding_size, _padding_size = (N - n % N) if n % N else 0
           (zero/partition_parameters.py:1690-1696), partition_size = aligned // N (:1816-1817),
           ds_tensor = torch.empty(partition_size, dtype=param.dtype) (:1836, :1846-1850).
           No other alignment: ZeRO-3 pads each parameter to a multiple of N only (unlike
           stage 1/2's nccl_start_alignment_factor); the flat groups below add none.
    pad_i = N * P_i - n_i (< N)           per-parameter padding, all of it at the end of the
           flat parameter; rank k holds real_i(k) = max(0, min(P_i, n_i - k*P_i)) real elements
           and P_i - real_i(k) padding (for these shapes only the last rank pads; DeepSpeed's
           groups_padding makes the same assumption, zero/stage3.py:962-964).
    S    = sum_i P_i                      one sub-group (sub_group_size 1e9 >= S,
           zero/stage3.py:1210-1216; zero/config.py:182), so one flat group of S elements:
           fp16_partitioned_groups_flat_numel (stage3.py:957).
    params      e * S   one storage: lp_param_buffer = defragment(all ds_tensors)
                        (stage3.py:972, zero/utils.py:215-243); every ds_tensor is a view of it at
                        offset sum_{j<i} P_j, fp16_partitioned_groups_flat[0] a view of all of it
                        (stage3.py:1292-1299); the step keeps the views (stage3.py:2854-2862).
    fp32 master 4 * S   fp32_partitioned_groups_flat[0] (master dtype fp32, base_optimizer.py:
                        523-528), a separate storage in BOTH modes: .to(device, fp32).clone()
                        (stage3.py:1169-1172). In fp32 mode DeepSpeed means to alias the
                        parameter partitions instead (stage3.py:1162-1167: "we don't need another
                        copy of the weights") when the flat group already has the master dtype
                        and `flat.device == self.device`; but self.device is a str
                        (current_device_name(), stage3.py:333: 'cpu' here, deepspeed/
                        accelerator/cpu_accelerator.py:67-68; 'cuda:N' on GPUs,
                        deepspeed/accelerator/cuda_accelerator.py:82-83)
                        and torch.device.__eq__(str) is NotImplemented, so the test is False and
                        the .to() (a no-op for fp32) is followed by .clone(): fp32 training keeps
                        two fp32 copies of each partition (measured: shares_storage_with_params
                        false, extra_storage_bytes 4*S in every file).
    exp_avg     4 * S   AdamW state of the one fp32 flat tensor (torch/optim/adam.py), fp32
    exp_avg_sq  4 * S
    step        4       one fp32 CPU scalar (torch/optim/adam.py:176, _get_scalar_dtype
                        optimizer.py:221-226)
    grads       e * S   grad_partitions_flat_buffer = torch.zeros(sum partition_numel,
                        dtype=gradient_accumulation_dtype) (stage3.py:791-793); that dtype is
                        the model dtype unless "data_types.grad_accum_dtype" is set
                        (engine.py:1799-1810); per-parameter views at the same offsets
                        (stage3.py:797-800). The fp32 gradient the step builds
                        (flatten(...).to(fp32), stage3.py:2686-2693) is freed by
                        _release_sub_group (stage3.py:2735).
    bucket      e * R   one IPG bucket per communication dtype (= model dtype, engine.py:
                        1719-1730; stage3.py:470-477), torch.empty(reduce_bucket_size)
                        (stage3.py:781-784), allocated at init whatever the model size.
    other       1 + 8   inf_or_nan_tracker (bool, stage3.py:335), _global_grad_norm (fp64
                        scalar, stage3.py:2897)
    buffers     2 * 4 * head_dim/2   rotary inv_freq + original_inv_freq, fp32, not partitioned
    distinct storage per rank = e*S + 4*S + 8*S + 4 + e*S + e*R + 9 + buffers
                (16*S + 2*R + 141 in bf16, 20*S + 4*R + 141 in fp32, with 128 buffer bytes).
Every rank holds the same bytes; ranks differ only in which elements are real and which are
padding (and in the data, hence the losses).

Measured with DeepSpeed 0.19.8, PyTorch 2.15.0 (CPU), transformers 5.25.0, Python 3.11, on
2026-12-07.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import time

SHAPES = {
    "even": dict(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                 num_key_value_heads=2, num_hidden_layers=3, vocab_size=1000),
    "odd": dict(hidden_size=128, intermediate_size=353, num_attention_heads=4,
                num_key_value_heads=2, num_hidden_layers=3, vocab_size=1001),
}
DTYPE_NAMES = ("bf16", "fp32")
ELEMENT_SIZE = {"fp32": 4, "bf16": 2}
TORCH_DTYPE_NAME = {"fp32": "float32", "bf16": "bfloat16"}
BATCH, SEQ, STEPS = 2, 16, 2
REDUCE_BUCKET_SIZE = 200000   # elements; DeepSpeed's default 5e8 allocates 1 GB (fp16/bf16)
MEASURED = "2026-12-07"
FP32 = 4
STEP_BYTES = 4                # AdamW's `step`: torch.tensor(0.0, dtype=float32) on the CPU
GRAD_NORM_BYTES = 8           # _global_grad_norm: fp64 scalar
INF_NAN_TRACKER_BYTES = 1     # torch.zeros(1, dtype=torch.bool)

# Where the "other" tensors come from (DeepSpeed 0.19.8, deepspeed/runtime/...).
OTHER_SOURCES = {
    "inf_or_nan_tracker": "zero/stage3.py:335",
    "_global_grad_norm": "zero/stage3.py:2897",
}


def ds_config(dtype_name: str) -> dict:
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "reduce_bucket_size": REDUCE_BUCKET_SIZE,
        },
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": dtype_name == "bf16"},
        "steps_per_print": 1000000,
    }


# ----------------------------------------------------------------------------------------------
# The closed form (pure Python: no torch needed)
# ----------------------------------------------------------------------------------------------

def llama_param_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, global shape) of every parameter of LlamaForCausalLM, untied, no biases, in
    model.named_parameters() order (which is also the order of the flat partitions)."""
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    inter = cfg["intermediate_size"]
    vocab = cfg["vocab_size"]
    out = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(cfg["num_hidden_layers"]):
        g = f"model.layers.{i}"
        out += [
            (f"{g}.self_attn.q_proj.weight", (heads * hd, h)),
            (f"{g}.self_attn.k_proj.weight", (kv * hd, h)),
            (f"{g}.self_attn.v_proj.weight", (kv * hd, h)),
            (f"{g}.self_attn.o_proj.weight", (h, heads * hd)),
            (f"{g}.mlp.gate_proj.weight", (inter, h)),
            (f"{g}.mlp.up_proj.weight", (inter, h)),
            (f"{g}.mlp.down_proj.weight", (h, inter)),
            (f"{g}.input_layernorm.weight", (h,)),
            (f"{g}.post_attention_layernorm.weight", (h,)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return out


def partition_numel(numel: int, n: int) -> int:
    """ds_tensor numel: (numel + padding) // N = ceil(numel / N)."""
    return -(-numel // n)


def real_numel(numel: int, n: int, k: int) -> int:
    """Elements of the parameter rank k really holds (the rest of its partition is padding)."""
    p = partition_numel(numel, n)
    return max(0, min(p, numel - k * p))


def formula_params(cfg: dict, dtype_name: str, n: int, k: int) -> list[dict]:
    """Per-parameter closed form for rank k, in model order."""
    e = ELEMENT_SIZE[dtype_name]
    shapes = llama_param_shapes(cfg)
    flat = sum(partition_numel(math.prod(s), n) for _, s in shapes)
    out, offset = [], 0
    for name, shape in shapes:
        numel = math.prod(shape)
        p = partition_numel(numel, n)
        r = real_numel(numel, n, k)
        out.append({"name": name, "shape": list(shape), "numel": numel, "ds_numel": p,
                    "dtype": TORCH_DTYPE_NAME[dtype_name], "storage_nbytes": e * flat,
                    "offset": offset, "real": r, "pad_here": p - r, "pad_total": p * n - numel})
        offset += p
    return out


def formula(cfg: dict, dtype_name: str, n: int, k: int, reduce_bucket: int) -> dict:
    """Per-rank totals in bytes (and numels), from the closed form."""
    e = ELEMENT_SIZE[dtype_name]
    params = formula_params(cfg, dtype_name, n, k)
    s = sum(p["ds_numel"] for p in params)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    buffers = 2 * FP32 * (hd // 2)
    master_extra = FP32 * s   # a separate copy in fp32 mode too (see the docstring)
    states = 2 * FP32 * s + STEP_BYTES
    other = INF_NAN_TRACKER_BYTES + GRAD_NORM_BYTES
    return {
        "flat_numel": s,
        "params": e * s,
        "params_storage": e * s,
        "pad_total": sum(p["pad_total"] for p in params),
        "pad_here": sum(p["pad_here"] for p in params),
        "master": FP32 * s,
        "master_extra": master_extra,
        "exp_avg": FP32 * s,
        "exp_avg_sq": FP32 * s,
        "step": STEP_BYTES,
        "states": states,
        "grads": e * s,
        "bucket": e * reduce_bucket,
        "other": other,
        "buffers": buffers,
        "distinct": e * s + master_extra + states + e * s + e * reduce_bucket + other + buffers,
    }


def measured_totals(rank_rec: dict) -> dict:
    t = rank_rec["totals"]
    return {
        "flat_numel": t["fp32_master"]["numel"],
        "params": t["params"]["bytes"],
        "params_storage": t["params"]["storage_bytes"],
        "pad_total": t["padding"]["total_numel"],
        "pad_here": t["padding"]["on_this_rank_numel"],
        "master": t["fp32_master"]["bytes"],
        "master_extra": t["fp32_master"]["extra_storage_bytes"],
        "exp_avg": t["exp_avg"]["bytes"],
        "exp_avg_sq": t["exp_avg_sq"]["bytes"],
        "step": t["step"]["bytes"],
        "states": t["optimizer_states"]["bytes"],
        "grads": t["grad_partitions"]["bytes"],
        "bucket": t["reduce_bucket"]["bytes"],
        "other": sum(o["bytes"] for o in t["other"]),
        "buffers": t["module_buffers"]["bytes"],
        "distinct": t["distinct_storage_bytes"],
    }


KEYS = ["flat_numel", "params", "params_storage", "pad_total", "pad_here", "master",
        "master_extra", "exp_avg", "exp_avg_sq", "step", "states", "grads", "bucket", "other",
        "buffers", "distinct"]
SHORT = ["S", "P", "P.stor", "pad", "pad.k", "master", "m.extra", "exp_avg", "exp_avg_sq",
         "step", "states", "grads", "bucket", "other", "buf", "distinct"]


def check_records(records: list[dict]) -> bool:
    """Prints closed form vs measured for every configuration and rank; True when all match.
    Also checks every parameter, the dtypes, the sharing/aliasing facts and that nothing is
    unattributed."""
    ok = True
    widths = [7, 8, 8, 4, 5, 8, 8, 8, 10, 4, 8, 8, 7, 5, 4, 9]
    print("bytes per rank (S, pad, pad.k: elements); a cell is the measured value when it equals "
          "the closed form, else measured!=closed form")
    print(f"{'configuration':<22} rank " + " ".join(f"{s:>{w}}" for s, w in zip(SHORT, widths)))
    for rec in records:
        cfg, n, dt = rec["config"]["llama"], rec["nprocs"], rec["config"]["dtype"]
        bucket = rec["config"]["zero_resolved"]["reduce_bucket_size"]
        e_name = TORCH_DTYPE_NAME[dt]
        for rank_rec in rec["ranks"]:
            k = rank_rec["rank"]
            f, m = formula(cfg, dt, n, k, bucket), measured_totals(rank_rec)
            cells, notes = [], []
            for key, w in zip(KEYS, widths):
                if f[key] == m[key]:
                    cells.append(f"{m[key]:>{w}}")
                else:
                    ok = False
                    cells.append(f"{m[key]}!={f[key]}".rjust(w))
            if rank_rec["params"] != formula_params(cfg, dt, n, k):
                ok = False
                want = {p["name"]: p for p in formula_params(cfg, dt, n, k)}
                bad = [p["name"] for p in rank_rec["params"] if want.get(p["name"]) != p]
                notes.append(f"PARAMS!{bad[:3] or 'order/count'}")
            t = rank_rec["totals"]
            facts = {
                "params dtype": t["params"]["dtype"] == e_name,
                "one param storage": t["params"]["distinct_storages"] == 1,
                "ds_tensors view lp_param_buffer": t["params"]["views_of_lp_param_buffer"],
                "params released": rank_rec["params_released_after_step"]
                                   == len(rank_rec["params"]),
                "master fp32": t["fp32_master"]["dtype"] == "float32"
                               and t["fp32_master"]["groups"] == 1,
                "master is a separate copy": not t["fp32_master"]["shares_storage_with_params"],
                "master grad freed": t["fp32_master"]["grad_is_none_after_step"],
                "states fp32": t["exp_avg"]["dtype"] == t["exp_avg_sq"]["dtype"] == "float32"
                               and t["step"]["dtype"] == "float32",
                "grads dtype": t["grad_partitions"]["dtype"] == e_name,
                "grad views": t["grad_partitions"]["views_at_param_offsets"],
                "bucket dtype": t["reduce_bucket"]["dtype"] == e_name
                                and t["reduce_bucket"]["numel"] == bucket,
                "nothing unattributed": rank_rec["unattributed_tensors"] == [],
            }
            for what, good in facts.items():
                if not good:
                    ok = False
                    notes.append(f"{what}!")
            print(f"{rec['name']:<22} {k:>4} " + " ".join(cells) + ("  " + " ".join(notes)
                                                                      if notes else ""))
        # ranks differ only in where the padding is (and in their data)
        strip = lambda r: json.dumps({**r, "rank": 0, "losses": None,
                                      "params": [{**p, "real": 0, "pad_here": 0}
                                                 for p in r["params"]],
                                      "totals": {**r["totals"], "padding": {
                                          **r["totals"]["padding"], "on_this_rank_numel": 0}}},
                                     sort_keys=True)
        if len({strip(r) for r in rec["ranks"]}) != 1:
            ok = False
            print(f"{rec['name']}: ranks differ beyond padding placement and losses")
    print("closed form == measured for every configuration and rank" if ok else "MISMATCH")
    return ok


# ----------------------------------------------------------------------------------------------
# The measurement (torch and DeepSpeed from here on)
# ----------------------------------------------------------------------------------------------

def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _storage(t):
    """(data_ptr or None, nbytes) of a tensor's storage."""
    s = t.untyped_storage()
    return (s.data_ptr() if s.nbytes() > 0 else None), s.nbytes()


def _is_tensor(obj, cls) -> bool:
    try:
        return isinstance(obj, cls)
    except Exception:
        return False


def _measure(shape_name: str, dtype_name: str, rank: int, n: int) -> dict:
    import gc
    import warnings

    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[shape_name], tie_word_embeddings=False)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config)
    model.train()
    hf_config = json.loads(model.config.to_json_string(use_diff=False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                                   config=ds_config(dtype_name))
    del model, opt

    def one_step(step: int) -> float:
        g = torch.Generator().manual_seed(1000 + rank + 100 * step)
        ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=g)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        return float(loss.detach().float())

    losses = [one_step(s) for s in range(STEPS)]
    gc.collect()

    o = optimizer
    zero_resolved = {
        "reduce_bucket_size": engine.zero_reduce_bucket_size(),
        "prefetch_bucket_size": engine.zero_prefetch_bucket_size(),
        "max_live_parameters": engine.zero_max_live_parameters(),
        "max_reuse_distance": engine.zero_max_reuse_distance(),
        "param_persistence_threshold": engine.zero_param_persistence_threshold(),
        "model_persistence_threshold": engine.zero_model_persistence_threshold(),
        "sub_group_size": engine.zero_sub_group_size(),
        "contiguous_gradients": engine.zero_contiguous_gradients(),
        "overlap_comm": engine.zero_overlap_comm(),
        "reduce_scatter": engine.zero_reduce_scatter(),
        "communication_data_type": _dtype_name(torch.empty(0,
                                                           dtype=engine.communication_data_type)),
        "gradient_accumulation_dtype": _dtype_name(
            torch.empty(0, dtype=o.gradient_accumulation_dtype)),
        "master_weights_and_grads_dtype": _dtype_name(
            torch.empty(0, dtype=o.master_weights_and_grads_dtype)),
        "optimizer": type(o).__name__ + "(" + type(o.optimizer).__name__ + ")",
        "sub_groups": len(o.fp16_groups),
        "persistent_parameters": len(o.persistent_parameters),
    }

    category: dict[int, str] = {}   # storage data_ptr -> category

    # ---- parameter partitions ----
    lp_ptr, lp_nbytes = _storage(o.lp_param_buffer)
    category[lp_ptr] = "params"
    params, released, views, ds_bytes, pad_total, pad_here = [], 0, True, 0, 0, 0
    param_storages, dtypes = {}, set()
    offsets = {}
    for name, p in engine.module.named_parameters():
        t = p.ds_tensor
        ptr, nbytes = _storage(t)
        param_storages[ptr] = nbytes
        dtypes.add(_dtype_name(t))
        views = views and ptr == lp_ptr
        numel, pnumel = p.ds_numel, t.numel()
        start = pnumel * rank
        real = max(0, min(pnumel, numel - start))
        offsets[p.ds_id] = t.storage_offset()
        params.append({"name": name, "shape": list(p.ds_shape), "numel": numel,
                       "ds_numel": pnumel, "dtype": _dtype_name(t), "storage_nbytes": nbytes,
                       "offset": t.storage_offset(), "real": real, "pad_here": pnumel - real,
                       "pad_total": pnumel * n - numel})
        ds_bytes += _nbytes(t)
        pad_total += pnumel * n - numel
        pad_here += pnumel - real
        released += int(p.data.numel() == 0)
    storage_bytes = sum(param_storages.values())

    # ---- fp32 master partitions ----
    masters = o.fp32_partitioned_groups_flat
    master_extra, shares = 0, True
    for t in masters:
        ptr, nbytes = _storage(t)
        if ptr in category:
            shares = shares and category[ptr] == "params"
        else:
            shares = False
            category[ptr] = "fp32_master"
            master_extra += nbytes
    fp32_master = {
        "groups": len(masters),
        "numel": sum(t.numel() for t in masters),
        "numel_per_group": [t.numel() for t in masters],
        "dtype": ",".join(sorted({_dtype_name(t) for t in masters})),
        "bytes": sum(_nbytes(t) for t in masters),
        "shares_storage_with_params": shares,
        "extra_storage_bytes": master_extra,
        "grad_is_none_after_step": all(t.grad is None for t in masters),
    }

    # ---- optimizer states ----
    state_list, sums = [], {}
    for gi, t in enumerate(masters):
        st = o.optimizer.state.get(t, {})
        entry = {"param": f"fp32_partitioned_groups_flat[{gi}]"}
        for key in sorted(st):
            v = st[key]
            if not torch.is_tensor(v):
                entry[key] = v
                continue
            ptr, nbytes = _storage(v)
            category.setdefault(ptr, "state." + key)
            entry[key] = {"dtype": _dtype_name(v), "shape": list(v.shape), "numel": v.numel(),
                          "bytes": _nbytes(v), "storage_nbytes": nbytes,
                          "device": str(v.device)}
            acc = sums.setdefault(key, {"tensors": 0, "dtype": _dtype_name(v), "numel": 0,
                                        "bytes": 0})
            acc["tensors"] += 1
            acc["numel"] += v.numel()
            acc["bytes"] += _nbytes(v)
        state_list.append(entry)
    n_states = len(o.optimizer.state)

    # ---- gradient partitions ----
    gbuf = o.grad_partitions_flat_buffer
    gptr, _ = _storage(gbuf)
    category[gptr] = "grad_partitions"
    gmap = o._DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition
    gviews = all(_storage(v)[0] == gptr and v.storage_offset() == offsets[i]
                 for i, v in gmap.items()) and len(gmap) == len(params)
    grad_partitions = {"name": "grad_partitions_flat_buffer", "numel": gbuf.numel(),
                       "dtype": _dtype_name(gbuf), "bytes": _nbytes(gbuf),
                       "views_at_param_offsets": gviews}

    # ---- reduce bucket(s) ----
    buckets = []
    for dt, b in sorted(o.ipg_buckets.items(), key=lambda kv: str(kv[0])):
        if b.buffer is None:
            continue
        ptr, _ = _storage(b.buffer)
        category[ptr] = "reduce_bucket"
        buckets.append(b.buffer)
    reduce_bucket = {"name": "ipg_buckets[*].buffer", "count": len(buckets),
                     "dtype": ",".join(_dtype_name(b) for b in buckets),
                     "numel": sum(b.numel() for b in buckets),
                     "bytes": sum(_nbytes(b) for b in buckets)}

    # ---- other DeepSpeed tensors and module buffers ----
    other = []
    named_other = [("inf_or_nan_tracker", o.inf_or_nan_tracker),
                   ("_global_grad_norm", o._global_grad_norm)]
    for name, t in named_other:
        if not torch.is_tensor(t):
            continue
        ptr, _ = _storage(t)
        category[ptr] = name
        other.append({"name": name, "source": OTHER_SOURCES[name], "dtype": _dtype_name(t),
                      "numel": t.numel(), "bytes": _nbytes(t),
                      "also_engine_attribute": name == "_global_grad_norm"
                      and engine._global_grad_norm is t})
    buffers = []
    for name, b in engine.module.named_buffers():
        ptr, _ = _storage(b)
        category.setdefault(ptr, "buffer")
        buffers.append({"name": name, "dtype": _dtype_name(b), "shape": list(b.shape),
                        "bytes": _nbytes(b)})

    # ---- gc sweep: every live tensor storage, attributed ----
    seen, distinct, unattributed = set(), 0, []
    with warnings.catch_warnings():   # isinstance() on deprecated module attributes warns
        warnings.simplefilter("ignore")
        live = [obj for obj in gc.get_objects() if _is_tensor(obj, torch.Tensor)]
    for obj in live:
        ptr, nbytes = _storage(obj)
        if ptr is None or ptr in seen:
            continue
        seen.add(ptr)
        distinct += nbytes
        if ptr not in category:
            refs = sorted({type(r).__name__ for r in gc.get_referrers(obj)} - {"list", "frame"})
            unattributed.append({"dtype": _dtype_name(obj), "shape": list(obj.shape),
                                 "storage_nbytes": nbytes, "referrers": refs})
    missing = [c for ptr, c in category.items() if ptr not in seen]
    unattributed.sort(key=lambda u: json.dumps(u, sort_keys=True))

    return {
        "rank": rank,
        "losses": losses,
        "params_released_after_step": released,
        "totals": {
            "params": {"count": len(params), "numel": sum(p["ds_numel"] for p in params),
                       "dtype": ",".join(sorted(dtypes)), "bytes": ds_bytes,
                       "storage_bytes": storage_bytes, "distinct_storages": len(param_storages),
                       "views_of_lp_param_buffer": views, "lp_param_buffer_nbytes": lp_nbytes},
            "padding": {"total_numel": pad_total, "on_this_rank_numel": pad_here},
            "fp32_master": fp32_master,
            "exp_avg": sums.get("exp_avg", {}),
            "exp_avg_sq": sums.get("exp_avg_sq", {}),
            "step": sums.get("step", {}),
            "optimizer_states": {"state_entries": n_states,
                                 "bytes": sum(v["bytes"] for v in sums.values())},
            "grad_partitions": grad_partitions,
            "reduce_bucket": reduce_bucket,
            "other": other,
            "module_buffers": {"count": len(buffers), "bytes": sum(b["bytes"] for b in buffers)},
            "distinct_storage_bytes": distinct,
            "categories_not_found_by_sweep": sorted(set(missing)),
        },
        "zero_resolved": zero_resolved,
        "hf_config": hf_config,
        "params": params,
        "optimizer_states": state_list,
        "module_buffers": buffers,
        "unattributed_tensors": unattributed,
    }


def _worker(rank: int, n: int, port: int, job: tuple, tmpdir: str) -> None:
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n))
    import logging

    import torch
    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend="gloo")
    try:
        rec = _measure(job[0], job[1], rank, n)
        versions = None
        if rank == 0:
            import transformers
            from deepspeed.accelerator import get_accelerator
            versions = {"deepspeed": deepspeed.__version__, "torch": torch.__version__,
                        "transformers": transformers.__version__,
                        "python": sys.version.split()[0],
                        "accelerator": get_accelerator().device_name(),
                        "backend": dist.get_backend()}
        with open(os.path.join(tmpdir, f"{rank}.json"), "w") as f:
            json.dump({"rank": rec, "versions": versions}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(nprocs: list[int], shapes: list[str], dtypes: list[str]) -> list[dict]:
    import torch.multiprocessing as mp

    records = []
    for n in nprocs:
        for shape_name in shapes:
            for dtype_name in dtypes:
                t0 = time.time()
                with tempfile.TemporaryDirectory() as tmpdir:
                    mp.spawn(_worker, args=(n, _free_port(), (shape_name, dtype_name), tmpdir),
                             nprocs=n, join=True)
                    got = []
                    for r in range(n):
                        with open(os.path.join(tmpdir, f"{r}.json")) as f:
                            got.append(json.load(f))
                versions = got[0]["versions"]
                ranks = [g["rank"] for g in got]
                first = dict(ranks[0])
                assert all(r["zero_resolved"] == first["zero_resolved"]
                           and r["hf_config"] == first["hf_config"] for r in ranks)
                for r in ranks:
                    del r["zero_resolved"], r["hf_config"]
                name = f"llama-{shape_name}-{dtype_name}-np{n}"
                print(f"measured {name} in {time.time() - t0:.1f} s", flush=True)
                records.append({
                    "name": name,
                    "tool": "tools/deepspeed_zero3_states.py",
                    "measured": MEASURED,
                    "deepspeed": versions["deepspeed"],
                    "torch": versions["torch"],
                    "transformers": versions["transformers"],
                    "python": versions["python"],
                    "accelerator": versions["accelerator"],
                    "backend": versions["backend"],
                    "nprocs": n,
                    "config": {
                        "shape": shape_name,
                        "dtype": dtype_name,
                        "llama": dict(SHAPES[shape_name], tie_word_embeddings=False),
                        "attn_implementation": "eager",
                        "ds_config": ds_config(dtype_name),
                        "zero_resolved": first["zero_resolved"],
                        "optimizer": "torch.optim.AdamW(model.parameters(), lr=1e-3)",
                        "batch": BATCH,
                        "sequence": SEQ,
                        "steps": STEPS,
                        "recorded": "after the last engine.step()",
                        "hf_config": first["hf_config"],
                    },
                    "ranks": ranks,
                })
    return records


def _dumps(rec: dict) -> str:
    """JSON, indented down to each rank's keys, one line per list entry (compact, diffable)."""
    def compact(v):
        return json.dumps(v, separators=(",", ":"))

    lines = ["{"]
    top = list(rec.items())
    for i, (k, v) in enumerate(top):
        end = "," if i + 1 < len(top) else ""
        if k != "ranks":
            lines.append(f" {json.dumps(k)}: {compact(v)}{end}")
            continue
        lines.append(' "ranks": [')
        for j, rank in enumerate(v):
            lines.append("  {")
            items = list(rank.items())
            for m, (rk, rv) in enumerate(items):
                rend = "," if m + 1 < len(items) else ""
                if isinstance(rv, list) and rv and isinstance(rv[0], dict):
                    lines.append(f"   {json.dumps(rk)}: [")
                    for n_, entry in enumerate(rv):
                        lines.append("    " + compact(entry) + ("," if n_ + 1 < len(rv) else ""))
                    lines.append("   ]" + rend)
                else:
                    lines.append(f"   {json.dumps(rk)}: {compact(rv)}{rend}")
            lines.append("  }" + ("," if j + 1 < len(v) else ""))
        lines.append(" ]" + end)
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == rec
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nprocs", default="2,3,4", help="comma-separated world sizes")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: even,odd")
    ap.add_argument("--dtypes", default=",".join(DTYPE_NAMES), help="comma-separated: bf16,fp32")
    ap.add_argument("--write", metavar="DIR", help="write one JSON per configuration here")
    ap.add_argument("--check", metavar="DIR",
                    help="no run: re-read DIR/*.json and compare with the closed form")
    args = ap.parse_args()

    if args.check:
        records = []
        for fn in sorted(os.listdir(args.check)):
            if fn.endswith(".json"):
                with open(os.path.join(args.check, fn)) as f:
                    records.append(json.load(f))
        if not records:
            print(f"no JSON files in {args.check}")
            return 1
        return 0 if check_records(records) else 1

    nprocs = [int(x) for x in args.nprocs.split(",")]
    shapes = args.shapes.split(",")
    dtypes = args.dtypes.split(",")
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"unknown shape {s}")
    for d in dtypes:
        if d not in DTYPE_NAMES:
            ap.error(f"unknown dtype {d}")
    t0 = time.time()
    records = run(nprocs, shapes, dtypes)
    print(f"{len(records)} configurations measured in {time.time() - t0:.1f} s")
    if args.write:
        os.makedirs(args.write, exist_ok=True)
        for rec in records:
            with open(os.path.join(args.write, rec["name"] + ".json"), "w") as f:
                f.write(_dumps(rec))
        print(f"wrote {len(records)} files to {args.write}")
    return 0 if check_records(records) else 1


if __name__ == "__main__":
    sys.exit(main())
