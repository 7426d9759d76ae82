#!/usr/bin/env python3
"""Records every allocation and free of a whole HuggingFace training step, per precision recipe.

This is the reference behind issue 31 (points 1-2): the exact sequence of tensor-storage
allocations and frees of a real transformers + PyTorch training step, run on the CPU, written as
goldens (tests/data/hf_step/*.json) that C++ tests compare against without PyTorch.

The step (the loop, literally; two steps, each recorded and summarised separately):
    for step in (1, 2):
        out = model(input_ids=input_ids, labels=labels)   # phases "forward" and "loss"
        out.loss.backward()                               # phase "backward"
        opt.step()                                        # phase "optimizer"
        opt.zero_grad(set_to_none=True)                   # phase "zero_grad"
`out` is a plain loop variable: step 1's output (logits, loss, the KV cache that HF 5 builds in
training when config.use_cache is True and checkpointing is off) stays alive until step 2's
model call returns and the name is rebound; its frees are in step 2's "forward" phase. With
--release-out the loop does `del out` right after backward instead (what HF Trainer's
training_step effectively does). "loss" is the time inside model.loss_function (HF 5's
ForCausalLMLoss: logits.float(), pad/shift of the labels, cross_entropy), which runs inside the
model call; "forward" is the rest of the model call.

Recipes:
  pure   the model in bf16 (model.to(torch.bfloat16)); torch.optim.AdamW(foreach=True) on its
         parameters, so the gradients and both moments are bf16 (the `step` counters are 4-byte
         fp32 scalars, one per parameter).
  amp    the model in fp32; forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)
         (HF Trainer with bf16=True); backward outside autocast; fp32 AdamW(foreach=True). The
         autocast context's exit (which empties autocast's cache of bf16 weight copies) is its own
         phase, "autocast_exit", between "loss" and "backward".
  mixed  the model in bf16 plus an fp32 master copy of every parameter (made once, before step
         1: m = p.detach().float().requires_grad_()), AdamW(foreach=True) on the masters (fp32
         moments). The optimizer phase is, in this order:
           for p, m in zip(params, masters): m.grad = p.grad.float()   # fp32 gradient copies
           opt.step()                                                  # on the fp32 masters
           for p, m in zip(params, masters): p.detach().copy_(m)       # bf16 <- fp32, in place
         and the zero_grad phase: opt.zero_grad(set_to_none=True) (master grads to None), then
         model.zero_grad(set_to_none=True) (bf16 grads to None).

The tracer: PyTorch's own profiler with profile_memory=True (torch.profiler.profile, CPU
activity), read through its event tree (kineto_results.experimental_event_tree()). Each
[memory] event is a call of the CPU allocator (c10's DefaultCPUAllocator reports every
allocation and free to the profiler), with the pointer, the requested size and an allocation id
that pairs the free with its allocation. This is the true, complete sequence at the allocator:
it includes what kernels allocate internally (workspaces, reductions' buffers, oneDNN
scratchpads) and what the autograd engine and the optimizer allocate, which a
TorchDispatchMode would miss (it sees op outputs only, and sees frees only through Python
wrappers, which outlive or underlive the C++ storage); torch.distributed._tools.mem_tracker is
such a mode (it agrees to within a few bytes, see the cross-check below, but misses kernels'
scratch buffers). How it is made complete:
  - the profiler starts before the model is built: the CPU allocator reports the free of a block
    only if the block was allocated while profiling (it looks its size up in a table filled
    then), so everything the steps free must be allocated inside the profile;
  - torch.set_num_threads(1): the profiler's "enabled" flag is thread-local, so allocations made
    by intra-op worker threads would go unseen; with one thread (and autograd running CPU work
    on the calling thread) every allocation is on the main thread, and the sequence does not
    depend on the thread count;
  - gc.collect() before step 1 and gc disabled during the steps: frees happen when reference
    counts drop, not when a cycle collection happens to run.
A free whose allocation is not in the profile is counted (unpaired_frees) and must be 0.
Phases and steps come from the event tree (each allocation's enclosing record_function scopes),
not from timestamps. One order is made canonical: autocast keeps its cache of casts in a hash
map keyed by address, so the frees at the context's exit come in an order that varies from run
to run; they are listed in allocation order. With that, two runs write identical goldens.
What it cannot see: allocator rounding and caching (sizes are the requested nbytes of each
storage; on a GPU the caching allocator rounds blocks to 512 B and keeps freed blocks);
allocations outside c10's CPU allocator (Python objects, malloc inside libraries that bypass
c10); and CPU-specific kernels' internal allocations differ from CUDA's (the events say which
phase they are in, and they are usually tiny). Each storage is counted once, at its allocation.

Categories (derived, per allocation): parameter, buffer, input, master_param (the ones live at
a step's start, by storage pointer), gradient (p.grad after backward), master_grad (mixed
recipe's m.grad), optimizer_state (AdamW's exp_avg, exp_avg_sq, step after opt.step()),
autocast_cache (allocated in forward/loss, freed at autocast_exit), activation (allocated in
forward/loss, still live when backward starts: what autograd saved, the logits, the loss, the
cache), workspace (allocated and freed inside one call of one op: a kernel's scratch, CPU
specific), temporary (everything else allocated in a step), other (allocated while building and
still live, none of the above).

Self-test (--selftest): a toy case with a hand-computed peak. Under the tracer,
  a = x @ w1 (64x256 fp32: 65,536 B); b = a.relu() (65,536 B); del a; c = b @ w2 (64x128:
  32,768 B); del b, c
peaks at 131,072 B (a and b live) with 3 allocations and 3 frees, ending at 0: exact. The same
in bf16 shows what the tracer sees beyond op outputs: each bf16 aten::mm on the CPU allocates
and frees a scratch buffer of its own (33,792 B for 64x128 @ 128x256, 50,176 B for
64x256 @ 256x128; category "workspace": allocated and freed inside one call of one op), so the
bf16 peak is at the second mm, b + c + its scratch = 32,768 + 16,384 + 50,176 = 99,328 B, not
at a + b = 65,536 B. Checked: both exact (torch 2.15.0, CPU, one thread).
Cross-check: torch.distributed._tools.mem_tracker.MemTracker does work on the CPU in torch
2.15 (no rounding there; a TorchDispatchMode that sees op outputs); on the LLaMA
configuration's literal loop it reports peaks of 9,745,344 B (pure), 16,602,876 B (amp) and
8,356,796 B (pure, checkpointing) against this tracer's 9,745,368, 16,602,888 and 8,356,806 B:
the 10-24 B differences are small scratch buffers (AdamW's 8-byte _foreach_div_ temporary, a
2-byte .to()) that it does not see.

Checked: transformers 5.25.0 with PyTorch 2.15.0 (pip wheel, CPU run, one thread),
2026-12-04, all 48 configurations (4 families x eager/sdpa x checkpointing off/on x 3 recipes);
two runs write byte-identical goldens. Issue 31's figures for LLaMA h128 (pure 9,565,120 B at
the loss, amp 16,244,992 B) were not reproduced exactly by this configuration (9,745,368 B in
backward, 16,602,888 B) nor by any of a grid of vocabulary, intermediate size and KV heads; its
qualitative claims were (docs/hf-step-measured.md). Install and run:
  python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch "numpy<2"
  python3 tools/hf_saved_tensors.py --install 5.25.0 --target /tmp/hf/5.25.0
  /tmp/venv-torch/bin/python tools/hf_step_events.py --transformers /tmp/hf/5.25.0 --selftest
  /tmp/venv-torch/bin/python tools/hf_step_events.py --transformers /tmp/hf/5.25.0 \\
      --family all --attention all --ckpt all --recipe all --write tests/data/hf_step
One configuration, printed only:
  /tmp/venv-torch/bin/python tools/hf_step_events.py --transformers /tmp/hf/5.25.0 \\
      --family llama --attention eager --ckpt off --recipe pure
Goldens: tests/data/hf_step/<family>-5.25[-sdpa]-<recipe>[-ckpt].json; the LLaMA ones carry
the full event list of step 2 as [[+bytes|-bytes, id, phase_code, category_code, op_index], ...]
(id: the allocation's number in order of first appearance in that list; allocations made before
the step and freed in it appear only with their free), the others summaries only. op_index
names the op the allocation or free happened in: entry op_index of the tables "op_names" (the
innermost profiler event enclosing the [memory] event: an aten op such as aten::mm or
aten::empty_strided (what .to() allocates through), an autograd node's evaluate_function when
the engine itself frees, or a record_function such as Optimizer.step#AdamW.step) and
"op_nodes" (the autograd node, "autograd::engine::evaluate_function: MmBackward0", enclosing
that op in backward; "" when none). Entries are pairs in order of first use; a name repeats
with another node. "(none)" is an event with no op around it, directly in one of our phase
scopes: frees as Python drops the last reference between ops (step 1's `out` at the rebinding,
autocast's cache at its exit, model.zero_grad's grads), the 8-B 0-dim tensors into which
Python's argument parser wraps a Python number before the op starts (`x * scaling`,
`variance + eps`), and, with checkpointing, the 5,056-B CPU RNG state that checkpoint saves per
layer (torch.get_rng_state(), not an aten op). Adding the ops changed no other field: the
summaries, event order and ids are those of the goldens written before them.
"""

