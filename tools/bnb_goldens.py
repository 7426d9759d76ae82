#!/usr/bin/env python3
"""Goldens of bitsandbytes' 4-bit and 8-bit storage and 8-bit AdamW, made with the real library on the CPU.

trainmem's twins (kernels/quant4, kernels/adamw8bit) are checked against these files bit for bit
by tests/test_ops_quant.cpp, without Python: this script is run once by hand when the pinned
release changes, and its output is committed under tests/data/bnb/.

    python3 -m pip install --target /tmp/bnbpy torch "numpy<3"
    python3 -m pip install --target /tmp/bnbpy --no-deps bitsandbytes==0.50.2
    PYTHONPATH=/tmp/bnbpy python3 tools/bnb_goldens.py --out tests/data/bnb

What it records (safetensors; each case's parameters in the metadata as JSON, one entry per case):
  quant4.safetensors: for each case (quant type, blocksize, double quantization, input dtype,
    shape) the input, what `bitsandbytes.functional.quantize_4bit` stores (the packed bytes,
    absmax, the nested absmax, offset and both code tables when nested), the fp32 absmax that
    `dequantize_4bit` rebuilds from the nested one, and the dequantized weight in fp32, bf16 and
    fp16 (through `torch.ops.bitsandbytes.dequantize_4bit`, the op MatMul4Bit's backward calls).
  int8.safetensors: LLM.int8's frozen weight (`load_in_8bit`): for each case (input dtype, shape)
    the input W, what `bitsandbytes.nn.Int8Params(W, has_fp16_weights=False).to("cpu")` stores
    (CB, int8 bytes stored as u8, and SCB fp32), and the weight MatMul8bitFp and MatMul8bitLt
    dequantize for their GEMMs (autograd/_functions.py: `CB.to(dt).mul_(SCB.unsqueeze(1).mul(1.0
    / 127.0))`, in the installed source, not copied) in fp32, bf16 and fp16.
  adamw8bit.safetensors: `bitsandbytes.optim.AdamW8bit` on CPU parameters (below and above its
    4,096-element threshold for 8-bit state, a size that is not a multiple of 256, a parameter
    whose first gradient is zero as a fresh LoRA A's is): the parameter before step 1, the
    gradient of each step, and after each step the parameter, state1, state2, absmax1, absmax2,
    qmap1, qmap2.
"""
import argparse
import inspect
import json
import os
import struct
import sys

import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F

