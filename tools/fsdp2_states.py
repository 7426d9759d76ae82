#!/usr/bin/env python3
"""Per-rank parameter, gradient and AdamW-state storage of PyTorch FSDP2, measured (issue 32).

This is the measurement groundwork for modelling `torch.distributed.fsdp.fully_shard` (FSDP2,
per-parameter sharding) byte-exactly: it runs real FSDP2 on the CPU (gloo backend) with N
processes, one rank each, and records what every rank holds, tensor by tensor, as storage:

  - after fully_shard: every sharded parameter (a DTensor) with its name, the FSDP group it
    belongs to, its global shape, its local (unpadded) shape, the bytes of the storage its local
    tensor lives in (`p._local_tensor.untyped_storage().nbytes()`), the padded shape FSDP keeps
    (`FSDPParam.padded_sharded_param_size`) and whether the local tensor is a view of FSDP's
    padded flat buffer `FSDPParam._sharded_param_data` (it is: that buffer is the storage);
  - after one forward + backward: each parameter's gradient (`p.grad`, a DTensor): its local
    shape and dtype, the storage its local tensor lives in (bytes, offset, which distinct
    storage), and whether FSDP still holds unsharded parameter memory (all-gather outputs);
  - after one `torch.optim.AdamW(model.parameters(), lr=1e-3)` step (foreach, fused left at
    their defaults; the resolved choice is recorded): every state tensor (`step`, `exp_avg`,
    `exp_avg_sq`) with its type (DTensor or plain tensor), dtype, global and local shape, device
    and storage bytes; and, again, the parameters (to show the step updates them in place and
    leaves the padding rows zero).
Totals per category are given twice: "logical" (the sum of numel x element size of the local
tensors, what the unpadded views cover) and "storage" (the sum of the nbytes of the distinct
storages behind them, counted once each: allocator-independent, what is actually allocated).

The model: transformers' LlamaForCausalLM built from a LlamaConfig (no download, seed 0), 3
decoder layers, 4 heads, untied embeddings, in fp32 and in bf16 (`model.to(dtype)`), shapes:
  even      hidden 128, intermediate 352, 2 KV heads (head_dim 32), vocabulary 1000;
  odd       hidden 128, intermediate 353, 2 KV heads, vocabulary 1001 (uneven at every N > 1);
  oddheads  hidden 128, intermediate 353, 1 KV head, head_dim 6 (q_proj 24 rows, k/v_proj 6
            rows: at N=4 torch.chunk makes 3 chunks of 2 rows, so rank 3 holds no row of k/v),
            vocabulary 1001.
The recipe (the usual one): `fully_shard(layer, mesh=mesh, reshard_after_forward=True)` for every
decoder layer, then `fully_shard(model, mesh=mesh, reshard_after_forward=True)` on the root
(which takes the rest: embed_tokens, the final norm, lm_head); mesh =
init_device_mesh("cpu", (N,)); no MixedPrecisionPolicy, no CPU offload. One step: random token
ids (batch 2, sequence 16, a different seed per rank), labels = ids, `model(...).loss.backward()`,
`opt.step()`. N = 2, 3 and 4 (3 is beyond the brief: it makes the "even" shapes uneven).

How to run (torch and transformers importable; no GPU, no network):
    PYTHONPATH=/tmp/bnbpy:/tmp/bnbdeps python3 tools/fsdp2_states.py --write tests/data/fsdp2
        runs every configuration (one torch.multiprocessing.spawn per N, each rank loops over
        the shapes and dtypes: about 15 s per N on two cores), writes
        tests/data/fsdp2/llama-<shape>-<fp32|bf16>-np<N>.json, then runs the formula check;
    PYTHONPATH=... python3 tools/fsdp2_states.py --nprocs 2 --shapes odd --dtypes bf16
        the same for a subset, printing only (no --write);
    python3 tools/fsdp2_states.py --check tests/data/fsdp2
        no torch needed: re-reads the JSON files and prints, for every configuration and rank,
        the closed-form formula next to the measured totals; exit status 1 on any mismatch.

The closed form (docs/fsdp2-measured.md derives it with file:line citations into torch): for a
parameter of global shape (r, c1, c2, ...) with c = c1*c2*... (c = 1 for a vector), N ranks,
element size e bytes,
    chunk(r)    = ceil(r / N)                                  rows of every rank's padded shard
    rows(r, k)  = max(0, min(chunk(r), r - k*chunk(r)))        rows rank k really owns
    params  storage on rank k = e * sum_p chunk(r_p) * c_p      (the same on every rank)
    params  logical on rank k = e * sum_p rows(r_p, k) * c_p
    grads   storage on rank k = e * sum_p chunk(r_p) * c_p      (one flat buffer per FSDP group)
    grads   logical on rank k = e * sum_p rows(r_p, k) * c_p
    exp_avg = exp_avg_sq      = e * sum_p rows(r_p, k) * c_p    (storage = logical, unpadded)
    step                      = 4 * P                           (P parameters; fp32 CPU scalars)

Measured with PyTorch 2.15.0 (+cu132 wheel, run on the CPU) and transformers 5.25.0, Python
3.11, on 2026-12-06.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile

SHAPES = {
    "even": dict(hidden_size=128, intermediate_size=352, num_attention_heads=4,
                 num_key_value_heads=2, num_hidden_layers=3, vocab_size=1000),
    "odd": dict(hidden_size=128, intermediate_size=353, num_attention_heads=4,
                num_key_value_heads=2, num_hidden_layers=3, vocab_size=1001),
    "oddheads": dict(hidden_size=128, intermediate_size=353, num_attention_heads=4,
                     num_key_value_heads=1, head_dim=6, num_hidden_layers=3, vocab_size=1001),
}
DTYPE_NAMES = ("fp32", "bf16")
ELEMENT_SIZE = {"fp32": 4, "bf16": 2}
BATCH, SEQ = 2, 16
STEP_BYTES = 4  # AdamW's `step`: torch.tensor(0.0, dtype=float32) on the CPU


# ----------------------------------------------------------------------------------------------
# The closed form (pure Python: no torch needed)
# ----------------------------------------------------------------------------------------------

def llama_param_shapes(cfg: dict) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, FSDP group, global shape) of every parameter of LlamaForCausalLM, untied,
    no biases, in model.named_parameters() order. Group "" is the root."""
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    inter = cfg["intermediate_size"]
    vocab = cfg["vocab_size"]
    out = [("model.embed_tokens.weight", "", (vocab, h))]
    for i in range(cfg["num_hidden_layers"]):
        g = f"model.layers.{i}"
        out += [
            (f"{g}.self_attn.q_proj.weight", g, (heads * hd, h)),
            (f"{g}.self_attn.k_proj.weight", g, (kv * hd, h)),
            (f"{g}.self_attn.v_proj.weight", g, (kv * hd, h)),
            (f"{g}.self_attn.o_proj.weight", g, (h, heads * hd)),
            (f"{g}.mlp.gate_proj.weight", g, (inter, h)),
            (f"{g}.mlp.up_proj.weight", g, (inter, h)),
            (f"{g}.mlp.down_proj.weight", g, (h, inter)),
            (f"{g}.input_layernorm.weight", g, (h,)),
            (f"{g}.post_attention_layernorm.weight", g, (h,)),
        ]
    out += [("model.norm.weight", "", (h,)), ("lm_head.weight", "", (vocab, h))]
    return out


