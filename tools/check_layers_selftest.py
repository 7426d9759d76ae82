#!/usr/bin/env python3
"""Proves tools/check_layers.py can fail: on a small tree with an upward include (the ledger
reaching run.hpp through a base header), a file in no layer, and a clean downward include, it
must exit 1 and name exactly the first two. Usage: tools/check_layers_selftest.py"""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_layers.py")
TREE = {
    "include/trainmem/dtype.hpp": "#pragma once\n",
    "include/trainmem/error.hpp": '#pragma once\n#include "trainmem/run.hpp"\n',
    "include/trainmem/run.hpp": '#pragma once\n#include "trainmem/dtype.hpp"\n',
    "include/trainmem/ledger.hpp": '#pragma once\n#include "trainmem/dtype.hpp"\n',
    "src/ledger/ledger.cpp": '#include "trainmem/ledger.hpp"\n#include "trainmem/error.hpp"\n',
    "src/run/run.cpp": '#include "trainmem/run.hpp"\n#include "trainmem/ledger.hpp"\n',
    "src/stray.cpp": "int x;\n",
}

with tempfile.TemporaryDirectory() as root:
    for rel, text in TREE.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    r = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
    out = r.stdout
    expect = [
        "src/ledger/ledger.cpp:2: ledger may not include run: src/ledger/ledger.cpp -> "
        "include/trainmem/error.hpp -> include/trainmem/run.hpp",
        "include/trainmem/error.hpp:2: base may not include run",
        "src/stray.cpp:1: belongs to no layer",
    ]
    problems = [f"missing: {e}" for e in expect if e not in out]
    if r.returncode != 1:
        problems.append(f"exit {r.returncode}, expected 1")
    if "src/run/run.cpp" in out:
        problems.append("run.cpp's downward include of the ledger was reported")
    if problems:
        print(out)
        print("\n".join(problems))
        sys.exit(1)
    print("check_layers self-test: the upward includes and the stray file were caught")
