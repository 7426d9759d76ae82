#!/usr/bin/env python3
"""Exact parameter counts of the family presets, from the real HuggingFace classes.

For each preset with a config.json in tests/data/configs/ (the published file for the real
models, the issue-16 shapes for the tiny ones), builds the transformers class the file names
(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) on PyTorch's meta
device, so no weight is allocated, and sums p.numel() over model.parameters() (a tied lm_head
is the embedding's tensor and counts once). Writes tests/data/hf_param_counts.json, which
tests/test_config_hf.cpp (HfConfig.ParamCountsEqualTheRealHfClasses) compares with
ModelConfig::param_count().

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers
    /tmp/venv/bin/python tools/hf_param_counts.py [--check]

--check compares with the stored file instead of writing it (exit 1 on a difference).
--write-tf5 also writes each config as this transformers saves it (to_json_file:
rope_parameters, dtype, layer_types) to tests/data/configs/tf5/, which the loader must read
to the same model (HfConfig.TransformersFiveSavedConfigsLoadToTheirPresets).
"""
import argparse
import json
import pathlib
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "data" / "configs"
OUT = ROOT / "tests" / "data" / "hf_param_counts.json"
PRESETS = ["llama2-7b", "llama3-8b", "llama3.2-1b", "mistral-7b", "qwen2-7b", "qwen2.5-0.5b",
           "qwen2.5-7b", "qwen3-0.6b", "qwen3-8b", "tiny-mistral", "tiny-qwen2", "tiny-qwen3",
           "tiny-llama3"]


def load(name):
    d = json.loads((CONFIGS / f"{name}.json").read_text())
    d.pop("transformers_version", None)
    return AutoConfig.for_model(d.pop("model_type"), **d), d


def count(name):
    cfg, d = load(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert type(model).__name__ == d["architectures"][0], (name, type(model).__name__)
    return sum(p.numel() for p in model.parameters()), type(model).__name__


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--write-tf5", action="store_true")
    args = ap.parse_args()
    if args.write_tf5:
        (CONFIGS / "tf5").mkdir(exist_ok=True)
        for name in PRESETS:
            load(name)[0].to_json_file(CONFIGS / "tf5" / f"{name}.json")
    counts, classes = {}, {}
    for name in PRESETS:
        counts[name], classes[name] = count(name)
        print(f"{name:14s} {classes[name]:20s} {counts[name]:>15,d}")
    doc = {
        "tool": "tools/hf_param_counts.py",
        "method": "sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters()) "
                  "on the meta device, cfg from tests/data/configs/<preset>.json",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "classes": classes,
        "counts": counts,
    }
    if args.check:
        stored = json.loads(OUT.read_text())["counts"]
        if stored != counts:
            print(f"differs from {OUT}: {stored}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