import argparse
import gc
import json
import os
import sys

# --transformers DIR must come first on the path, before anything imports transformers.
if "--transformers" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--transformers") + 1])

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402
from torch._C._profiler import _EventType  # noqa: E402

PHASES = ["forward", "loss", "backward", "optimizer", "zero_grad", "autocast_exit", "other"]
CATEGORIES = ["parameter", "gradient", "optimizer_state", "activation", "temporary",
              "autocast_cache", "master_param", "master_grad", "input", "buffer", "other",
              "workspace"]
PREFIX = "trainmem::"

# Small configurations (issue 31): 3 layers, hidden 128, 4 heads, 2 KV heads, intermediate 352,
# vocabulary 1000, no tied embeddings; each family with what makes it itself.
BASE = dict(vocab=1000, hidden=128, intermediate=352, layers=3, heads=4, kv_heads=2)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": False}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"use_sliding_window": False, "head_dim": 32}),
}
BATCH, SEQ, STEPS = 2, 64, 2


# ----------------------------------------------------------------------------- the tracer

def walk(nodes):
    for n in nodes:
        yield n
        yield from walk(n.children)


def trace(prof):
    """Allocation events (time, ptr, alloc_id, bytes) in order, and our record_function scopes
    (name, start, end)."""
    allocs, scopes = [], []
    for order, n in enumerate(walk(prof.profiler.kineto_results.experimental_event_tree())):
        if n.tag == _EventType.Allocation:
            e = n.extra_fields
            if e.device.type != "cpu" or e.alloc_size == 0:
                continue
            phase, step = scope_of(n)
            owner = None
            if n.parent is not None and not n.parent.name.startswith(PREFIX):
                owner = (n.parent.name, n.parent.start_time_ns)
            allocs.append((n.start_time_ns, order, e.ptr, e.allocation_id, e.alloc_size,
                           (op_path(n), owner, op_of(n)), phase, step))
        elif n.name.startswith(PREFIX):
            scopes.append((n.name[len(PREFIX):], n.start_time_ns, n.end_time_ns))
    allocs.sort()
    return [(t, p, a, s, o, ph, st) for t, _, p, a, s, o, ph, st in allocs], scopes


