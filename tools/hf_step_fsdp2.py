#!/usr/bin/env python3
r"""Records every allocation and free of a whole HuggingFace training step under PyTorch FSDP2,
on every rank (issue 32, points 3-4: the HF step per rank).

The same tracer as tools/hf_step_events.py (PyTorch's profiler with profile_memory=True, one
intra-op thread, gc disabled during the steps; its docstring says why that sequence is complete
for what the main thread allocates), run in each of N gloo processes around the usual FSDP2
recipe:

    for layer in model.model.layers: fully_shard(layer, mesh=mesh[, reshard_after_forward=False])
    fully_shard(model, mesh=mesh)          # the root: embed_tokens, model.norm, lm_head
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    for step in (1, 2):
        out = model(input_ids=input_ids, labels=labels)   # phases "forward" and "loss"
        out.loss.backward()                               # phase "backward"
        opt.step()                                        # phase "optimizer"
        opt.zero_grad(set_to_none=True)                   # phase "zero_grad"

The model is hf_step_events.py's small configuration (3 layers, hidden 128, 4 heads, 2 KV heads)
in bf16 ("pure": no MixedPrecisionPolicy, so FSDP gathers and reduces in bf16), with the `odd`
dimensions of tools/fsdp2_states.py by default (intermediate 353, vocabulary 1001: every rank
pads) so that padding shows. Each rank's inputs are drawn with its own seed (sizes do not
depend on them).

gloo, not NCCL: what gloo allocates inside a collective (a flat staging tensor, on the main
thread inside c10d's op or on its worker thread) is left out, as NCCL allocates nothing of the
kind; the profiler counts allocation ids per thread, so the events are paired by address; and
each collective is waited for, with a 5 ms pause, before FSDP goes on, so that gloo's worker
has let go of the buffers first (otherwise the last reference was sometimes the worker's, the
free happened outside the profile and two runs differed). FSDP2's own
buffers (the all-gather input/output, each parameter's unsharded buffer, the reduce-scatter
input and output) are allocated on the main thread and are in it. The optimizer's `step`
scalars are CPU tensors here as on a GPU (4 B each).

With --mp on the model is fp32 and every fully_shard gets
MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) (torchtitan's
default; trainmem's `--precision mixed` under FSDP2).

Writes, with --write DIR, one golden per configuration:
  DIR/<family>-5.25[-sdpa]-<pure|mp>[-ckpt][-noreshard]-fsdp2-np<N>.json
with, per rank, the step summaries of hf_step_events.py (live at start, peak, its phase, the
phase maxima, categories at the peak, event counts; step 2 is the one compared).

    /tmp/venv-torch/bin/python tools/hf_step_fsdp2.py --nprocs 2 --attention eager --ckpt off
    for n in 2 4; do /tmp/venv-torch/bin/python tools/hf_step_fsdp2.py --nprocs $n \
        --family all --attention all --ckpt all --reshard all --mp all \
        --write tests/data/hf_step_fsdp2; done                 # about 8 minutes on 2 cores

Two runs write identical goldens.
"""
import argparse
import gc
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ODD = dict(vocab=1001, intermediate=353)


