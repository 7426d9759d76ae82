#!/usr/bin/env python3
"""Which of PyTorch FSDP2's unsharded parameters are alive, and how large, at each point of a step
(issue 32, point 2: the gathered units).

It runs real FSDP2 (`fully_shard`, torch 2.15, gloo on the CPU) with N processes and, at every
forward pre/post hook and backward pre/post hook of each FSDP unit (every decoder layer and the
root: embed_tokens, the final norm, lm_head), records on every rank the bytes of the storages
behind FSDP's unsharded parameter buffers (`FSDPParam.all_gather_outputs`, one per parameter,
whose storage FSDP resizes to 0 when it reshards), per unit. The model and recipe are
tools/fsdp2_states.py's: LlamaForCausalLM (3 layers, hidden 128, 4 heads), the `odd` shape
(intermediate 353, vocabulary 1001, 2 KV heads) and the `oddheads` one (1 KV head, head_dim 6),
bf16, `fully_shard(layer)` per layer then `fully_shard(model)` with their defaults.

What it checks against trainmem's model of the gathers (docs/distributed.md, "FSDP2:
per-parameter sharding"), printing both and exiting 1 on a mismatch:
  - each unit's unsharded bytes, when alive, are sum_p e * N * ceil(r_p / N) * c_p over its
    parameters (every parameter padded to N chunks);
  - with --no-reshard (`reshard_after_forward=False` on the layers, FSDP1's SHARD_GRAD_OP) a
    layer stays gathered from its pre-forward to its post-backward;
  - the root unit is alive from its own pre-forward to the end of the backward (with
    reshard_after_forward left at its default, fully_shard does not reshard the root after
    forward: _fsdp_state.py:222-226), and a layer's unit from its pre-forward to its
    post-forward (no prefetch in forward) and again from its pre-backward, or from the
    pre-backward of the unit after it (implicit backward prefetch of one unit: its all-gather
    output, the same bytes, waits for the copy-out), to its post-backward.

How to run (torch and transformers importable, e.g. a venv with `pip install torch==2.15.0
transformers==5.25.0`; no GPU, no network):
    python3 tools/fsdp2_gathers.py --nprocs 4 [--no-reshard]
Prints the table of (event, unit, bytes alive per unit) for rank 0 and the verdict for every
rank; `--write tests/data/fsdp2/gathers-np<N>.json` also writes what every rank measured (each
unit's largest bytes alive in step 2, and the events), which tests/test_fsdp2.cpp reads.
"""
import argparse
import math
import os
import sys


def padded_bytes(shape, n, e):
    rows = shape[0]
    cols = math.prod(shape[1:]) if len(shape) > 1 else 1
    return e * n * math.ceil(rows / n) * cols