def scope_of(n):
    """Phase and step of an allocation event: from its enclosing record_function scopes (the
    event tree's ancestry, not timestamps)."""
    phase, step = None, 0
    n = n.parent
    while n is not None:
        if n.name.startswith(PREFIX):
            name = n.name[len(PREFIX):]
            if phase is None and name in PHASES:
                phase = name
            if name.startswith("step") and name[4:].isdigit():
                step = int(name[4:])
                break
        n = n.parent
    return phase or "other", step


NODE_PREFIX = "autograd::engine::evaluate_function: "
NO_OP = "(none)"


def op_of(n):
    """The op an allocation or free happened in, for the goldens: (innermost enclosing profiler
    event, the autograd node enclosing that event or ""). The innermost event is NO_OP when the
    [memory] event sits directly in one of our record_function scopes (no op running: a free
    when Python drops the last reference, outside any op)."""
    p = n.parent
    if p is None or p.name.startswith(PREFIX):
        return NO_OP, ""
    node = ""
    a = p.parent
    while a is not None and not a.name.startswith(PREFIX):
        if a.name.startswith(NODE_PREFIX):
            node = a.name
            break
        a = a.parent
    return p.name, node


def op_path(n):
    """The ops an allocation happened in, innermost last (for --show-peak only)."""
    names = []
    n = n.parent
    while n is not None and not n.name.startswith(PREFIX) and len(names) < 3:
        names.append(n.name)
        n = n.parent
    return " < ".join(names)