SAFE = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.uint8: "U8",
    torch.int64: "I64",
}
DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {
            "dtype": SAFE[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def quant4_input(shape, dtype, gen, special):
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    flat = x.view(-1)
    if special and flat.numel() >= 256:
        flat[64:128] = 0.0  # an all-zero block (blocksize 64)
        # Exact midpoints between neighbouring NF4 codes after scaling by the block's absmax
        # (1.0, set by the first element of the block): the tie rule shows.
        code = F.get_4bit_type("nf4", device="cpu")
        flat[128] = 1.0
        for j in range(15):
            flat[129 + j] = (code[j] + code[j + 1]) / 2
        flat[192] = -2.0  # absmax from a negative element
        flat[193:200] = torch.tensor([2.0, -1.0, 1.0, 0.5, -0.5, 1e-30, -1e-30])
    return x.to(dtype)


def quant4_cases():
    cases = []
    for qt in ("nf4", "fp4"):
        for dq in (False, True):
            cases.append(dict(qt=qt, dq=dq, bs=64, dtype="bf16", shape=[48, 96], special=True))
            cases.append(dict(qt=qt, dq=dq, bs=64, dtype="f32", shape=[5, 130], special=False))
            cases.append(dict(qt=qt, dq=dq, bs=64, dtype="f16", shape=[7, 9], special=False))
    # Larger blocks, and a matrix with more than 256 blocks so that the nested absmax has two
    # blocks of its own (the last one partial).
    cases.append(dict(qt="nf4", dq=True, bs=128, dtype="bf16", shape=[33, 64], special=False))
    cases.append(dict(qt="nf4", dq=False, bs=256, dtype="f32", shape=[3, 300], special=False))
    cases.append(dict(qt="nf4", dq=True, bs=64, dtype="bf16", shape=[96, 224], special=True))
    cases.append(dict(qt="fp4", dq=True, bs=64, dtype="f32", shape=[130, 129], special=False))
    return cases


def make_quant4(path):
    gen = torch.Generator().manual_seed(2812)
    tensors = {}
    meta_cases = []
    for c, case in enumerate(quant4_cases()):
        p = f"c{c}."
        dt = DT[case["dtype"]]
        x = quant4_input(case["shape"], dt, gen, case["special"])
        packed, qs = F.quantize_4bit(x, blocksize=case["bs"], compress_statistics=case["dq"],
                                     quant_type=case["qt"])
        tensors[p + "input"] = x
        tensors[p + "packed"] = packed.view(-1)
        tensors[p + "absmax"] = qs.absmax  # fp32, or uint8 when nested
        tensors[p + "code"] = qs.code
        if case["dq"]:
            tensors[p + "offset"] = qs.offset.reshape(1)
            tensors[p + "nested_absmax"] = qs.state2.absmax
            tensors[p + "nested_code"] = qs.state2.code
            absmax = F.dequantize_blockwise(qs.absmax, qs.state2)
            absmax += qs.offset
        else:
            absmax = qs.absmax
        tensors[p + "absmax_f32"] = absmax.float()
        # The entry point a training step uses (MatMul4Bit: dequantize_4bit(B, quant_state)).
        tensors[p + "deq_state"] = F.dequantize_4bit(packed, qs)
        for name, odt in DT.items():
            tensors[p + "deq_" + name] = torch.ops.bitsandbytes.dequantize_4bit(
                packed, absmax.float(), case["bs"], case["qt"], list(case["shape"]), odt)
        meta_cases.append(case)
    # One metadata entry per case (trainmem's reader takes strings of up to 1,024 characters).
    meta = {"cases": str(len(meta_cases)), **versions()}
    for c, case in enumerate(meta_cases):
        meta[f"c{c}"] = json.dumps(case)
    write_safetensors(path, tensors, meta)
    return len(meta_cases)


def make_adamw8bit(path):
    gen = torch.Generator().manual_seed(3107)
    # sizes: fp32 state (< 4096), exactly 4096, not a multiple of 256, two whole blocks of 256
    # several times over; "zero_first": the first step's gradient is zero (a fresh LoRA A).
    specs = [
        dict(shape=[10, 10], zero_first=False),
        dict(shape=[64, 64], zero_first=False),
        dict(shape=[5000], zero_first=False),
        dict(shape=[8, 1024], zero_first=True),
        dict(shape=[40, 300], zero_first=False),
    ]
    params = [torch.nn.Parameter(torch.randn(s["shape"], generator=gen) * 0.1) for s in specs]
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    opt = bnb.optim.AdamW8bit(params, **hp)
    tensors = {}
    steps = 3
    for step in range(1, steps + 1):
        for j, (p, s) in enumerate(zip(params, specs)):
            g = torch.randn(s["shape"], generator=gen) * (10.0 ** -(j % 3))
            if s["zero_first"] and step == 1:
                g.zero_()
            p.grad = g
            if step == 1:
                tensors[f"p{j}.init"] = p.detach().clone()
            tensors[f"p{j}.s{step}.grad"] = g.clone()
        opt.step()
        for j, p in enumerate(params):
            st = opt.state[p]
            pre = f"p{j}.s{step}."
            tensors[pre + "param"] = p.detach().clone()
            for key in ("state1", "state2", "absmax1", "absmax2", "qmap1", "qmap2"):
                if key in st:
                    tensors[pre + key] = st[key].detach().clone()
    meta = {
        "params": str(len(specs)),
        **{f"p{j}": json.dumps(s) for j, s in enumerate(specs)},
        "hyper": json.dumps({"lr": hp["lr"], "beta1": hp["betas"][0], "beta2": hp["betas"][1],
                             "eps": hp["eps"], "weight_decay": hp["weight_decay"]}),
        "steps": str(steps),
        "min_8bit_size": "4096",
        "blocksize": "256",
        **versions(),
    }
    write_safetensors(path, tensors, meta)
    return len(specs)


def int8_input(shape, dtype, gen, special):
    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    if special:
        # Row 0: values whose scaled magnitude lands on .5 exactly (absmax 127: scale 1), so that
        # the half-to-even rule shows; row 1: a negative absmax; row 2: values below fp16's range
        # next to ordinary ones (they round to zero in the fp16 cast bnb makes first).
        x[0, :9] = torch.tensor([127.0, 0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 126.5])
        x[0, 9:] = 0.25
        x[1, 3] = -7.0
        x[2, :4] = torch.tensor([1e-9, -1e-9, 3.0, 1e-30])
    return x.to(dtype)


def make_int8(path):
    gen = torch.Generator().manual_seed(808)
    tensors = {}
    cases = [dict(dtype="bf16", shape=[48, 96], special=True),
             dict(dtype="f32", shape=[5, 130], special=True),
             dict(dtype="f16", shape=[7, 9], special=False),
             dict(dtype="bf16", shape=[176, 64], special=False)]
    code = inspect.getsource(bnb.autograd._functions)
    assert "mul_(state.SCB.unsqueeze(1).mul(1.0 / 127.0))" in code, "the dequantize expression moved"
    for c, case in enumerate(cases):
        p = f"c{c}."
        w = int8_input(case["shape"], DT[case["dtype"]], gen, case["special"])
        q = bnb.nn.Int8Params(w.clone(), requires_grad=False, has_fp16_weights=False).to("cpu")
        CB, SCB = q.data, q.SCB
        assert CB.dtype == torch.int8 and SCB.dtype == torch.float32
        tensors[p + "input"] = w
        tensors[p + "cb"] = CB.view(torch.uint8).reshape(-1)
        tensors[p + "scb"] = SCB
        for name, odt in DT.items():  # MatMul8bitFp's expression, as the installed source reads
            tensors[p + "deq_" + name] = CB.to(odt).mul_(SCB.unsqueeze(1).mul(1.0 / 127.0))
    meta = {"cases": str(len(cases)), **versions()}
    for c, case in enumerate(cases):
        meta[f"c{c}"] = json.dumps(case)
    write_safetensors(path, tensors, meta)
    return len(cases)


def versions():
    return {
        "bitsandbytes": bnb.__version__,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "made_by": "tools/bnb_goldens.py",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for quant4.safetensors, adamw8bit.safetensors")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    n4 = make_quant4(os.path.join(args.out, "quant4.safetensors"))
    n8 = make_adamw8bit(os.path.join(args.out, "adamw8bit.safetensors"))
    ni = make_int8(os.path.join(args.out, "int8.safetensors"))
    print(f"bitsandbytes {bnb.__version__}, torch {torch.__version__}: {n4} quant4 cases, "
          f"{n8} AdamW8bit parameters, {ni} int8 cases", file=sys.stderr)


if __name__ == "__main__":
    main()
