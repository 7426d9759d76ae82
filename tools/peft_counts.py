#!/usr/bin/env python3
"""LoRA's trainable parameter counts, from the real peft on the real HuggingFace classes.

For each preset with a config.json in tests/data/configs/, builds the transformers class on
PyTorch's meta device (no weight is allocated), wraps it with `peft.get_peft_model` and a
`LoraConfig(r, target_modules)` for a few ranks and target lists (peft's default for the model
type, "all-linear", and a list naming the row-parallel projections), and records peft's own
count, `PeftModel.get_nb_trainable_parameters()`: (trainable, all). Writes
tests/data/peft_counts.json, which tests/test_config.cpp (Lora.TrainableCountsEqualPeft)
compares with lora_trainable_count().

    python3 -m pip install --target /tmp/bnbpy torch transformers accelerate psutil
    python3 -m pip install --target /tmp/bnbpy --no-deps peft
    PYTHONPATH=/tmp/bnbpy python3 tools/peft_counts.py [--check]

--check compares with the stored file instead of writing it (exit 1 on a difference).
"""
import argparse
import json
import pathlib
import sys

import peft
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "data" / "configs"
OUT = ROOT / "tests" / "data" / "peft_counts.json"
PRESETS = ["llama3-8b", "llama2-7b", "mistral-7b", "qwen2.5-7b", "qwen3-8b", "tiny-llama3",
           "tiny-qwen2", "tiny-qwen3"]
TARGETS = {
    "default": None,  # peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    "all-linear": "all-linear",
    "o_proj,down_proj": ["o_proj", "down_proj"],
}
RANKS = [8, 16, 64]


def model_of(name):
    d = json.loads((CONFIGS / f"{name}.json").read_text())
    d.pop("transformers_version", None)
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def counts():
    out = {}
    for name in PRESETS:
        for tname, targets in TARGETS.items():
            for r in RANKS:
                model = model_of(name)
                lora = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets,
                                       task_type="CAUSAL_LM")
                pm = peft.get_peft_model(model, lora)
                trainable, total = pm.get_nb_trainable_parameters()
                modules = sorted({n.split(".")[-1] for n, m in pm.named_modules()
                                  if isinstance(m, peft.tuners.lora.LoraLayer)})
                out[f"{name}/{tname}/r{r}"] = {"trainable": trainable, "all": total,
                                               "targets": modules}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    doc = {
        "tool": "tools/peft_counts.py",
        "method": "PeftModel.get_nb_trainable_parameters() of get_peft_model(<class on the meta "
                  "device>, LoraConfig(r, target_modules)), configs from tests/data/configs",
        "peft": peft.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "counts": counts(),
    }
    text = json.dumps(doc, indent=2) + "\n"
    if args.check:
        old = json.loads(OUT.read_text())
        if old["counts"] != doc["counts"]:
            print("peft_counts.py: counts differ from", OUT, file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(doc['counts'])} counts, peft {peft.__version__})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