class Marks:
    """Points in the run where Python tells which live storages are what (by data pointer)."""

    def __init__(self):
        self.items = []  # (name, {ptr: category})

    def mark(self, name, tensors_by_category):
        ptrs = {}
        for cat, tensors in tensors_by_category.items():
            for t in tensors:
                if t is not None and t.untyped_storage().nbytes() > 0:
                    ptrs.setdefault(t.untyped_storage().data_ptr(), cat)
        idx = len(self.items)
        self.items.append((name, ptrs))
        with record_function(f"{PREFIX}mark::{idx}"):
            pass


def analyse(allocs, scopes, marks):
    """Replays the events: phase and step of each, categories, per-step summaries."""
    phase_scopes = [(n, s, e) for n, s, e in scopes if n in PHASES]
    step_scopes = sorted((int(n[4:]), s, e) for n, s, e in scopes if n.startswith("step")
                         and n[4:].isdigit())
    mark_times = sorted((s, int(n.split("::")[1])) for n, s, e in scopes
                        if n.startswith("mark::"))

    def step_at(t):
        for k, s, e in step_scopes:
            if s <= t <= e:
                return k
        return 0

    backward_start = {}
    for n, s, e in phase_scopes:
        if n == "backward":
            backward_start[step_at(s)] = s

    info = {}      # alloc_id -> dict(bytes, t_alloc, phase_alloc, step_alloc, t_free, phase_free)
    events = []    # (t, +/-bytes, alloc_id, phase, step)
    live_ptr = {}  # ptr -> alloc_id
    unpaired = 0
    mi = 0
    for t, ptr, aid, size, op, ph, st in allocs:
        while mi < len(mark_times) and mark_times[mi][0] <= t:
            resolve_mark(marks.items[mark_times[mi][1]][1], live_ptr, info)
            mi += 1
        if size > 0:
            info[aid] = dict(bytes=size, t=t, phase=ph, step=st, t_free=None, free_phase=None,
                             cat=None, op=op[0], owner=op[1], scratch=False)
            live_ptr[ptr] = aid
        else:
            if aid not in info:
                unpaired += 1
                continue
            info[aid]["t_free"] = t
            info[aid]["free_phase"] = ph
            # Allocated and freed within one call of one op: the kernel's own scratch.
            info[aid]["scratch"] = op[1] is not None and op[1] == info[aid]["owner"]
            live_ptr.pop(ptr, None)
        events.append((t, size, aid, ph, st, op[2]))
    while mi < len(mark_times):
        resolve_mark(marks.items[mark_times[mi][1]][1], live_ptr, info)
        mi += 1
    # Autocast keeps its cache of casts in a hash map keyed by address: the frees at the
    # context's exit come in an order that varies from run to run. List each run of them in
    # allocation order.
    i = 0
    while i < len(events):
        j = i
        while j < len(events) and events[j][3] == "autocast_exit" and events[j][1] < 0:
            j += 1
        if j > i + 1:
            times = [ev[0] for ev in events[i:j]]
            run = sorted(events[i:j], key=lambda ev: info[ev[2]]["t"])
            events[i:j] = [(t,) + ev[1:] for t, ev in zip(times, run)]
        i = max(j, i + 1)

    for aid, a in info.items():
        if a["cat"] is not None:
            continue
        if a["step"] == 0:
            a["cat"] = "other"
        elif a["scratch"]:
            a["cat"] = "workspace"
        elif a["phase"] in ("forward", "loss") and a["free_phase"] == "autocast_exit":
            a["cat"] = "autocast_cache"
        elif (a["phase"] in ("forward", "loss") and
              (a["t_free"] is None or a["t_free"] > backward_start.get(a["step"], 0))):
            a["cat"] = "activation"
        else:
            a["cat"] = "temporary"

    steps = []
    for k, s, e in step_scopes:
        live = {aid: a for aid, a in info.items() if a["t"] < s and
                (a["t_free"] is None or a["t_free"] >= s)}
        start_bytes = sum(a["bytes"] for a in live.values())
        start_by_cat = by_category(live.values())
        evs = [ev for ev in events if s <= ev[0] <= e]
        cur, peak, peak_i = start_bytes, start_bytes, -1
        phase_max = {}
        live_now = dict(live)
        peak_live = dict(live)
        for i, (t, size, aid, ph, st, _) in enumerate(evs):
            cur += size
            if size > 0:
                live_now[aid] = info[aid]
            else:
                live_now.pop(aid, None)
            if ph not in phase_max or cur > phase_max[ph]:
                phase_max[ph] = cur
            if cur > peak:
                peak, peak_i = cur, i
                peak_live = dict(live_now)
        ids, ops, compact = {}, {}, []
        for t, size, aid, ph, st, op in evs:
            if aid not in ids:
                ids[aid] = len(ids)
            if op not in ops:
                ops[op] = len(ops)
            compact.append([size, ids[aid], PHASES.index(ph),
                            CATEGORIES.index(info[aid]["cat"]), ops[op]])
        steps.append({
            "step": k,
            "live_at_start_bytes": start_bytes,
            "live_at_start_by_category": start_by_cat,
            "peak_live_bytes": peak,
            "peak_over_start_bytes": peak - start_bytes,
            "peak_phase": evs[peak_i][3] if peak_i >= 0 else "start",
            "peak_event_index": peak_i,
            "phase_max_live_bytes": {p: phase_max[p] for p in PHASES if p in phase_max},
            "phase_max_over_start_bytes": {p: phase_max[p] - start_bytes for p in PHASES
                                           if p in phase_max},
            "live_at_end_bytes": cur,
            "events": len(evs),
            "allocations": sum(1 for ev in evs if ev[1] > 0),
            "frees": sum(1 for ev in evs if ev[1] < 0),
            "allocated_bytes": sum(ev[1] for ev in evs if ev[1] > 0),
            "by_category_at_peak": by_category(peak_live.values()),
            "compact_events": compact,
            "_ops": list(ops),
            "_peak_live": peak_live,
        })
    return steps, unpaired