def chunk_rows(r: int, n: int) -> int:
    """Rows of every rank's padded shard: torch.chunk's chunk size, ceil(r / n)."""
    return -(-r // n)


def local_rows(r: int, n: int, k: int) -> int:
    """Rows rank k owns under torch.chunk (the last ranks may own fewer, or none)."""
    c = chunk_rows(r, n)
    return max(0, min(c, r - k * c))


def formula(cfg: dict, dtype_name: str, n: int, k: int) -> dict:
    """Per-rank totals in bytes, from the closed form."""
    e = ELEMENT_SIZE[dtype_name]
    padded = logical = 0
    shapes = llama_param_shapes(cfg)
    for _, _, shape in shapes:
        cols = math.prod(shape[1:])
        padded += chunk_rows(shape[0], n) * cols
        logical += local_rows(shape[0], n, k) * cols
    return {
        "params_storage": e * padded,
        "params_logical": e * logical,
        "grads_storage": e * padded,
        "grads_logical": e * logical,
        "exp_avg_storage": e * logical,
        "exp_avg_sq_storage": e * logical,
        "step_storage": STEP_BYTES * len(shapes),
        "optimizer_states_storage": 2 * e * logical + STEP_BYTES * len(shapes),
    }


def measured_totals(rank_rec: dict) -> dict:
    t = rank_rec["totals"]
    return {
        "params_storage": t["params"]["storage_bytes"],
        "params_logical": t["params"]["logical_bytes"],
        "grads_storage": t["grads"]["storage_bytes"],
        "grads_logical": t["grads"]["logical_bytes"],
        "exp_avg_storage": t["exp_avg"]["storage_bytes"],
        "exp_avg_sq_storage": t["exp_avg_sq"]["storage_bytes"],
        "step_storage": t["step"]["storage_bytes"],
        "optimizer_states_storage": t["optimizer_states"]["storage_bytes"],
    }


def check_records(records: list[dict]) -> bool:
    """Prints formula vs measured for every configuration and rank; True when all match.
    Also checks the per-parameter shapes against the closed form."""
    ok = True
    keys = ["params_storage", "params_logical", "grads_storage", "grads_logical",
            "exp_avg_storage", "exp_avg_sq_storage", "step_storage", "optimizer_states_storage"]
    short = ["P.stor", "P.log", "G.stor", "G.log", "m", "v", "step", "states"]
    print(f"{'configuration':<28} rank " + " ".join(f"{s:>15}" for s in short))
    for rec in records:
        cfg, n, dt = rec["config"]["llama"], rec["nprocs"], rec["config"]["dtype"]
        name = rec["name"]
        shapes = llama_param_shapes(cfg)
        for rank_rec in rec["ranks"]:
            k = rank_rec["rank"]
            f, m = formula(cfg, dt, n, k), measured_totals(rank_rec)
            cells = []
            for key in keys:
                if f[key] == m[key]:
                    cells.append(f"{m[key]:>15}")
                else:
                    ok = False
                    cells.append(f"{m[key]}!={f[key]}".rjust(15))
            # per-parameter: names, shapes, local rows, padded rows, in model order
            params = rank_rec["params"]
            if [p["name"] for p in params] != [s[0] for s in shapes]:
                ok = False
                cells.append("NAMES!")
            for p, (pname, _, shape) in zip(params, shapes):
                want_local = [local_rows(shape[0], n, k)] + list(shape[1:])
                want_pad = [chunk_rows(shape[0], n)] + list(shape[1:])
                if (p["global_shape"] != list(shape) or p["local_shape"] != want_local
                        or p["padded_shape"] != want_pad):
                    ok = False
                    cells.append(f"SHAPE!{pname}")
            print(f"{name:<28} {k:>4} " + " ".join(cells))
    print("formula == measured for every configuration and rank" if ok else "MISMATCH")
    return ok


# ----------------------------------------------------------------------------------------------
# The measurement (torch from here on)
# ----------------------------------------------------------------------------------------------

def _storage_info(t):
    """(nbytes, data_ptr or None, storage_offset in elements) of a plain tensor's storage."""
    s = t.untyped_storage()
    nbytes = s.nbytes()
    ptr = s.data_ptr() if nbytes > 0 else None
    return nbytes, ptr, t.storage_offset()


def _local(t):
    """The local tensor of a DTensor, or t itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


class _Distinct:
    """Counts distinct storages (by data pointer) of one category in one snapshot."""

    def __init__(self):
        self.ids: dict[int, int] = {}
        self.bytes = 0
        self.logical = 0
        self.count = 0

    def add(self, t) -> int | None:
        self.count += 1
        self.logical += t.numel() * t.element_size()
        nbytes, ptr, _ = _storage_info(t)
        if ptr is None:
            return None
        if ptr not in self.ids:
            self.ids[ptr] = len(self.ids)
            self.bytes += nbytes
        return self.ids[ptr]

    def totals(self) -> dict:
        return {"count": self.count, "logical_bytes": self.logical,
                "storage_bytes": self.bytes, "distinct_storages": len(self.ids)}


def _fsdp_params_by_name(model):
    """name -> (group name, FSDPParam) for every parameter FSDP manages."""
    from torch.distributed.fsdp import FSDPModule

    by_id = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for mod_name, mod in model.named_modules():
        if not isinstance(mod, FSDPModule):
            continue
        group = mod._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        for fp in group.fsdp_params:
            out[by_id[id(fp.sharded_param)]] = (mod_name, fp)
    return out


def _unsharded_resident_bytes(fsdp) -> int:
    """Bytes FSDP still holds for unsharded parameters (all-gather outputs), distinct storages."""
    seen, total = set(), 0
    for _, fp in fsdp.values():
        tensors = list(getattr(fp, "all_gather_outputs", []))
        if hasattr(fp, "_unsharded_param"):
            tensors.append(fp._unsharded_param)
        for t in tensors:
            nbytes, ptr, _ = _storage_info(t)
            if ptr is not None and ptr not in seen:
                seen.add(ptr)
                total += nbytes
    return total


def _param_records(model, fsdp):
    dist_params = _Distinct()
    recs = []
    for name, p in model.named_parameters():
        group, fp = fsdp[name]
        loc = _local(p)
        nbytes, ptr, off = _storage_info(loc)
        spd = fp._sharded_param_data
        spd_nbytes, spd_ptr, _ = _storage_info(spd)
        # padding: the part of the padded flat buffer beyond the local view
        pad_numel = spd.numel() - loc.numel()
        pad_zero = bool(pad_numel == 0 or (spd[loc.numel():] == 0).all().item())
        recs.append({
            "name": name,
            "group": group,
            "type": type(p).__name__,
            "dtype": str(loc.dtype).replace("torch.", ""),
            "global_shape": list(p.shape),
            "local_shape": list(loc.shape),
            "padded_shape": list(fp.padded_sharded_param_size),
            "local_bytes": loc.numel() * loc.element_size(),
            "storage_nbytes": nbytes,
            "storage_offset": off,
            "sharded_param_data_numel": spd.numel(),
            "sharded_param_data_nbytes": spd_nbytes,
            "local_is_view_of_sharded_param_data": ptr is not None and ptr == spd_ptr,
            "padding_numel": pad_numel,
            "padding_is_zero": pad_zero,
            "storage_id": dist_params.add(loc),
        })
    return recs, dist_params.totals()


def _measure(shape_name: str, dtype_name: str, mesh, rank: int, n: int, foreach) -> dict:
    import torch
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    cfg_kwargs = dict(SHAPES[shape_name], tie_word_embeddings=False)
    torch.manual_seed(0)
    config = LlamaConfig(**cfg_kwargs)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(dtype)
    model.train()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    fsdp = _fsdp_params_by_name(model)

    params_init, params_init_tot = _param_records(model, fsdp)
    init_ptrs = [_storage_info(_local(p))[1] for _, p in model.named_parameters()]

    g = torch.Generator().manual_seed(1000 + rank)
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=g)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    loss = float(out.loss.detach())
    del out

    grads, dist_grads = [], _Distinct()
    for name, p in model.named_parameters():
        gl = _local(p.grad)
        nbytes, ptr, off = _storage_info(gl)
        grads.append({
            "name": name,
            "group": fsdp[name][0],
            "type": type(p.grad).__name__,
            "dtype": str(gl.dtype).replace("torch.", ""),
            "local_shape": list(gl.shape),
            "local_bytes": gl.numel() * gl.element_size(),
            "storage_nbytes": nbytes,
            "storage_offset": off,
            "storage_id": dist_grads.add(gl),
        })
    unsharded_after_backward = _unsharded_resident_bytes(fsdp)

    params_list = list(model.parameters())
    # What AdamW's foreach=None resolves to (torch/optim/adam.py's adam(): DTensor is a foreach
    # type, but "cpu" is not a foreach device, so here it is the per-tensor loop).
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach
        _, resolved_foreach = _default_to_fused_or_foreach(params_list, False, use_fused=False)
    except Exception as exc:  # private helper; record why if it moved
        resolved_foreach = f"unknown ({exc!r})"
    if foreach is not None:
        resolved_foreach = foreach
    if foreach is None:
        opt = torch.optim.AdamW(params_list, lr=1e-3)
    else:
        opt = torch.optim.AdamW(params_list, lr=1e-3, foreach=foreach)
    opt.step()

    states = []
    dist_state = {k: _Distinct() for k in ("exp_avg", "exp_avg_sq", "step")}
    dist_all_states = _Distinct()
    for name, p in model.named_parameters():
        st = opt.state[p]
        entry = {"name": name}
        for key in ("step", "exp_avg", "exp_avg_sq"):
            v = st[key]
            lv = _local(v)
            nbytes, _, _ = _storage_info(lv)
            entry[key] = {
                "type": type(v).__name__,
                "dtype": str(v.dtype).replace("torch.", ""),
                "global_shape": list(v.shape),
                "local_shape": list(lv.shape),
                "device": str(lv.device),
                "local_bytes": lv.numel() * lv.element_size(),
                "storage_nbytes": nbytes,
                "storage_id": dist_state[key].add(lv),
            }
            dist_all_states.add(lv)
        extra = sorted(set(st) - {"step", "exp_avg", "exp_avg_sq"})
        if extra:
            entry["other_state_keys"] = extra
        states.append(entry)

    params_after, params_after_tot = _param_records(model, fsdp)
    after_ptrs = [_storage_info(_local(p))[1] for _, p in model.named_parameters()]

    buffers = []
    for name, b in model.named_buffers():
        nbytes, _, _ = _storage_info(b)
        buffers.append({"name": name, "type": type(b).__name__,
                        "dtype": str(b.dtype).replace("torch.", ""),
                        "shape": list(b.shape), "storage_nbytes": nbytes})

    totals = {
        "params": params_init_tot,
        "grads": dist_grads.totals(),
        "exp_avg": dist_state["exp_avg"].totals(),
        "exp_avg_sq": dist_state["exp_avg_sq"].totals(),
        "step": dist_state["step"].totals(),
        "optimizer_states": dist_all_states.totals(),
        "buffers_storage_bytes": sum(b["storage_nbytes"] for b in buffers),
    }
    totals["params_grads_states_storage_bytes"] = (
        totals["params"]["storage_bytes"] + totals["grads"]["storage_bytes"]
        + totals["optimizer_states"]["storage_bytes"])
    return {
        "rank": rank,
        "loss": loss,
        "optimizer": {"class": type(opt).__name__,
                      "foreach_arg": opt.defaults.get("foreach"),
                      "fused_arg": opt.defaults.get("fused"),
                      "resolved_foreach": resolved_foreach},
        "unsharded_resident_bytes_after_backward": unsharded_after_backward,
        "params_storage_unchanged_by_step": init_ptrs == after_ptrs,
        "params_totals_after_step": params_after_tot,
        "padding_zero_after_step": all(p["padding_is_zero"] for p in params_after),
        "totals": totals,
        "params": params_init,
        "grads": grads,
        "optimizer_states": states,
        "buffers": buffers,
    }


def _worker(rank: int, n: int, port: int, jobs: list, tmpdir: str, foreach) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=n)
    try:
        mesh = init_device_mesh("cpu", (n,))
        for shape_name, dtype_name in jobs:
            rec = _measure(shape_name, dtype_name, mesh, rank, n, foreach)
            with open(os.path.join(tmpdir, f"{shape_name}-{dtype_name}-{rank}.json"), "w") as f:
                json.dump(rec, f)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(nprocs: list[int], shapes: list[str], dtypes: list[str], foreach=None) -> list[dict]:
    import torch
    import torch.multiprocessing as mp
    import transformers

    jobs = [(s, d) for s in shapes for d in dtypes]
    records = []
    for n in nprocs:
        with tempfile.TemporaryDirectory() as tmpdir:
            mp.spawn(_worker, args=(n, _free_port(), jobs, tmpdir, foreach), nprocs=n, join=True)
            for shape_name, dtype_name in jobs:
                ranks = []
                for r in range(n):
                    with open(os.path.join(tmpdir, f"{shape_name}-{dtype_name}-{r}.json")) as f:
                        ranks.append(json.load(f))
                records.append({
                    "name": f"llama-{shape_name}-{dtype_name}-np{n}",
                    "tool": "tools/fsdp2_states.py",
                    "measured": "2026-12-06",
                    "torch": torch.__version__,
                    "transformers": transformers.__version__,
                    "python": sys.version.split()[0],
                    "backend": "gloo",
                    "device": "cpu",
                    "nprocs": n,
                    "config": {
                        "shape": shape_name,
                        "dtype": dtype_name,
                        "llama": dict(SHAPES[shape_name], tie_word_embeddings=False),
                        "recipe": "fully_shard(layer, mesh, reshard_after_forward=True) per "
                                  "decoder layer, then fully_shard(model, mesh, "
                                  "reshard_after_forward=True); no MixedPrecisionPolicy, "
                                  "no offload",
                        "optimizer": "torch.optim.AdamW(model.parameters(), lr=1e-3"
                                     + ("" if foreach is None else f", foreach={foreach}")
                                     + ")",
                        "batch": BATCH,
                        "sequence": SEQ,
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
            lines.append(f" {json.dumps(k)}: {json.dumps(v)}{end}")
            continue
        lines.append(f' "ranks": [')
        for j, rank in enumerate(v):
            lines.append("  {")
            items = list(rank.items())
            for m, (rk, rv) in enumerate(items):
                rend = "," if m + 1 < len(items) else ""
                if isinstance(rv, list):
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
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: even,odd,oddheads")
    ap.add_argument("--dtypes", default=",".join(DTYPE_NAMES), help="comma-separated: fp32,bf16")
    ap.add_argument("--foreach", choices=("default", "true", "false"), default="default",
                    help="AdamW's foreach argument (default: left unset, as in the goldens)")
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
    foreach = {"default": None, "true": True, "false": False}[args.foreach]
    records = run(nprocs, shapes, dtypes, foreach)
    if args.write:
        os.makedirs(args.write, exist_ok=True)
        for rec in records:
            with open(os.path.join(args.write, rec["name"] + ".json"), "w") as f:
                f.write(_dumps(rec))
        print(f"wrote {len(records)} files to {args.write}")
    return 0 if check_records(records) else 1


if __name__ == "__main__":
    sys.exit(main())
