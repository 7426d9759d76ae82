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

The lora-dropout case is the LoRA case with lora_dropout=0.3 whose masks are trainmem's: every
adapter's nn.Dropout is replaced by a module that multiplies its input by the mask trainmem draws
for that layer and target at run seed 11, step 0 (kernels/dropout/dropout_math.hpp and
include/trainmem/model/decoder_layer.hpp's dropout_stream, written again below with numpy) times
1/(1 - p) in fp32: peft's own forward and autograd then give the loss and the gradients the
native step must reproduce with the same masks (`LlamaModel::set_dropout_key(11, 0)`).

The QLoRA case needs a CPU without AVX512-BF16: where the CPU has it (AMD Zen 4, Intel
Sapphire Rapids), bitsandbytes 0.50.2's CPU backend registers a fused gemv_4bit that casts the
input and the absmax to bf16 (backends/cpu/ops.py, `has_avx512bf16`), so its fp32-compute step
is no longer the dequantize-then-fp32-GEMM that trainmem's step and this golden describe
(measured 2026-12-06 on a Zen 4: loss 5.611 against 5.430). The script then leaves the QLoRA
golden as it is and says so.

Output (tests/data/peft_golden_<case>.safetensors, fp32): `loss` (1), each adapter's value under
its trainmem name, and its gradient under `grad.<name>`; metadata: batch, seq, rank, alpha,
case, and the releases that made it.

Run with the PyPI releases on PYTHONPATH (installed with `pip install --target DIR --no-deps`,
as tools/peft_saved_tensors.py):
  PYTHONPATH=/tmp/bnbpy python3 tools/peft_golden.py [--out tests/data]
PyPI's torch wheel is built against CUDA 13 and needs, only to be imported, libcufile,
libcusparseLt, libnvshmem_host (pip wheels nvidia-cufile, nvidia-cusparselt-cu13,
nvidia-nvshmem-cu13) and NCCL 2.32 (nvidia-nccl-cu13) on LD_LIBRARY_PATH beside the CUDA
toolkit's libraries; transformers 5.25 then also imports httpx2. Leave the `kernels` package
uninstalled (or set USE_HUB_KERNELS=0): with it transformers and bitsandbytes try to fetch
kernels from the Hub.
Made with torch 2.15.0, transformers 5.25.0, peft 0.21.2, bitsandbytes 0.50.2: lora and qlora
on 2026-12-06 (eighth session), lora-dropout on 2026-12-06 (ninth session, on a Zen 4: its lora
case came out within 2e-6 of the committed one, relative, and its qlora case was skipped).
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
DROPOUT, DROPOUT_SEED = 0.3, 11
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
M64 = (1 << 64) - 1


def splitmix64(x):
    import numpy as np
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def trainmem_mask(seed, step, layer, target, n):
    """trainmem's LoRA dropout mask: element e kept when the top 24 bits k of
    random_bits(seed, stream, e) give k * 2^-24 >= p (p as a float32)."""
    import numpy as np
    stream = (1 << 63) | (step << 24) | (layer << 3) | target
    key = splitmix64(np.array([(seed * 0x2545F4914F6CDD1D + stream) & M64], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        bits = splitmix64(key + np.arange(n, dtype=np.uint64))
    k = (bits >> np.uint64(40)).astype(np.float64)
    return (k * 2.0 ** -24 >= float(np.float32(DROPOUT))).astype(np.float32)


class FixedMaskDropout(torch.nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, x):
        assert x.shape == self.mask.shape, (x.shape, self.mask.shape)
        scale = torch.tensor(1.0 / (1.0 - DROPOUT), dtype=torch.float32)  # double, then fp32
        return x * (self.mask * scale)


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

    if case == "qlora":
        from bitsandbytes.functional import has_avx512bf16
        if has_avx512bf16():
            print("qlora: skipped: this CPU has AVX512-BF16, where bitsandbytes' CPU gemv_4bit "
                  "computes in bf16 (see the docstring); run it on a CPU without it")
            return
    tmp = tempfile.mkdtemp()
    try:
        shutil.copy(os.path.join(DATA, "golden_tiny_gqa_config.json"),
                    os.path.join(tmp, "config.json"))
        shutil.copy(os.path.join(DATA, "golden_tiny_gqa_weights.safetensors"),
                    os.path.join(tmp, "model.safetensors"))
        if case in ("lora", "lora-dropout"):
            model = LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32, device_map="cpu")
        else:
            q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                   bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.float32)
            model = LlamaForCausalLM.from_pretrained(tmp, quantization_config=q,
                                                     dtype=torch.float32, device_map="cpu")
    finally:
        shutil.rmtree(tmp)
    p_drop = DROPOUT if case == "lora-dropout" else 0.0
    cfg = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules="all-linear", lora_dropout=p_drop,
                     task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    model.train()
    if p_drop > 0:
        replaced = 0
        for name, module in model.named_modules():
            if not hasattr(module, "lora_dropout") or "default" not in module.lora_dropout:
                continue
            assert isinstance(module.lora_dropout["default"], torch.nn.Dropout), name
            layer = int(name.split(".layers.")[1].split(".")[0])
            target = TARGETS.index(name.rsplit(".", 1)[1])
            n_in = module.in_features
            mask = trainmem_mask(DROPOUT_SEED, 0, layer, target, B * S * n_in)
            module.lora_dropout["default"] = FixedMaskDropout(
                torch.from_numpy(mask).reshape(B, S, n_in))
            replaced += 1
        assert replaced == 7 * model.config.num_hidden_layers, replaced
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
            "case": case, "dropout": str(p_drop), "dropout_seed": str(DROPOUT_SEED), "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "bitsandbytes": bitsandbytes.__version__}
    path = os.path.join(out_dir, f"peft_golden_{case}.safetensors")
    save_file(tensors, path, metadata=meta)
    print(f"{path}: loss {out.loss.item():.6f}, {len(adapters)} adapters")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DATA)
    args = ap.parse_args()
    for case in ("lora", "qlora", "lora-dropout"):
        run(case, args.out)


if __name__ == "__main__":
    main()