def resolve_mark(ptrs, live_ptr, info):
    for ptr, cat in ptrs.items():
        aid = live_ptr.get(ptr)
        if aid is not None and info[aid]["cat"] is None:
            info[aid]["cat"] = cat


def by_category(allocs):
    out = {}
    for a in allocs:
        out[a["cat"] or "other"] = out.get(a["cat"] or "other", 0) + a["bytes"]
    return {c: out[c] for c in CATEGORIES if c in out}


def profiler():
    return profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True)


# ----------------------------------------------------------------------------- self-test

def selftest():
    """A toy case whose peak is computed by hand (see the docstring)."""
    torch.set_num_threads(1)
    ok = True
    for dtype, elt in ((torch.float32, 4), (torch.bfloat16, 2)):
        with profiler() as prof:
            x = torch.randn(64, 128, dtype=dtype)
            w1 = torch.randn(128, 256, dtype=dtype)
            w2 = torch.randn(256, 128, dtype=dtype)
            with record_function(PREFIX + "step1"):
                with record_function(PREFIX + "forward"):
                    a = x @ w1
                    b = a.relu()
                    del a
                    c = b @ w2
                    del b, c
            del x, w1, w2
        allocs, scopes = trace(prof)
        steps, unpaired = analyse(allocs, scopes, Marks())
        s = steps[0]
        cats = [CATEGORIES[e[3]] for e in s["compact_events"]]
        scratch = [e[0] for e in s["compact_events"]
                   if e[0] > 0 and CATEGORIES[e[3]] == "workspace"]
        want = 2 * 64 * 256 * elt  # a and b
        if scratch:
            # bf16 GEMMs on the CPU allocate a scratch buffer inside aten::mm (freed before
            # the op returns); the peak is then at the second mm: b, c and its scratch.
            want = max(want + scratch[0], 64 * 256 * elt + 64 * 128 * elt + scratch[1])
        got = s["peak_over_start_bytes"]
        good = (got == want and s["allocations"] == 3 + len(scratch) and
                s["frees"] == s["allocations"] and cats.count("workspace") == 2 * len(scratch)
                and s["live_at_end_bytes"] == s["live_at_start_bytes"] and unpaired == 0)
        print(f"selftest {dtype}: peak over start {got} (hand: {want}; op scratch {scratch}), "
              f"{s['allocations']} allocations, {s['frees']} frees, unpaired {unpaired}: "
              f"{'ok' if good else 'WRONG'}")
        ok = ok and good
    return ok


