#!/usr/bin/env python3
"""Fuzz test of the trainmem CLI against hostile inputs (issue 26, point 6).

Deterministic (a fixed --seed; case i is generated from (seed, i) alone, so any case can be
rerun by itself with --only i): mutants of

  config   a config.json (real llama/llama3/qwen2/qwen3/mistral configs and the golden tiny
           ones): keys deleted, duplicated, renamed, set to huge/negative/float/string/null/
           NaN-ish numbers, long keys and strings, deep nesting, truncation, random bytes;
  weights  a safetensors file for --weights (a valid one for model tiny first, from
           `profile --dump`): the header length field, the header's JSON (dtypes, shapes,
           offsets, names, metadata), truncated or padded data, NaN/Inf values;
  tokens   a --tokens file: sizes around batch*seq*4, ids out of range;
  report   a JSON report for `diff` (from estimate/profile --format json), mutated like configs;
  events   an allocation sequence for `replay` ({"events": [...]}), mutated like configs, with
           hostile --allocator specs and --budget sizes;
  routing  a --routing file for tiny-qwen3-moe's meta trace: per rank (a layout's, with ep, pp,
           cp) or one rank's, its sources' and layers' fields and the document mutated;
  flags    flag values at and around their bounds, negative, huge, non-numbers, empty, unicode,
           sizes like 1e309GiB, across estimate, profile (meta and cpu), maxbatch, plan, sweep,
           diff.

Every run must exit 0, 2 or 3 (never 1, a signal, or a sanitizer's report), finish within
--timeout seconds (60 by default: a hang never ends, while the largest valid inputs are long
work, e.g. maxbatch over a layout of 16,383 micro-batches traces ~20 candidates of 32,766
micro-batch steps each, 7 s alone and three times that beside the rest of the suite on 2 cores), print at most 64 KiB on stderr, leave no temporary file (the atomic
writer's ".<leaf>.tmp-XXXXXX") or partial output in its folder, and leave its input files as
they were. Failing cases are kept under --work-dir/failures/case-N/ (the files and a
`repro.sh`); the summary line is "N passed, M failed" and the exit status is 1 on any failure.

Usage: fuzz_cli.py --trainmem PATH [--count N] [--seed S] [--jobs J] [--timeout S]
                   [--work-dir DIR] [--deadline S] [--only I[,I...]] [--keep]
The count defaults to $TRAINMEM_FUZZ_COUNT or 1200; $TRAINMEM_FUZZ_SCALE multiplies it.
Standard library only.
"""

import argparse
import concurrent.futures
import copy
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
MAX_STDERR = 64 * 1024
TEMP_RE = re.compile(r"^\..*\.tmp-[A-Za-z0-9]{6}$")
OK_CODES = (0, 2, 3)
SANITIZER_RE = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)|"
                          r"runtime error: |SUMMARY: (Address|Undefined)")

# ----------------------------------------------------------------------------- value pools

INT_EDGE = [0, 1, -1, 2, 3, 7, 8, 16, 63, 64, 65, 127, 128, 255, 256, 1000, 4096, 65535, 65536,
            65537, 2**24, 2**24 + 1, 2**30, 2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**53 + 1,
            2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, -2**31, -2**63, -2**63 - 1]
WEIRD_TEXT = ["", " ", "-", "--", "1 ", " 1", "+1", "0x10", "1e3", "1.5", "-0", "00", "1_000",
              "nan", "NaN", "inf", "-inf", "Infinity", "1e309", "-1e309", "1e-300", "1e-400",
              "\u0661\u0662", "\uff11", "\u221e", "\u00e9", "\U0001F600", "\x7f", "true", "null",
              "9" * 400, "1" * 30, "-" + "9" * 30, "1,2", "1;2", "$(echo hi)", "%s%n", "../../x"]
SIZE_TEXT = ["0", "1", "1B", "1KiB", "512MiB", "1GiB", "80GiB", "24GB", "1TiB", "1e309GiB",
             "-1GiB", "1.5GiB", "GiB", "1 GiB", "1e-300GiB", "NaNGiB", "infGiB", "nanB",
             "18446744073709551615B", "18446744073709551616B", "17179869184GiB", "1EiB", "1ZiB",
             "0.0000001B", "1e18", "1e20", "-0GiB", "1gib", "1Gi", "device", "auto", "measure",
             "\uff11GiB", "1GiB1", "1..5GiB"]
CONFIG_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
               "head_dim", "rms_norm_eps", "rope_theta", "tie_word_embeddings", "torch_dtype",
               "model_type", "architectures", "hidden_act", "rope_scaling", "attention_bias",
               "sliding_window", "use_sliding_window", "max_window_layers", "attention_dropout",
               "mlp_bias", "pretraining_tp", "bos_token_id", "eos_token_id", "use_cache",
               "qkv_bias", "layer_types", "num_experts", "transformers_version"]
SAFE_DTYPES = ["F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "U8", "BOOL",
               "F8_E4M3", "F8_E5M2", "f32", "", "XYZ", 32, None, ["F32"]]