def run_rank(rank, nprocs, port, configs, queue):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import record_function

    import hf_step_events as hse

    # gloo runs each collective on a worker thread that keeps a reference to the Work (and so to
    # its tensors) until it has moved on: when FSDP drops its own reference first, the buffer is
    # freed on that thread, outside the profile, and the trace would hold it forever (a race:
    # runs differed). Waiting for the collective here and giving the worker a moment to let go
    # keeps every free of FSDP's buffers on the main thread, as on a GPU, where NCCL's work
    # holds no tensor the caching allocator would free.
    import time
    for fn_name in ("all_gather_single", "reduce_scatter_single"):
        plain = getattr(dist, fn_name)

        def settled(*args, _plain=plain, **kwargs):
            want_work = kwargs.get("async_op", False)
            kwargs["async_op"] = True
            work = _plain(*args, **kwargs)
            work.wait()
            time.sleep(0.005)
            return work if want_work else None
        setattr(dist, fn_name, settled)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=nprocs)
    mesh = init_device_mesh("cpu", (nprocs,))
    results = []
    for cfg in configs:
        hse.BASE.update(cfg["dims"])
        torch.set_num_threads(1)
        torch.manual_seed(0)
        marks = hse.Marks()
        gc.collect()
        with hse.profiler() as prof:
            tied = cfg["family"] == "llama-tied"
            version, model = hse.build("llama" if tied else cfg["family"], cfg["attention"],
                                       torch.float32 if cfg["mp"] else torch.bfloat16, tied=tied)
            extra = {}
            if cfg["mp"]:  # fp32 model, gathered in bf16, gradients reduced in fp32
                from torch.distributed.fsdp import MixedPrecisionPolicy
                extra["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                          reduce_dtype=torch.float32)
            model.train()
            if cfg["ckpt"]:
                model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False})
            for layer in model.model.layers:
                if cfg["reshard"]:
                    fully_shard(layer, mesh=mesh, **extra)
                else:
                    fully_shard(layer, mesh=mesh, reshard_after_forward=False, **extra)
            fully_shard(model, mesh=mesh, **extra)
            params = list(model.parameters())
            opt = torch.optim.AdamW(params, foreach=True)
            gen = torch.Generator().manual_seed(rank)
            input_ids = torch.randint(0, hse.BASE["vocab"], (hse.BATCH, hse.SEQ), generator=gen)
            labels = input_ids.clone()
            plain_loss = model.loss_function

            def loss_fn(*args, **kwargs):
                with record_function(hse.PREFIX + "loss"):
                    return plain_loss(*args, **kwargs)
            model.loss_function = loss_fn

            def local(ts):
                return [t.to_local() if hasattr(t, "to_local") else t for t in ts
                        if t is not None]

            def state_tensors():
                return local(t for st in opt.state.values() for t in st.values()
                             if isinstance(t, torch.Tensor))

            gc.collect()
            gc.disable()
            out = None
            for step in range(1, hse.STEPS + 1):
                marks.mark("start", {"parameter": local(params),
                                     "buffer": list(model.buffers()),
                                     "input": [input_ids, labels],
                                     "optimizer_state": state_tensors()})
                with record_function(f"{hse.PREFIX}step{step}"):
                    with record_function(hse.PREFIX + "forward"):
                        out = model(input_ids=input_ids, labels=labels)
                    with record_function(hse.PREFIX + "backward"):
                        out.loss.backward()
                    marks.mark("after_backward", {"gradient": local(p.grad for p in params)})
                    with record_function(hse.PREFIX + "optimizer"):
                        opt.step()
                        marks.mark("after_optimizer", {"optimizer_state": state_tensors()})
                    with record_function(hse.PREFIX + "zero_grad"):
                        opt.zero_grad(set_to_none=True)
            gc.enable()
            out = None
        allocs, scopes = hse.trace(prof)
        # What the gloo backend allocates inside a collective (its staging copies, on the main
        # thread inside c10d's op or on gloo's worker thread): NCCL allocates nothing of the
        # kind, so these are left out, and their largest total at once is recorded. The
        # profiler's allocation ids are counted per thread (a gloo thread's collide with the
        # main thread's), so every event is re-keyed here by its address, in time order: an
        # allocation gets a fresh id, a free the id of the live block at its address.
        kept, backend, live_b, max_b, n_backend = [], {}, 0, 0, 0
        by_ptr, next_id, unpaired_in_steps = {}, 0, 0
        for a in allocs:
            ptr, size, path = a[1], a[3], a[4][0]
            if size > 0 and ("c10d::" in path or "gloo:" in path):
                backend[ptr] = size
                n_backend += 1
                live_b += size
                max_b = max(max_b, live_b)
                continue
            if size < 0 and ptr in backend:
                live_b -= backend.pop(ptr)
                continue
            if size > 0:
                next_id += 1
                by_ptr[ptr] = next_id
                key = next_id
            else:
                key = by_ptr.pop(ptr, None)
                if key is None:  # allocated before the profile: stays unpaired
                    next_id += 1
                    key = -next_id
                    unpaired_in_steps += a[6] > 0
            kept.append((a[0], ptr, key) + tuple(a[3:]))
        allocs = kept
        steps, unpaired = hse.analyse(allocs, scopes, marks)
        summaries = []
        for s in steps:
            s = dict(s)
            if cfg.get("dump") and s["step"] == hse.STEPS and rank == 0:
                live = s["live_at_start_bytes"]
                for e in s["compact_events"]:
                    live += e[0]
                    print(f"DUMP {e[0]:>+10} {live:>10} {hse.PHASES[e[2]]:<9} "
                          f"{hse.CATEGORIES[e[3]]:<15} {s['_ops'][e[4]][0]} | "
                          f"{s['_ops'][e[4]][1][len(hse.NODE_PREFIX):]}", flush=True)
            s.pop("compact_events")
            s.pop("_ops")
            s.pop("_peak_live")
            summaries.append(s)
        results.append(dict(
            name=cfg["name"], rank=rank, version=version, unpaired_frees=unpaired,
            gloo_internal_allocations=n_backend, gloo_internal_max_live_bytes=max_b,
            unpaired_frees_in_steps=unpaired_in_steps,
            parameters=sum(p.numel() for p in params),
            sharded_parameter_bytes=sum(p.to_local().untyped_storage().nbytes() for p in params),
            step_summaries=summaries,
            config=json.loads(model.config.to_json_string(use_diff=False))))
        del model, opt, params, prof
        gc.collect()
    queue.put((rank, results))
    dist.destroy_process_group()