# ----------------------------------------------------------------------------- the step

def build(family, attention, dtype, tied=False):
    import transformers
    config_name, model_name, extra = FAMILIES[family]
    kw = dict(vocab_size=BASE["vocab"], hidden_size=BASE["hidden"],
              intermediate_size=BASE["intermediate"], num_hidden_layers=BASE["layers"],
              num_attention_heads=BASE["heads"], num_key_value_heads=BASE["kv_heads"],
              max_position_embeddings=2048, tie_word_embeddings=tied,
              attn_implementation=attention)
    kw.update(extra)
    config = getattr(transformers, config_name)(**kw)
    model = getattr(transformers, model_name)(config)
    return transformers.__version__, model.to(dtype)


def run_one(family, attention, ckpt, recipe, loop="literal", adamw="foreach"):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    marks = Marks()
    gc.collect()
    with profiler() as prof:
        version, model = build(family, attention,
                               torch.float32 if recipe == "amp" else torch.bfloat16)
        model.train()
        if ckpt:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        params = list(model.parameters())
        masters = []
        impl = ADAMW_KWARGS[adamw]
        if recipe == "mixed":
            masters = [p.detach().float().requires_grad_() for p in params]
            opt = torch.optim.AdamW(masters, **impl)
        else:
            opt = torch.optim.AdamW(params, **impl)
        input_ids = torch.randint(0, BASE["vocab"], (BATCH, SEQ))
        labels = input_ids.clone()
        plain_loss = model.loss_function

        def loss_fn(*args, **kwargs):
            with record_function(PREFIX + "loss"):
                return plain_loss(*args, **kwargs)
        model.loss_function = loss_fn

        def state_tensors():
            return [t for st in opt.state.values() for t in st.values()
                    if isinstance(t, torch.Tensor)]

        gc.collect()
        gc.disable()
        out = None
        for step in range(1, STEPS + 1):
            marks.mark("start", {"parameter": params, "master_param": masters,
                                 "buffer": list(model.buffers()), "input": [input_ids, labels],
                                 "optimizer_state": state_tensors()})
            with record_function(f"{PREFIX}step{step}"):
                with record_function(PREFIX + "forward"):
                    if recipe == "amp":
                        ctx = torch.autocast("cpu", dtype=torch.bfloat16)
                        ctx.__enter__()
                    if loop == "trainer":
                        out = None
                        loss = model(input_ids=input_ids, labels=labels).loss
                    else:
                        out = model(input_ids=input_ids, labels=labels)
                        loss = out.loss
                if recipe == "amp":
                    with record_function(PREFIX + "autocast_exit"):
                        ctx.__exit__(None, None, None)
                with record_function(PREFIX + "backward"):
                    loss.backward()
                marks.mark("after_backward", {"gradient": [p.grad for p in params]})
                with record_function(PREFIX + "optimizer"):
                    if recipe == "mixed":
                        for p, m in zip(params, masters):
                            m.grad = p.grad.float()
                        marks.mark("master_grads", {"master_grad": [m.grad for m in masters]})
                        opt.step()
                        with torch.no_grad():
                            for p, m in zip(params, masters):
                                p.detach().copy_(m)
                    else:
                        opt.step()
                    marks.mark("after_optimizer", {"optimizer_state": state_tensors()})
                with record_function(PREFIX + "zero_grad"):
                    opt.zero_grad(set_to_none=True)
                    if recipe == "mixed":
                        model.zero_grad(set_to_none=True)
        gc.enable()
        loss_value = float(loss.detach().float())
        out = loss = None
    allocs, scopes = trace(prof)
    steps, unpaired = analyse(allocs, scopes, marks)
    param_bytes = sum(p.untyped_storage().nbytes() for p in params)
    result = {
        "family": family, "attention": attention, "checkpointing": ckpt, "recipe": recipe,
        "config": json.loads(model.config.to_json_string(use_diff=False)),
        "versions": {"transformers": version, "torch": torch.__version__.split("+")[0],
                     "python": sys.version.split()[0]},
        "threads": 1, "device": "cpu",
        "loop": LOOP_TEXT[loop],
        "recipe_detail": RECIPE_TEXT[recipe],
        "optimizer": (f"torch.optim.AdamW({', '.join(f'{k}={v}' for k, v in ADAMW_KWARGS[adamw].items())})"
                      ", defaults (lr 1e-3, weight_decay 1e-2)"),
        "adamw_impl": adamw,
        "batch": BATCH, "seq": SEQ, "steps": STEPS, "recorded_step": STEPS,
        "parameters": sum(p.numel() for p in params), "parameter_bytes": param_bytes,
        "unpaired_frees": unpaired,
        "loss_after_step_2_forward": loss_value,
        "phase_codes": PHASES, "category_codes": CATEGORIES,
        "step_summaries": steps,
    }
    return result


