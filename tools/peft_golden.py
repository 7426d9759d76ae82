"""Records the loss and the LoRA adapters' gradients of one training step of the real peft (and,
for QLoRA, bitsandbytes' 4-bit base), for tests/test_model_qlora.cpp to compare trainmem's own
LoRA and QLoRA steps with (issue 28, point 2: "LoRA gradients against PyTorch + peft goldens").

The model is tests/data/golden_tiny_gqa (config, fp32 weights, 2 x 16 token ids), loaded with
transformers' LlamaForCausalLM in fp32 on the CPU; peft's LoraConfig(r=4, lora_alpha=8,
target_modules="all-linear", lora_dropout=0) wraps it; every adapter is then set to fixed values
(B non-zero, so that A's gradient is too), written to the output with trainmem's names
(model.layers.N.<module>.lora_A.weight). The QLoRA case loads the base with
BitsAndBytesConfig(load_in_4bit, nf4, double quantization, compute dtype fp32), as trainmem's
`--finetune qlora` stores it; no prepare_model_for_kbit_training (trainmem's step has no upcast,
and in fp32 it would change nothing the loss depends on).

Output (tests/data/peft_golden_<case>.safetensors, fp32): `loss` (1), each adapter's value under
its trainmem name, and its gradient under `grad.<name>`; metadata: batch, seq, rank, alpha,
case, and the releases that made it.

Run with the PyPI releases on PYTHONPATH (installed with `pip install --target DIR --no-deps`,
as tools/peft_saved_tensors.py):
  PYTHONPATH=/tmp/bnbpy python3 tools/peft_golden.py [--out tests/data]
Made with torch 2.15.0, transformers 5.25.0, peft 0.21.2, bitsandbytes 0.50.2 (2026-12-06).
"""
import argparse
import math
import os
import shutil
import struct
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data")
B, S, RANK, ALPHA = 2, 16, 4, 8


def trainmem_name(peft_name):
    # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
    #   -> model.layers.0.self_attn.q_proj.lora_A.weight
    name = peft_name.replace("base_model.model.", "", 1).replace(".default.", ".")
    return name


def fixed_values(shape, salt):
    n = 1
    for d in shape:
        n *= d
    vals = [0.05 * math.sin(0.37 * (i + 1) + 1.3 * salt) for i in range(n)]
    return torch.tensor(vals, dtype=torch.float32).reshape(shape)


def run(case, out_dir):
    from transformers import BitsAndBytesConfig, LlamaForCausalLM
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    import bitsandbytes
    import peft
    import transformers

    tmp = tempfile.mkdtemp()
    try:
        shutil.copy(os.path.join(DATA, "golden_tiny_gqa_config.json"),
                    os.path.join(tmp, "config.json"))
        shutil.copy(os.path.join(DATA, "golden_tiny_gqa_weights.safetensors"),
                    os.path.join(tmp, "model.safetensors"))
        if case == "lora":
            model = LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32, device_map="cpu")
        else:
            q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                   bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.float32)
            model = LlamaForCausalLM.from_pretrained(tmp, quantization_config=q,
                                                     dtype=torch.float32, device_map="cpu")
    finally:
        shutil.rmtree(tmp)
    cfg = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules="all-linear", lora_dropout=0.0,
                     task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    model.train()
    adapters = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    with torch.no_grad():
        for k, (n, p) in enumerate(adapters):
            assert p.dtype == torch.float32, (n, p.dtype)
            p.copy_(fixed_values(tuple(p.shape), k))
    with open(os.path.join(DATA, "golden_tiny_gqa_tokens.bin"), "rb") as f:
        raw = f.read()
    assert len(raw) == 4 * B * S
    ids = torch.tensor(struct.unpack(f"<{B * S}i", raw), dtype=torch.long).reshape(B, S)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    tensors = {"loss": out.loss.detach().reshape(1).float().contiguous()}
    for n, p in adapters:
        name = trainmem_name(n)
        tensors[name] = p.detach().float().contiguous()
        tensors["grad." + name] = p.grad.detach().float().contiguous()
    meta = {"batch": str(B), "seq": str(S), "rank": str(RANK), "alpha": str(ALPHA),
            "case": case, "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "bitsandbytes": bitsandbytes.__version__}
    path = os.path.join(out_dir, f"peft_golden_{case}.safetensors")
    save_file(tensors, path, metadata=meta)
    print(f"{path}: loss {out.loss.item():.6f}, {len(adapters)} adapters")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DATA)
    args = ap.parse_args()
    for case in ("lora", "qlora"):
        run(case, args.out)


if __name__ == "__main__":
    main()