def configs_for(a):
    fams = ["llama", "qwen2"] if a.family == "all" else [a.family]
    atts = ["eager", "sdpa"] if a.attention == "all" else [a.attention]
    ckpts = [False, True] if a.ckpt == "all" else [a.ckpt == "on"]
    reshards = [True, False] if a.reshard == "all" else [a.reshard == "on"]
    mps = [False, True] if a.mp == "all" else [a.mp == "on"]
    out = []
    for fam in fams:
        for att in atts:
            for ck in ckpts:
                for rs in reshards:
                    for mp in mps:
                        name = (f"{fam}-5.25{'-sdpa' if att == 'sdpa' else ''}"
                                f"{'-mp' if mp else '-pure'}"
                                f"{'-ckpt' if ck else ''}{'' if rs else '-noreshard'}")
                        out.append(dict(name=name, family=fam, attention=att, ckpt=ck,
                                        reshard=rs, mp=mp, dims=dict(ODD)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--family", default="llama",
                    choices=["llama", "qwen2", "qwen3", "llama-tied", "all"],
                    help="all: llama and qwen2 (qwen3 and llama-tied, tied embeddings, one by "
                         "one)")
    ap.add_argument("--attention", default="eager", choices=["eager", "sdpa", "all"])
    ap.add_argument("--ckpt", default="off", choices=["off", "on", "all"])
    ap.add_argument("--reshard", default="on", choices=["on", "off", "all"],
                    help="reshard_after_forward of the layers (off: SHARD_GRAD_OP)")
    ap.add_argument("--mp", default="off", choices=["on", "off", "all"],
                    help="on: an fp32 model under MixedPrecisionPolicy(param_dtype=bfloat16, "
                         "reduce_dtype=float32) (golden names -mp instead of -pure)")
    ap.add_argument("--port", type=int, default=29541)
    ap.add_argument("--write", metavar="DIR")
    ap.add_argument("--dump", action="store_true", help="print rank 0's step-2 events")
    a = ap.parse_args()
    import torch.multiprocessing as mp
    configs = configs_for(a)
    for c in configs:
        c["dump"] = a.dump
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run_rank, args=(r, a.nprocs, a.port, configs, q))
             for r in range(a.nprocs)]
    for p in procs:
        p.start()
    results = sorted((q.get() for _ in procs), key=lambda x: x[0])
    for p in procs:
        p.join()
    failed = False
    for ci, cfg in enumerate(configs):
        print(f"{cfg['name']} np{a.nprocs}:")
        ranks = []
        for rank, res in results:
            r = res[ci]
            ranks.append(r)
            s = r["step_summaries"][-1]
            print(f"  rank {rank}: start {s['live_at_start_bytes']:,} peak {s['peak_live_bytes']:,}"
                  f" in {s['peak_phase']}; phases " + ", ".join(
                      f"{p} {v:,}" for p, v in s["phase_max_live_bytes"].items()) +
                  f"; unpaired in the steps {r['unpaired_frees_in_steps']}; at peak "
                  f"{s['by_category_at_peak']}")
            failed = failed or r["unpaired_frees_in_steps"] != 0
        if a.write:
            import torch
            doc = dict(
                configuration=cfg["name"], nprocs=a.nprocs, family=cfg["family"],
                attention=cfg["attention"], checkpointing=cfg["ckpt"],
                reshard_after_forward_layers=cfg["reshard"],
                recipe="mixed_precision_policy" if cfg["mp"] else "pure",
                dtype="float32" if cfg["mp"] else "bfloat16",
                mixed_precision_policy=("MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
                                        "reduce_dtype=torch.float32)") if cfg["mp"] else None,
                batch=2, seq=64, steps=2, recorded_step=2, adamw_impl="foreach",
                versions={"transformers": ranks[0]["version"],
                          "torch": torch.__version__.split("+")[0],
                          "python": sys.version.split()[0]},
                fsdp="fully_shard(layer[, reshard_after_forward=False]) per decoder layer, then "
                     "fully_shard(model); gloo, CPU, one intra-op thread",
                config=ranks[0]["config"],
                ranks=[{k: v for k, v in r.items() if k not in ("config", "version", "name")}
                       for r in ranks])
            os.makedirs(a.write, exist_ok=True)
            path = os.path.join(a.write, f"{cfg['name']}-fsdp2-np{a.nprocs}.json")
            with open(path, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
            print(f"  wrote {path}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