# torch.optim.AdamW's implementations (--adamw): foreach (the goldens' default, as on a GPU), fused
# (torch >= 2.4 runs it on the CPU too) and the single-tensor for-loop.
ADAMW_KWARGS = {"foreach": {"foreach": True}, "fused": {"fused": True},
                "forloop": {"foreach": False}}

LOOP_TEXT = {
    "literal": ("for step in (1, 2): out = model(input_ids=input_ids, labels=labels); "
                "out.loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)  "
                "(out of step 1 lives until step 2's model call returns)"),
    "trainer": ("for step in (1, 2): loss = model(input_ids=input_ids, labels=labels).loss; "
                "loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)  "
                "(the model output, with logits and cache, dropped as the model call returns)"),
}

RECIPE_TEXT = {
    "pure": "model.to(bfloat16); AdamW on the bf16 parameters (bf16 exp_avg, exp_avg_sq)",
    "amp": ("fp32 model; forward+loss under torch.autocast('cpu', dtype=torch.bfloat16), "
            "exited before backward (phase autocast_exit); AdamW fp32"),
    "mixed": ("bf16 model; fp32 masters m = p.detach().float() made before step 1; optimizer "
              "phase: m.grad = p.grad.float() for all, AdamW(foreach).step() on the masters, "
              "p.copy_(m) for all; zero_grad phase: opt.zero_grad(set_to_none=True) then "
              "model.zero_grad(set_to_none=True)"),
}


def golden_name(family, version, attention, recipe, ckpt):
    major_minor = ".".join(version.split(".")[:2])
    return (f"{family}-{major_minor}{'-sdpa' if attention == 'sdpa' else ''}-{recipe}"
            f"{'-ckpt' if ckpt else ''}.json")


def write_golden(res, directory, with_events, limit=300_000):
    doc = dict(res)
    doc["step_summaries"] = []
    events = ops = None
    for s in res["step_summaries"]:
        s = dict(s)
        ev = s.pop("compact_events")
        op = s.pop("_ops")
        s.pop("_peak_live")
        if s["step"] == res["recorded_step"]:
            events, ops = ev, op
        doc["step_summaries"].append(s)
    if with_events:
        doc["events"] = events
        doc["events_format"] = (
            "[+bytes|-bytes, id, phase_code, category_code, op_index] of step 2; op_index: "
            "the op the allocation or free happened in, the pair (op_names[op_index], "
            "op_nodes[op_index]): op_names the innermost profiler event enclosing it (an aten "
            f"op, an autograd node, a record_function such as Optimizer.step#AdamW.step; "
            f"'{NO_OP}' when no op was running: a free as Python drops the last reference), "
            "op_nodes the autograd node enclosing that op in backward ('' when none); "
            "entries in order of first use, a name may repeat with another node")
        doc["op_names"] = [o[0] for o in ops]
        doc["op_nodes"] = [o[1] for o in ops]
    text = json.dumps(doc, indent=1, sort_keys=False)
    if with_events:
        # One event a line keeps the file readable and diffable.
        head = json.dumps({k: v for k, v in doc.items() if k != "events"}, indent=1)
        body = ",\n".join(json.dumps(e, separators=(",", ":")) for e in events)
        text = head[:-2] + ',\n "events": [\n' + body + "\n ]\n}"
        if len(text) > limit:
            doc.pop("events")
            doc["events_omitted"] = f"the event list would make the file {len(text)} B"
            text = json.dumps(doc, indent=1)
    name = golden_name(res["family"], res["versions"]["transformers"], res["attention"],
                       res["recipe"], res["checkpointing"])
    if res["adamw_impl"] != "foreach":
        name = name[:-len(".json")] + "-" + res["adamw_impl"] + ".json"
    with open(os.path.join(directory, name), "w") as f:
        f.write(text + "\n")
    return name


