#!/usr/bin/env python3
"""Records the optimizer state an older bitsandbytes release allocates for LoRA adapters.

bitsandbytes changed the block of its 8-bit optimizers' absmax from 2,048 to 256 elements in
0.44.0 (pull request #1365, "Change 8bit optimizer blocksize 2048->256"). The hf-peft profile
keys that on `--bnb-version`. This script shows the older layout with a real release:
bitsandbytes 0.43.3 (its wheel unpacked on PYTHONPATH before the current torch, e.g.
/tmp/bnbold), whose 8-bit optimizers have no CPU update, so the script calls
`Optimizer2State.init_state` directly on CPU parameters (the allocation the first step makes)
and records each state tensor's shape, dtype and bytes, each storage once (the two quantile
maps are shared). The adapters are those of tests/data/hf_peft's rank-20 cases: the tiny LLaMA
(h 64, i 304, a 4, k 2, 2 layers), LoRA r 20 on all seven projections, fp32.

  PYTHONPATH=/tmp/bnbold:/tmp/bnbpy python3 tools/bnb_optimizer_era.py \
      [--out tests/data/hf_peft/bnb-0.43.3-adamw8bit-init.json]

bitsandbytes 0.43.3 imports triton's helpers when triton is installed; the current triton no
longer has `triton.ops`, so the script hides triton from `importlib.util.find_spec` (bnb then
skips its triton modules, which play no part here). CPU only.
"""

import argparse
import importlib.util
import json
import os
import sys

_find_spec = importlib.util.find_spec
importlib.util.find_spec = (
    lambda name, *a: None if name.split(".")[0] == "triton" else _find_spec(name, *a))

import torch  # noqa: E402

H, I, A, K, L, R = 64, 304, 4, 2, 2, 20
D = H // A
# (module, in, out) as peft names them, in the model's order.
PROJ = [("self_attn.q_proj", H, A * D), ("self_attn.k_proj", H, K * D),
        ("self_attn.v_proj", H, K * D), ("self_attn.o_proj", A * D, H),
        ("mlp.gate_proj", H, I), ("mlp.up_proj", H, I), ("mlp.down_proj", I, H)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "data", "hf_peft",
                                                  "bnb-0.43.3-adamw8bit-init.json"))
    a = ap.parse_args()
    import bitsandbytes as bnb
    names, params = [], []
    for layer in range(L):
        for mod, fin, fout in PROJ:
            for which, shape in (("lora_A", (R, fin)), ("lora_B", (fout, R))):
                names.append(f"model.layers.{layer}.{mod}.{which}.default.weight")
                params.append(torch.nn.Parameter(torch.zeros(shape, dtype=torch.float32)))
    opt = bnb.optim.AdamW8bit(params, lr=1e-3)
    for gi, group in enumerate(opt.param_groups):
        for pi, p in enumerate(group["params"]):
            opt.init_state(group, p, gi, pi)
    seen, states, total = set(), [], 0
    for name, p in zip(names, params):
        recs = {}
        for k, v in opt.state[p].items():
            if not isinstance(v, torch.Tensor):
                continue
            ptr = v.untyped_storage().data_ptr()
            recs[k] = {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", ""),
                       "bytes": v.untyped_storage().nbytes(), "shared": ptr in seen}
            seen.add(ptr)
        b = sum(r["bytes"] for r in recs.values() if not r["shared"])
        total += b
        states.append({"name": name, "numel": p.numel(), "state": recs, "bytes": b})
    doc = {"what": "bnb.optim.AdamW8bit init_state on CPU parameters (no update step)",
           "versions": {"bitsandbytes": bnb.__version__, "torch": torch.__version__,
                        "python": sys.version.split()[0]},
           "config": {"hidden_size": H, "intermediate_size": I, "num_attention_heads": A,
                      "num_key_value_heads": K, "num_hidden_layers": L, "lora_r": R,
                      "target_modules": "all-linear"},
           "states": states, "bytes": total}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"bitsandbytes {bnb.__version__}: {total} B of AdamW8bit state -> {a.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