def run(rank, nprocs, shapes, port, out, reshard=True):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=nprocs)
    mesh = init_device_mesh("cpu", (nprocs,))
    problems = []
    measured = {}
    for shape in shapes:
        kw = dict(hidden_size=128, num_attention_heads=4, num_hidden_layers=3,
                  intermediate_size=353, vocab_size=1001, tie_word_embeddings=False,
                  attn_implementation="eager")
        kw.update({"odd": dict(num_key_value_heads=2),
                   "oddheads": dict(num_key_value_heads=1, head_dim=6)}[shape])
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**kw)).to(torch.bfloat16)
        # Global shapes before sharding: the expected unsharded bytes of each unit.
        units = {f"layer{i}": [] for i in range(3)}
        units["root"] = []
        for name, p in model.named_parameters():
            unit = "root"
            if name.startswith("model.layers."):
                unit = "layer" + name.split(".")[2]
            units[unit].append(tuple(p.shape))
        expect = {u: sum(padded_bytes(s, nprocs, 2) for s in v) for u, v in units.items()}
        for layer in model.model.layers:
            # The defaults: reshard_after_forward=None (auto); --no-reshard: False on the layers
            # (FSDP1's SHARD_GRAD_OP), the root left at its default.
            if reshard:
                fully_shard(layer, mesh=mesh)
            else:
                fully_shard(layer, mesh=mesh, reshard_after_forward=False)
        fully_shard(model, mesh=mesh)

        def alive(mod):
            # The unit's unsharded buffers, or a prefetched all-gather's flat output waiting for
            # its copy-out (the same N·sum(chunk) elements).
            total = 0
            for group in mod._get_fsdp_state()._fsdp_param_groups:
                for fp in group.fsdp_params:
                    for t in getattr(fp, "all_gather_outputs", []):
                        total += t.untyped_storage().nbytes()
                pending = group._all_gather_result
                if pending is not None:
                    total += pending.all_gather_output.untyped_storage().nbytes()
            return total

        mods = {f"layer{i}": m for i, m in enumerate(model.model.layers)}
        mods["root"] = model
        name_of = {}
        for u, m in mods.items():
            for group in m._get_fsdp_state()._fsdp_param_groups:
                name_of[id(group)] = u
        trace = []

        def snap(event):
            trace.append((event, {u: alive(m) for u, m in mods.items()}))

        # A snapshot after each of FSDP's own transitions of a unit (FSDPParamGroup's methods).
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        saved = {}
        for meth in ("pre_forward", "post_forward", "pre_backward", "post_backward"):
            orig = getattr(FSDPParamGroup, meth)
            saved[meth] = orig

            def wrapped(self, *a, _orig=orig, _meth=meth, **k):
                r = _orig(self, *a, **k)
                snap(f"after {_meth} {name_of.get(id(self), '?')}")
                return r
            setattr(FSDPParamGroup, meth, wrapped)
        ids = torch.randint(0, 1001, (2, 16), generator=torch.Generator().manual_seed(rank))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(2):
            trace.clear()
            loss = model(input_ids=ids, labels=ids).loss
            snap("after forward")
            loss.backward()
            snap("after backward")
            opt.step()
            opt.zero_grad(set_to_none=True)
        for meth, orig in saved.items():
            setattr(FSDPParamGroup, meth, orig)
        # Check step 2's trace against the model: each unit holds 0 or its padded bytes; the root
        # from its pre-forward to the end of the backward; a layer from its pre-forward to its
        # post-forward and from its pre-backward (or the prefetch of the layer above's) to its
        # post-backward.
        want = {u: False for u in mods}
        for event, live in trace:
            words = event.split()
            if words[0] == "after" and len(words) == 3:
                meth, u = words[1], words[2]
                if meth == "pre_forward":
                    want[u] = True
                elif meth == "post_forward" and u != "root" and reshard:
                    want[u] = False
                elif meth == "pre_backward":
                    want[u] = True
                    k = int(u[5:]) if u != "root" else 3
                    if k > 0:
                        want[f"layer{k - 1}"] = True  # implicit backward prefetch of one unit
                    if not reshard:  # every layer still gathered since its forward
                        for j in range(k):
                            want[f"layer{j}"] = True
                elif meth == "post_backward":
                    want[u] = False
            elif event == "after backward":
                want = {u: False for u in mods}
            for u, b in live.items():
                exp = expect[u] if want[u] else 0
                if b != exp:
                    problems.append(f"{shape} rank {rank} {event}: unit {u} holds {b} B, "
                                    f"the model says {exp}")
        # What was measured: each unit's largest bytes alive in step 2, and the events.
        measured[shape] = {
            "unit_bytes": {u: max(live[u] for _, live in trace) for u in mods},
            "events": [[event, [live[u] for u in ("root", "layer0", "layer1", "layer2")]]
                       for event, live in trace]}
        if rank == 0:
            print(f"\n{shape}, N {nprocs}, bf16: expected unsharded bytes per unit {expect}")
            for event, live in trace:
                print(f"  {event:28s} " + "  ".join(f"{u} {b:>8}" for u, b in live.items()))
    out.put((rank, problems, measured))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--shapes", default="odd,oddheads")
    ap.add_argument("--port", type=int, default=29531)
    ap.add_argument("--write", default="", help="write what every rank measured to this JSON")
    ap.add_argument("--no-reshard", action="store_true",
                    help="fully_shard(layer, reshard_after_forward=False) (SHARD_GRAD_OP)")
    a = ap.parse_args()
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run,
                         args=(r, a.nprocs, a.shapes.split(","), a.port, q, not a.no_reshard))
             for r in range(a.nprocs)]
    for p in procs:
        p.start()
    results = sorted((r for r in (q.get() for _ in procs)), key=lambda x: x[0])
    for p in procs:
        p.join()
    problems = [m for _, ps, _ in results for m in ps]
    if a.write:
        import json
        import torch
        import transformers
        doc = {"tool": "tools/fsdp2_gathers.py", "torch": torch.__version__,
               "transformers": transformers.__version__, "backend": "gloo", "device": "cpu",
               "nprocs": a.nprocs, "dtype": "bf16",
               "recipe": ("fully_shard(layer, mesh) per decoder layer, then fully_shard(model, "
                          "mesh): reshard_after_forward left at None (auto)") if not a.no_reshard
               else ("fully_shard(layer, mesh, reshard_after_forward=False) per decoder layer, "
                     "then fully_shard(model, mesh) (auto)"),
               "reshard_after_forward": not a.no_reshard,
               "events_columns": ["root", "layer0", "layer1", "layer2"],
               "ranks": [m for _, _, m in results]}
        with open(a.write, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"wrote {a.write}")
    for m in problems:
        print("MISMATCH", m)
    print("\nevery rank: the unsharded buffers match the model" if not problems else
          f"\n{len(problems)} mismatch(es)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