def line(res, show_peak=False):
    out = []
    for s in res["step_summaries"]:
        out.append(f"  step {s['step']}: peak {s['peak_live_bytes']:,} B absolute, "
                   f"{s['peak_over_start_bytes']:,} B over start ({s['live_at_start_bytes']:,}) "
                   f"in {s['peak_phase']}; {s['events']} events; at peak "
                   f"{s['by_category_at_peak']}")
        out.append("           phase max over start: " + ", ".join(
            f"{p} {v:,}" for p, v in s["phase_max_over_start_bytes"].items()))
        if show_peak:
            for a in sorted(s["_peak_live"].values(), key=lambda a: a["t"]):
                if a["step"] == s["step"] and a["cat"] in ("activation", "temporary",
                                                           "autocast_cache", "master_grad"):
                    out.append(f"             {a['bytes']:>9,} {a['cat']:<15} step {a['step']} "
                               f"{a['phase']:<9} {a['op']}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transformers", metavar="DIR", help="an installed release (--target DIR)")
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--family", default="llama", choices=list(FAMILIES) + ["all"])
    ap.add_argument("--attention", default="eager", choices=["eager", "sdpa", "all"])
    ap.add_argument("--ckpt", default="off", choices=["off", "on", "all"])
    ap.add_argument("--recipe", default="pure", choices=["pure", "amp", "mixed", "all"])
    ap.add_argument("--loop", default="literal", choices=list(LOOP_TEXT),
                    help="literal: out = model(...) kept until the next step's rebinding; "
                         "trainer: loss = model(...).loss, the output dropped at once")
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--adamw", default="foreach", choices=list(ADAMW_KWARGS),
                    help="torch.optim.AdamW's implementation (goldens other than foreach's are "
                         "named -<impl>.json)")
    ap.add_argument("--write", metavar="DIR", help="write goldens there")
    ap.add_argument("--show-peak", action="store_true",
                    help="list what a step allocated that is live at its peak, with the ops")
    ap.add_argument("--events-for", default="llama", help="families whose goldens carry events")
    a = ap.parse_args()
    for key in ("vocab", "intermediate", "kv_heads", "layers"):
        if getattr(a, key) is not None:
            BASE[key] = getattr(a, key)
    if a.selftest:
        sys.exit(0 if selftest() else 1)
    if a.write and (a.loop != "literal" or any(getattr(a, k) is not None for k in
                                                ("vocab", "intermediate", "kv_heads", "layers"))):
        ap.error("--write is for the goldens' own configuration and loop only")
    families = list(FAMILIES) if a.family == "all" else [a.family]
    attentions = ["eager", "sdpa"] if a.attention == "all" else [a.attention]
    ckpts = [False, True] if a.ckpt == "all" else [a.ckpt == "on"]
    recipes = ["pure", "amp", "mixed"] if a.recipe == "all" else [a.recipe]
    failed = False
    for fam in families:
        for att in attentions:
            for ck in ckpts:
                for rc in recipes:
                    res = run_one(fam, att, ck, rc, a.loop, a.adamw)
                    tag = f"{fam} {att} ckpt={'on' if ck else 'off'} {rc}"
                    print(f"{tag}: params {res['parameters']:,} ({res['parameter_bytes']:,} B), "
                          f"unpaired frees {res['unpaired_frees']}")
                    print(line(res, a.show_peak), flush=True)
                    if res["unpaired_frees"]:
                        failed = True
                    if a.write:
                        name = write_golden(res, a.write, fam in a.events_for.split(","))
                        print(f"  wrote {name}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