def json_value(rng, depth=0):
    """A hostile JSON value (as Python, or a raw text token via RawJson)."""
    r = rng.random()
    if r < 0.30:
        return rng.choice(INT_EDGE)
    if r < 0.40:
        return rng.choice([0.0, -0.0, 0.5, -0.5, 1e-300, 5e-324, 1.7976931348623157e308, 1e300,
                           3.9999, 2.0000001, 1e16, 123456789.123])
    if r < 0.50:
        return RawJson(rng.choice(["NaN", "Infinity", "-Infinity", "1e309", "-1e309", "1e-400",
                                   "1E400", "18446744073709551616", "-9223372036854775809",
                                   "0e99999", "1" * 400, "-0", "01", "1.", ".5", "+1"]))
    if r < 0.62:
        return rng.choice(WEIRD_TEXT + ["llama", "qwen2", "qwen3", "mistral", "float32",
                                        "bfloat16", "float16", "int8", "silu", "gelu", "x" * 2000,
                                        "\u0000", "\ud800"])
    if r < 0.70:
        return rng.choice([None, True, False])
    if r < 0.80 and depth < 3:
        return [json_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    if r < 0.90 and depth < 3:
        return {rng.choice(CONFIG_KEYS + ["type", "rope_type", "factor", "x"]):
                json_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    return rng.choice([1, 2, 4, 32, 64, 128, 4096, 11008, 32000, 151936])


class RawJson:
    def __init__(self, text):
        self.text = text


def dumps(obj):
    """json.dumps that writes RawJson tokens verbatim (NaN-ish numbers json.dumps refuses)."""
    raws = []

    def enc(o):
        if isinstance(o, RawJson):
            raws.append(o.text)
            return "\x00RAW%d\x00" % (len(raws) - 1)
        if isinstance(o, dict):
            return {k: enc(v) for k, v in o.items()}
        if isinstance(o, list):
            return [enc(v) for v in o]
        return o

    text = json.dumps(enc(obj), indent=rng_indent(obj), ensure_ascii=False)
    for i, raw in enumerate(raws):
        text = text.replace('"\\u0000RAW%d\\u0000"' % i, raw)
    return text


def rng_indent(_):
    return 2


def mutate_json_text(rng, obj, keys_pool):
    """A mutated JSON document (bytes) from the object `obj` (a dict)."""
    obj = copy.deepcopy(obj)
    text = None
    n = rng.choice([1, 1, 1, 2, 3])
    for _ in range(n):
        op = rng.randrange(14)
        keys = list(obj.keys()) if isinstance(obj, dict) else []
        if op in (0, 1, 2, 3) and keys:  # a value replaced
            obj[rng.choice(keys)] = json_value(rng)
        elif op == 4 and keys:  # a key deleted
            del obj[rng.choice(keys)]
        elif op == 5:  # a known key set (maybe new)
            obj[rng.choice(keys_pool)] = json_value(rng)
        elif op == 6 and keys:  # a key renamed
            k = rng.choice(keys)
            obj[k + rng.choice(["_", "X", "\u00e9", " "])] = obj.pop(k)
        elif op == 7:  # a long key
            obj["k" * rng.choice([1025, 5000, 100000])] = 1
        elif op == 8 and isinstance(obj.get("rope_scaling"), dict):
            rs = obj["rope_scaling"]
            rs[rng.choice(["factor", "rope_type", "type", "low_freq_factor", "high_freq_factor",
                           "original_max_position_embeddings"])] = json_value(rng)
        elif op == 8:
            obj["rope_scaling"] = {"rope_type": rng.choice(["llama3", "linear", "dynamic", "yarn",
                                                            "x", ""]),
                                   "factor": json_value(rng)}
        elif op == 9:  # a whole plausible dimension change
            k = rng.choice(["hidden_size", "num_attention_heads", "num_key_value_heads",
                            "intermediate_size", "head_dim", "num_hidden_layers", "vocab_size"])
            obj[k] = rng.choice([0, 1, 3, 5, 7, 96, 100, 2**20, 2**31, 2**40, -64])
        else:
            pass
    text = dumps(obj)
    # Text-level mutations.
    op = rng.randrange(12)
    if op == 0 and keys_pool:  # a duplicated key
        k = rng.choice(list(obj.keys()) or ["x"])
        text = text.replace("{", '{"%s": %s, ' % (k, rng.choice(["1", "0", "\"a\"", "null"])), 1)
    elif op == 1:  # truncated
        text = text[: rng.randrange(0, max(1, len(text)))]
    elif op == 2:  # deep nesting
        depth = rng.choice([100, 1000, 10000, 100000, 1000000])
        opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
        text = text.replace("{", '{"nested": ' + opener * depth + "1" + closer * depth + ", ", 1)
    elif op == 3:  # random bytes flipped
        b = bytearray(text.encode("utf-8", "surrogatepass"))
        for _ in range(rng.randrange(1, 8)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    elif op == 4:  # random bytes altogether
        return bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 7, 100, 4000])))
    elif op == 5:  # another top level
        text = rng.choice(["[]", "null", "1", '"x"', "[" + text + "]", text + text, "\ufeff" + text,
                           text + "\x00", "", " ", "{}", '{"a":1}{"b":2}'])
    elif op == 6:  # NUL / invalid UTF-8 inside a string
        return text.encode("utf-8", "surrogatepass").replace(b'"llama"', b'"ll\xff\xfeama"', 1) \
            .replace(b"\"model_type\"", b"\"model_\x00type\"", 1)
    elif op == 7:  # comments, trailing commas
        text = text.replace("\n}", ",\n}", 1) if rng.random() < 0.5 else "// c\n" + text
    return text.encode("utf-8", "surrogatepass")


# ----------------------------------------------------------------------------- safetensors

def read_safetensors(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    return n, header, blob[8 + n:]


def build_safetensors(header_text, data, length=None):
    hb = header_text if isinstance(header_text, bytes) else header_text.encode("utf-8",
                                                                                "surrogatepass")
    if length is None:
        length = len(hb)
    return struct.pack("<Q", length % 2**64) + hb + data


def mutate_safetensors(rng, base):
    n, header, data = read_safetensors(base)
    names = [k for k in header if k != "__metadata__"]
    op = rng.randrange(16)
    if op == 0:  # the length field
        v = rng.choice([0, 1, 2, 7, n - 1, n + 1, n + 8, len(base), len(base) - 8, 2**31,
                        2**32 + n, 2**63, 2**64 - 1, 100 * 2**20, 16 * 2**20 + 1])
        return struct.pack("<Q", v % 2**64) + base[8:]
    if op == 1:  # truncated
        return base[: rng.choice([0, 1, 7, 8, 9, 8 + n // 2, 8 + n, 8 + n + 1,
                                  rng.randrange(len(base)), len(base) - 1])]
    if op == 2:  # trailing garbage
        return base + bytes(rng.randrange(256) for _ in range(rng.choice([1, 3, 4, 100])))
    if op == 3:  # NaN / Inf in a tensor's data (exit 0 with a warning)
        name = rng.choice(names)
        a, b = header[name]["data_offsets"]
        d = bytearray(data)
        val = rng.choice([float("nan"), float("inf"), float("-inf"), 3.4e38, 1e-45])
        for _ in range(rng.randrange(1, 5)):
            at = a + 4 * rng.randrange(max(1, (b - a) // 4))
            if at + 4 <= len(d):
                d[at:at + 4] = struct.pack("<f", val)
        return struct.pack("<Q", n) + base[8:8 + n] + bytes(d)
    h = json.loads(json.dumps(header))
    name = rng.choice(names)
    t = h[name]
    if op == 4:
        t["dtype"] = rng.choice(SAFE_DTYPES)
    elif op == 5:
        t["shape"] = rng.choice([[], [0], [-1], [1], [2**62, 2**62], [2**32, 2**32],
                                 list(reversed(t["shape"])), t["shape"] + [1], t["shape"][:1],
                                 [2**63], [1.5], ["64"], None, "64", [t["shape"][0] + 1] +
                                 t["shape"][1:]])
    elif op == 6:
        a, b = t["data_offsets"]
        t["data_offsets"] = rng.choice([[b, a], [a, a], [a + 1, b + 1], [a, b + 4], [0, b - a],
                                        [a, len(data) + 4], [2**63, 2**63 + b - a],
                                        [2**64 - 4, 2**64], [-4, b - a - 4], [a], [a, b, 0],
                                        None, ["0", "4"], [a + 0.5, b], [0, 2**64 + 4]])
    elif op == 7:
        del h[name]
    elif op == 8:
        h[name + rng.choice(["x", ".weight", ""])] = h.pop(name) if rng.random() < 0.5 else \
            dict(t)
    elif op == 9:
        h["__metadata__"] = rng.choice([{"a": 1}, {"a": None}, [], "x", {"format": "pt" * 3000},
                                        {"k" * 2000: "v"}, None])
    elif op == 10:
        h[name] = json_value(rng)
    elif op == 11:
        h = rng.choice([[], None, 1, "x", {}])
    elif op == 12:  # two tensors sharing one range
        other = rng.choice(names)
        h[other]["data_offsets"] = list(t["data_offsets"])
    elif op == 13:
        t[rng.choice(["extra", "dtype", "shape", "data_offsets"])] = json_value(rng)
    text = dumps(h)
    if op == 14:  # a duplicated tensor name
        text = text.replace("{", '{"%s": %s, ' % (name, dumps(t)), 1)
    if op == 15:  # header mangled as text
        return build_safetensors(mutate_json_text(rng, h, list(h.keys())), data)
    pad = " " * rng.choice([0, 0, 0, 3, 7])
    return build_safetensors(text + pad, data)


# ----------------------------------------------------------------------------- cases

def case_config(rng, env):
    base_name = rng.choice(env.configs)
    base = env.config_objs[base_name]
    tiny = base_name.startswith("golden_tiny")
    blob = mutate_json_text(rng, base, CONFIG_KEYS)
    files = {"config.json": blob}
    r = rng.random()
    if r < 0.55:
        args = ["estimate", "--model", "config.json", "--seq", str(rng.choice([16, 64, 512])),
                "--batch", str(rng.choice([1, 2, 8]))]
        if rng.random() < 0.3:
            args += ["--format", rng.choice(["json", "csv", "markdown", "html"]),
                     "--output", "out." + rng.choice(["json", "txt"])]
    elif r < 0.75:
        args = ["profile", "--model", "config.json", "--backend", "meta", "--seq", "16",
                "--batch", "1", "--steps", "1"]
    elif r < 0.88 and tiny:
        args = ["profile", "--model", "config.json", "--backend", "cpu", "--seq", "8",
                "--batch", "1", "--steps", "1", "--device-budget", "256MiB"]
    elif r < 0.94:
        args = ["maxbatch", "--model", "config.json", "--budget", rng.choice(["1GiB", "80GiB"]),
                "--seq", "64"]
    else:
        args = ["plan", "--model", "config.json", "--gpus", "8", "--global-batch", "16",
                "--gpu-memory", "80GiB", "--seq", "512"]
    return args, files


def case_weights(rng, env):
    blob = mutate_safetensors(rng, env.weights)
    files = {"w.safetensors": blob}
    args = ["profile", "--model", "tiny", "--backend", rng.choice(["cpu", "cpu", "cpu", "meta"]),
            "--seq", "16", "--batch", "1", "--steps", "1", "--device-budget", "256MiB",
            "--weights", "w.safetensors"]
    if rng.random() < 0.3:
        args += ["--format", "json", "--output", "r.json"]
    if rng.random() < 0.15:
        args += ["--dump", "d.safetensors"]
    return args, files


def case_tokens(rng, env):
    b, s = rng.choice([(1, 16), (2, 8), (1, 2)])
    vocab = 128  # tiny
    want = b * s
    n = rng.choice([0, 1, want - 1, want, want, want, want + 1, 2 * want])
    ids = []
    for _ in range(n):
        ids.append(rng.randrange(vocab))
    if ids and rng.random() < 0.7:
        for _ in range(rng.randrange(1, 4)):
            ids[rng.randrange(len(ids))] = rng.choice([-1, vocab, vocab + 1, 2**31 - 1, -2**31,
                                                       65535, 1 << 24])
    blob = b"".join(struct.pack("<i", i) for i in ids)
    if rng.random() < 0.15:
        blob = blob[: max(0, len(blob) - rng.randrange(1, 4))]
    files = {"t.bin": blob}
    args = ["profile", "--model", "tiny", "--backend", rng.choice(["cpu", "cpu", "meta"]),
            "--seq", str(s), "--batch", str(b), "--steps", "1", "--device-budget", "256MiB",
            "--tokens", "t.bin"]
    return args, files


def case_report(rng, env):
    name = rng.choice(sorted(env.reports))
    base = env.reports[name]
    blob = mutate_json_text(rng, base, list(base.keys()) if isinstance(base, dict) else [])
    files = {"a.json": blob}
    other = rng.choice(["native", "hf-eager", "b.json"])
    if other == "b.json":
        files["b.json"] = json.dumps(env.reports[rng.choice(sorted(env.reports))]).encode()
    args = ["diff", "a.json", other] if rng.random() < 0.5 else ["diff", other, "a.json"]
    if rng.random() < 0.3:
        args += ["--format", rng.choice(["json", "csv", "markdown", "table", "html"])]
    if rng.random() < 0.2:
        args += ["--profile", rng.choice(["native", "hf-eager", "zero", "x", ""])]
    return args, files


def int_text(rng, bound=None):
    pool = [str(v) for v in INT_EDGE]
    if bound is not None:
        pool += [str(bound - 1), str(bound), str(bound + 1), str(-bound), str(bound * 2)]
    r = rng.random()
    if r < 0.7:
        return rng.choice(pool)
    return rng.choice(WEIRD_TEXT)


def list_text(rng):
    n = rng.choice([0, 1, 2, 3, 5, 40])
    parts = [int_text(rng) if rng.random() < 0.3 else str(rng.choice([1, 2, 4, 8, 16, 32]))
             for _ in range(n)]
    sep = rng.choice([",", ",", ", ", ";", ",,"])
    return sep.join(parts)


def checkpointing_text(rng):
    """A policy or a list of them, valid or not (every:K, layers:LIST, budget:SIZE)."""
    def one():
        kind = rng.choice(["none", "full", "selective", "", "1", "every", "layers", "budget",
                           "both"])
        if kind == "every":
            return "every:" + int_text(rng, 64)
        if kind == "layers":
            return "layers:" + rng.choice([list_text(rng), int_text(rng, 64) + "-" +
                                           int_text(rng, 64), ""])
        if kind == "budget":
            return "budget:" + rng.choice(["1GiB", "0", "100", "1e3", "-5", "20GB", "", "x"])
        return kind
    return ",".join(one() for _ in range(rng.choice([1, 1, 1, 2, 3])))


COMMON_FLAGS = {
    "--batch": lambda rng: int_text(rng, 2**20),
    "--seq": lambda rng: int_text(rng, 2**20),
    "--dtype": lambda rng: rng.choice(["bf16", "fp16", "fp32", "fp8", "", "BF16", "\u00e9"]),
    "--optimizer": lambda rng: rng.choice(["adamw", "sgd", "lomo", "all", "adam", "", "adamw8bit", "paged-adamw8bit"]),
    "--checkpointing": lambda rng: checkpointing_text(rng),
    "--attention": lambda rng: rng.choice(["eager", "flash", "sdpa", ""]),
    "--offload-activations": lambda rng: None,
    "--profile": lambda rng: rng.choice(["native", "all", "hf-sdpa", "hf-eager,zero", ",", "x",
                                         "native,native", ""]),
    "--hf-version": lambda rng: rng.choice(["4.28", "4.30", "5.25", "9.9", "", "4", "x.y",
                                            "4." + "9" * 30]),
    "--torch-version": lambda rng: rng.choice(["1.13", "2.0", "2.15", "3", "", "2." + "9" * 30]),
    "--loop": lambda rng: rng.choice(["none", "shift-ce", "hf-model-loss", "x"]),
    "--format": lambda rng: rng.choice(["table", "json", "csv", "markdown", "html", "xml", ""]),
}
LAYOUT_FLAGS = {
    "--world-size": lambda rng: int_text(rng, 65536),
    "--dp": lambda rng: int_text(rng, 65536),
    "--tp": lambda rng: int_text(rng, 64),
    "--pp": lambda rng: int_text(rng, 64),
    "--cp": lambda rng: int_text(rng, 64),
    "--zero": lambda rng: rng.choice(["0", "1", "2", "3", "4", "-1", "", "3.0", "x"]),
    "--microbatches": lambda rng: int_text(rng, 16384),
    "--offload": lambda rng: rng.choice(["none", "optimizer", "optimizer+params", "params", ""]),
    "--reduce-bucket": lambda rng: rng.choice(["5e8", "0", "-1", "1e309", "1", "2e9", "x", "",
                                               "18446744073709551616", "nan"]),
    "--prefetch": lambda rng: int_text(rng, 1024),
    "--cuda-context": lambda rng: rng.choice(SIZE_TEXT),
    "--nccl-memory": lambda rng: rng.choice(SIZE_TEXT),
    "--nccl-channels": lambda rng: int_text(rng, 64),
}
def allocator_text(rng):
    return rng.choice([
        "pytorch", "pytorch:max_split_size_mb=128", "pytorch:max_split_size_mb=20",
        "pytorch:roundup_power2_divisions=4", "pytorch:roundup_power2_divisions=3",
        "pytorch:expandable_segments=true", "pytorch:expandable_segments=false",
        "pytorch:garbage_collection_threshold=0.6", "pytorch:", "pytorch:=,=",
        "pytorch:max_split_size_mb=99999999999999999999", "cuda", ""])


PROFILE_FLAGS = {
    "--allocator": allocator_text,
    "--steps": lambda rng: int_text(rng, 10000),
    "--seed": lambda rng: int_text(rng, 2**64),
    "--device-budget": lambda rng: rng.choice(SIZE_TEXT),
    "--collective-timeout": lambda rng: rng.choice(["1e-300", "1e-9", "0", "-1", "1", "604800",
                                                    "604801", "nan", "inf", "1e309", "", "x",
                                                    "0.999", "30"]),
    "--collectives": lambda rng: rng.choice(["mpi", "nccl", "x"]),
}
MAXBATCH_FLAGS = {
    "--allocator": allocator_text,
    "--budget": lambda rng: rng.choice(SIZE_TEXT),
    "--vary": lambda rng: rng.choice(["batch", "seq", "both", ""]),
    "--overhead": lambda rng: rng.choice(SIZE_TEXT),
    "--step": lambda rng: int_text(rng, 2**30),
}
PLAN_FLAGS = {
    "--gpus": lambda rng: int_text(rng, 65536),
    "--gpu-memory": lambda rng: rng.choice(SIZE_TEXT),
    "--seq": lambda rng: int_text(rng, 2**20),
    "--global-batch": lambda rng: int_text(rng, 2**24),
    "--dtype": COMMON_FLAGS["--dtype"],
    "--optimizer": COMMON_FLAGS["--optimizer"],
    "--margin": lambda rng: rng.choice(["0", "0.05", "0.99", "1", "1.5", "-0.1", "nan", "1e309",
                                        "inf", ""]),
    "--top": lambda rng: int_text(rng, 1000),
    "--cp": lambda rng: rng.choice(["auto", "1", "1,2", "2,4,8", "3", "0", "", "x", "2,2", "-1",
                                    "1,", "99999999999"]),
    "--tflops": lambda rng: rng.choice(["0", "160", "-1", "1e-300", "1e309", "nan", "inf", "x"]),
    "--link-gbps": lambda rng: rng.choice(["0", "400", "-1", "1e-300", "1e309", "nan", "inf"]),
    "--pcie-gbps": lambda rng: rng.choice(["0", "256", "-1", "1e-300", "nan"]),
    "--cuda-context": lambda rng: rng.choice(SIZE_TEXT),
    "--nccl-memory": lambda rng: rng.choice(SIZE_TEXT),
    "--nccl-channels": lambda rng: int_text(rng, 64),
    "--format": lambda rng: rng.choice(["table", "json", "csv", "markdown", "html"]),
}
SWEEP_FLAGS = {
    "--batch": list_text,
    "--seq": list_text,
    "--hidden": list_text,
    "--intermediate": list_text,
    "--heads": list_text,
    "--device-budget": lambda rng: rng.choice(SIZE_TEXT),
    "--steps": lambda rng: rng.choice(["1", "2", "0", "10001", "x"]),
    "--dtype": COMMON_FLAGS["--dtype"],
    "--format": COMMON_FLAGS["--format"],
}
SMALL_MODELS = ["tiny", "tiny-gqa", "tiny-tied", "tiny-awkward", "tiny-mistral", "tiny-qwen2",
                "tiny-qwen3", "tiny-llama3"]
ALL_MODELS = SMALL_MODELS + ["llama-7b", "llama2-70b", "llama3-8b", "qwen2.5-0.5b", "mistral-7b",
                             "small-256", "nonexistent", ""]


def pick(rng, table, k):
    names = sorted(table)
    out = []
    for name in rng.sample(names, min(k, len(names))):
        value = table[name](rng)
        out += [name] if value is None else [name, value]  # None: a flag without a value
    return out


def case_flags(rng, env):
    sub = rng.choice(["estimate", "estimate", "profile-meta", "profile-meta", "profile-cpu",
                      "maxbatch", "maxbatch", "plan", "plan", "sweep", "diff"])
    k = rng.choice([1, 1, 2, 3])
    if sub == "estimate":
        args = ["estimate", "--model", rng.choice(ALL_MODELS)]
        args += pick(rng, dict(COMMON_FLAGS, **LAYOUT_FLAGS), k)
    elif sub == "profile-meta":
        args = ["profile", "--backend", "meta", "--model", rng.choice(ALL_MODELS), "--seq", "64",
                "--batch", "1"]
        args += pick(rng, dict(COMMON_FLAGS, **LAYOUT_FLAGS, **PROFILE_FLAGS), k)
    elif sub == "profile-cpu":
        # Bounded work: a tiny model, one step, a budget; the sizes fuzzed stay under the
        # budget's refusal or are refused by it (exit 3).
        args = ["profile", "--backend", "cpu", "--model", rng.choice(SMALL_MODELS), "--seq", "8",
                "--batch", "1", "--steps", "1", "--device-budget", "128MiB"]
        table = {f: g for f, g in dict(COMMON_FLAGS, **PROFILE_FLAGS).items()
                 if f not in ("--steps", "--device-budget")}
        args += pick(rng, table, k)
    elif sub == "maxbatch":
        args = ["maxbatch", "--model", rng.choice(ALL_MODELS), "--budget", "1GiB", "--seq", "64"]
        args += pick(rng, dict(COMMON_FLAGS, **LAYOUT_FLAGS, **MAXBATCH_FLAGS), k)
    elif sub == "plan":
        args = ["plan", "--model", rng.choice(ALL_MODELS), "--gpus", "8", "--global-batch", "16",
                "--gpu-memory", "80GiB", "--seq", "512"]
        args += pick(rng, PLAN_FLAGS, k)
    elif sub == "sweep":
        args = ["sweep", "--backend", "meta", "--model", rng.choice(SMALL_MODELS), "--steps", "1",
                "--batch", "1,2", "--seq", "16,32"]
        args += pick(rng, SWEEP_FLAGS, k)
    else:
        spec = lambda: rng.choice(["native", "hf-eager", "zero", "megatron", "hf-sdpa",
                                   "native:batch=" + int_text(rng), "hf-eager:seq=" + int_text(rng),
                                   "native:dtype=" + rng.choice(["fp32", "x", ""]),
                                   "native:model=" + rng.choice(ALL_MODELS), "x:y=z", ":", "",
                                   "native:" + "a=" * 50])
        args = ["diff", spec(), spec(), "--model", rng.choice(SMALL_MODELS + ["llama-7b"])]
        args += pick(rng, COMMON_FLAGS, k)
    # CLI11 treats later flags as overriding? Put fuzzed values last; a value that starts
    # with '-' is passed as --flag=value so it is not read as another flag.
    out = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and i + 1 < len(args) and args[i + 1].startswith("-") and \
                not args[i + 1][1:2].isalpha():
            out.append(a + "=" + args[i + 1])
            i += 2
            continue
        out.append(a)
        i += 1
    if rng.random() < 0.15:
        out += ["--output", rng.choice(["out.json", "out.txt", "sub/out.json", "."])]
    return out, {}


def case_events(rng, env):
    events, live, next_id = [], [], 0
    for _ in range(rng.choice([1, 5, 40])):
        if live and rng.random() < 0.4:
            events.append({"op": "free", "id": live.pop(rng.randrange(len(live)))})
        else:
            events.append({"op": "alloc", "id": next_id, "stream": rng.choice([0, 0, 1]),
                           "bytes": rng.choice([1, 511, 512, 1048576, 1048577, 11534336,
                                                rng.randrange(1, 1 << 34)])})
            live.append(next_id)
            next_id += 1
    base = {"events": events}
    files = {"events.json": mutate_json_text(rng, base, ["events", "op", "id", "bytes", "stream"])}
    args = ["replay", "events.json"]
    if rng.random() < 0.5:
        args += ["--budget", rng.choice(["40MiB", "1GiB", "0", "-1", "1e309GiB", "x", "24GB"])]
    if rng.random() < 0.4:
        args += ["--allocator", allocator_text(rng)]
    if rng.random() < 0.3:
        args += ["--format", rng.choice(["json", "csv", "markdown", "table", "html"])]
    return args, files


def routing_counts(rng, tokens, experts=8, k=2):
    """tokens·k choices over `experts`, each expert at most `tokens` (a token picks k distinct)."""
    counts = [0] * experts
    for _ in range(tokens):
        for e in rng.sample(range(experts), k):
            counts[e] += 1
    return counts


def case_routing(rng, env):
    """A routing file for tiny-qwen3-moe (E 8, K 2, two MoE layers) at b 1, s 12: per rank
    (world 4 or 8, ep 1/2/4) for the meta trace of a layout, or one rank's for one GPU."""
    layout = rng.random() < 0.75
    world = rng.choice([4, 8]) if layout else 1
    pp = rng.choice([1, 2]) if layout else 1
    cp = rng.choice([1, 1, 2]) if layout and pp == 1 else 1
    tokens = 12 // cp
    layers = lambda lo, hi: [{"layer": g, "tokens_per_expert": routing_counts(rng, tokens)}
                             for g in range(lo, hi)]
    base = {"model": "tiny-qwen3-moe", "batch": 1, "seq": 12, "experts": 8,
            "experts_per_token": 2}
    if layout and rng.random() < 0.8:
        per = world // pp
        base.update({"world_size": world, "pp": pp, "cp": cp, "ep": 2, "microbatches": 1,
                     "sources": [{"rank": r, "micro_batch": 0,
                                  "layers": layers(r // per * (2 // pp), (r // per + 1) * (2 // pp))}
                                 for r in range(world)]})
    else:
        base["seq"] = tokens
        base["layers"] = layers(0, 2)
    # Nested mutations first (the sources' and layers' fields), then the document's.
    for _ in range(rng.choice([0, 1, 2])):
        where = base.get("sources") or [base]
        item = rng.choice(where)
        if "layers" in item and item["layers"] and rng.random() < 0.6:
            rec = rng.choice(item["layers"])
            if rng.random() < 0.5 and rec.get("tokens_per_expert"):
                t = rec["tokens_per_expert"]
                t[rng.randrange(len(t))] = json_value(rng)
            else:
                rec[rng.choice(["layer", "tokens_per_expert", "dropped"])] = json_value(rng)
        else:
            item[rng.choice(["rank", "micro_batch", "layers"])] = json_value(rng)
    files = {"routing.json": mutate_json_text(rng, base, [
        "sources", "layers", "world_size", "pp", "cp", "ep", "microbatches", "batch", "seq",
        "experts", "experts_per_token"])}
    args = ["profile", "--backend", "meta", "--model", "tiny-qwen3-moe", "--batch", "1", "--seq",
            "12", "--routing", "routing.json"]
    if layout:
        args += ["--world-size", str(world), "--ep", str(rng.choice([1, 2, 4]))]
        if pp > 1:
            args += ["--pp", str(pp)]
        if cp > 1:
            args += ["--cp", str(cp), "--attention", "flash"]
        if pp == 1 and rng.random() < 0.3:  # ZeRO-3 of the experts (gathered per layer)
            args += ["--zero", "3"]
    if rng.random() < 0.3:
        args += ["--format", rng.choice(["json", "csv", "markdown", "html"])]
    return args, files


KINDS = [("config", case_config, 30), ("weights", case_weights, 20), ("tokens", case_tokens, 8),
         ("report", case_report, 12), ("flags", case_flags, 30), ("events", case_events, 8),
         ("routing", case_routing, 6)]


def make_case(seed, i, env):
    rng = random.Random(seed * 1_000_003 + i)
    total = sum(w for _, _, w in KINDS)
    r = rng.randrange(total)
    for kind, fn, w in KINDS:
        if r < w:
            args, files = fn(rng, env)
            return kind, args, files
        r -= w
    raise AssertionError


# ----------------------------------------------------------------------------- running

class Env:
    pass


def setup(trainmem, work):
    """The bases: configs, a valid weights file, reports (each checked to load)."""
    env = Env()
    env.configs = []
    env.config_objs = {}
    for folder in (DATA, os.path.join(DATA, "configs")):
        for leaf in sorted(os.listdir(folder)):
            if leaf.endswith(".json") and ("config" in leaf or folder.endswith("configs")):
                path = os.path.join(folder, leaf)
                try:
                    obj = json.load(open(path))
                except ValueError:
                    continue
                if isinstance(obj, dict) and "hidden_size" in obj:
                    env.configs.append(leaf if folder == DATA else "configs/" + leaf)
                    env.config_objs[env.configs[-1]] = obj
    if not env.configs:
        raise SystemExit("fuzz_cli: no configs under " + DATA)
    base = os.path.join(work, "base")
    os.makedirs(base, exist_ok=True)

    def run(args):
        p = subprocess.run([trainmem] + args, cwd=base, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120)
        if p.returncode != 0:
            raise SystemExit("fuzz_cli: setup failed: trainmem %s: exit %d\n%s" % (
                " ".join(args), p.returncode, p.stderr.decode(errors="replace")))
        return p

    run(["profile", "--model", "tiny", "--backend", "cpu", "--batch", "1", "--seq", "16",
         "--steps", "1", "--dump", "grads.safetensors"])
    env.weights = open(os.path.join(base, "grads.safetensors"), "rb").read()
    # The dump loads as --weights (its extra "loss" tensor is reported as unused).
    run(["profile", "--model", "tiny", "--backend", "cpu", "--batch", "1", "--seq", "16",
         "--steps", "1", "--weights", "grads.safetensors"])
    env.reports = {}
    for name, args in [("estimate", ["estimate", "--model", "tiny", "--seq", "16"]),
                       ("estimate-7b", ["estimate", "--model", "llama-7b", "--profile",
                                        "hf-eager"]),
                       ("profile", ["profile", "--model", "tiny", "--backend", "meta", "--seq",
                                    "16", "--steps", "1"])]:
        p = run(args + ["--format", "json"])
        env.reports[name] = json.loads(p.stdout)
    return env


def listing(folder):
    out = []
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            out.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(out)


def check_output_complete(path, args):
    """A problem with an output file that exists after exit 0, or None."""
    leaf = os.path.basename(path)
    blob = open(path, "rb").read()
    if leaf.endswith(".safetensors"):
        try:
            n, header, data = read_safetensors(blob)
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                      default=0)
            if end != len(data):
                return "%s: data %d bytes, header says %d" % (leaf, len(data), end)
        except Exception as e:  # noqa: BLE001 - any parse failure is a partial file
            return "%s: not a whole safetensors file: %s" % (leaf, e)
    elif leaf.endswith(".json") and "json" in args and "--format" in args and \
            args[args.index("--format") + 1] == "json":
        try:
            json.loads(blob)
        except ValueError as e:
            return "%s: not whole JSON: %s" % (leaf, e)
    return None


def run_case(trainmem, work, seed, i, timeout, env):
    kind, args, files = make_case(seed, i, env)
    folder = os.path.join(work, "cases", "case-%d" % i)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for leaf, blob in files.items():
        with open(os.path.join(folder, leaf), "wb") as f:
            f.write(blob)
    if any(a.startswith("sub/") for a in args):
        os.makedirs(os.path.join(folder, "sub"))
    before = listing(folder)
    t0 = time.monotonic()
    problems = []
    code = None
    err = b""
    try:
        p = subprocess.Popen([trainmem] + args, cwd=folder, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
            code = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            problems.append("hang: no exit within %g s" % timeout)
    except OSError as e:
        problems.append("could not start: %s" % e)
    seconds = time.monotonic() - t0
    if code is not None:
        if code < 0:
            problems.append("killed by signal %d (%s)" % (-code, signal.Signals(-code).name))
        elif code not in OK_CODES:
            problems.append("exit %d" % code)
    if len(err) > MAX_STDERR:
        problems.append("stderr of %d bytes (over %d)" % (len(err), MAX_STDERR))
    text = err.decode("utf-8", "replace")
    if SANITIZER_RE.search(text):
        problems.append("sanitizer report on stderr")
    after = listing(folder)
    temps = [n for n in after if TEMP_RE.match(os.path.basename(n))]
    if temps:
        problems.append("temporary files left: %s" % temps)
    new = [n for n in after if n not in before and n not in temps]
    if code == 2 and new:
        problems.append("exit 2 but new files were written: %s" % new)
    if code == 0:
        for n in new:
            path = os.path.join(folder, n)
            if os.path.isfile(path):
                why = check_output_complete(path, args)
                if why:
                    problems.append("partial output: " + why)
    for leaf, blob in files.items():
        path = os.path.join(folder, leaf)
        if not os.path.isfile(path) or open(path, "rb").read() != blob:
            problems.append("input %s was changed" % leaf)
    result = {"i": i, "kind": kind, "args": args, "code": code, "seconds": seconds,
              "problems": problems, "stderr": text[-2000:]}
    if problems:
        keep = os.path.join(work, "failures", "case-%d" % i)
        shutil.rmtree(keep, ignore_errors=True)
        os.makedirs(keep)
        for leaf, blob in files.items():
            with open(os.path.join(keep, leaf), "wb") as f:
                f.write(blob)
        with open(os.path.join(keep, "repro.sh"), "w") as f:
            f.write("#!/bin/sh\n# fuzz_cli.py --seed %d --only %d (%s): %s\ncd \"$(dirname \"$0\")\"\n"
                    "%s\n" % (seed, i, kind, "; ".join(problems),
                              " ".join(shlex.quote(a) for a in [trainmem] + args)))
        with open(os.path.join(keep, "stderr.txt"), "w") as f:
            f.write(text)
        result["kept"] = keep
    shutil.rmtree(folder, ignore_errors=True)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainmem", required=True)
    ap.add_argument("--count", type=int,
                    default=int(os.environ.get("TRAINMEM_FUZZ_COUNT", "1200")))
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--work-dir", default=os.path.join(os.getcwd(), "fuzz_cli"))
    ap.add_argument("--deadline", type=float, default=float(os.environ.get(
        "TRAINMEM_FUZZ_DEADLINE", "480")),
        help="seconds after which no new case starts (the cases not run are reported)")
    ap.add_argument("--only", default="", help="comma list of case numbers to run")
    ap.add_argument("--list", action="store_true", help="print each case's command, run nothing")
    a = ap.parse_args()
    count = int(a.count * float(os.environ.get("TRAINMEM_FUZZ_SCALE", "1")))
    trainmem = os.path.abspath(a.trainmem)
    work = os.path.abspath(a.work_dir)
    shutil.rmtree(os.path.join(work, "cases"), ignore_errors=True)
    shutil.rmtree(os.path.join(work, "failures"), ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    t0 = time.monotonic()
    env = setup(trainmem, work)
    indices = [int(x) for x in a.only.split(",") if x] if a.only else list(range(count))
    if a.list:
        for i in indices:
            kind, args, files = make_case(a.seed, i, env)
            print(i, kind, " ".join(shlex.quote(x) for x in args))
        return 0
    print("fuzz_cli: %d cases, seed %d, %d jobs, timeout %g s, in %s" % (
        len(indices), a.seed, a.jobs, a.timeout, work), flush=True)
    results = []
    skipped = 0
    by_kind = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        pending = set()
        it = iter(indices)
        exhausted = False
        while True:
            while not exhausted and len(pending) < a.jobs * 2:
                if time.monotonic() - t0 > a.deadline:
                    rest = list(it)
                    skipped = len(rest)
                    exhausted = True
                    break
                try:
                    i = next(it)
                except StopIteration:
                    exhausted = True
                    break
                pending.add(pool.submit(run_case, trainmem, work, a.seed, i, a.timeout, env))
            if not pending:
                break
            done, pending = concurrent.futures.wait(
                pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for f in done:
                r = f.result()
                results.append(r)
                k = by_kind.setdefault(r["kind"], {"runs": 0, 0: 0, 2: 0, 3: 0, "bad": 0})
                k["runs"] += 1
                if r["problems"]:
                    k["bad"] += 1
                    print("FAIL case %d (%s): %s\n  %s\n  kept in %s\n  stderr: %s" % (
                        r["i"], r["kind"], "; ".join(r["problems"]),
                        " ".join(shlex.quote(x) for x in [trainmem] + r["args"]),
                        r["kept"], r["stderr"][-600:].replace("\n", "\n          ")),
                        flush=True)
                elif r["code"] in k:
                    k[r["code"]] += 1
    failed = [r for r in results if r["problems"]]
    elapsed = time.monotonic() - t0
    for kind in sorted(by_kind):
        k = by_kind[kind]
        print("  %-8s %5d runs: exit 0 %d, exit 2 %d, exit 3 %d, failed %d" % (
            kind, k["runs"], k[0], k[2], k[3], k["bad"]))
    slow = sorted(results, key=lambda r: -r["seconds"])[:3]
    for r in slow:
        print("  slowest: case %d %.1f s: %s" % (r["i"], r["seconds"], " ".join(r["args"])[:160]))
    if skipped:
        print("fuzz_cli: the deadline (%g s) passed: %d cases not run" % (a.deadline, skipped))
    print("fuzz_cli: %.0f s" % elapsed)
    print("%d passed, %d failed" % (len(results) - len(failed), len(failed)))
    if failed:
        print("reproducers (each folder holds repro.sh, the input files and stderr.txt):")
        for r in sorted(failed, key=lambda r: r["i"]):
            print("  %s" % os.path.join(r["kept"], "repro.sh"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
