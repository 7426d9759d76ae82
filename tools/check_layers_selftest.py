#!/usr/bin/env python3
"""Proves tools/check_layers.py can fail: on a small tree whose CMakeLists.txt declares three
layers and the executable, with an upward include (the ledger reaching run.hpp through a base
header), files in no layer, and clean downward includes, it must exit 1 and name exactly the
upward includes and the stray files. Usage: tools/check_layers_selftest.py"""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_layers.py")
TREE = {
    # The rule as the real CMakeLists.txt states it: base below ledger below run.
    "CMakeLists.txt": "trainmem_add_layer(base SOURCES ${S}/base/a.cpp DEPS spdlog::spdlog)\n"
                      "# a comment (ignored): trainmem_add_layer(bogus DEPS trainmem_run)\n"
                      "trainmem_add_layer(ledger SOURCES ${S}/ledger/ledger.cpp\n"
                      "                   DEPS trainmem_base)\n"
                      "trainmem_add_layer(run SOURCES ${S}/run/run.cpp DEPS trainmem_ledger)\n"
                      "add_executable(trainmem ${PROJECT_SOURCE_DIR}/tools/main.cpp)\n"
                      "target_link_libraries(trainmem PRIVATE trainmem_run)\n",
    "include/trainmem/base/dtype.hpp": "#pragma once\n",
    "include/trainmem/base/error.hpp": '#pragma once\n#include "trainmem/run/run.hpp"\n',
    "include/trainmem/run/run.hpp": '#pragma once\n#include "trainmem/base/dtype.hpp"\n',
    "include/trainmem/ledger/ledger.hpp": '#pragma once\n#include "trainmem/base/dtype.hpp"\n',
    "src/ledger/ledger.cpp": '#include "trainmem/ledger/ledger.hpp"\n#include "trainmem/base/error.hpp"\n',
    "src/run/run.cpp": '#include "trainmem/run/run.hpp"\n#include "trainmem/ledger/ledger.hpp"\n',
    "tools/main.cpp": '#include "trainmem/run/run.hpp"\n',
    "src/stray.cpp": "int x;\n",
    "include/trainmem/bogus/x.hpp": "#pragma once\n",
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
        "include/trainmem/base/error.hpp -> include/trainmem/run/run.hpp",
        "include/trainmem/base/error.hpp:2: base may not include run",
        "src/stray.cpp:1: belongs to no layer",
    ]
    problems = [f"missing: {e}" for e in expect if e not in out]
    if r.returncode != 1:
        problems.append(f"exit {r.returncode}, expected 1")
    for fine in ("src/run/run.cpp", "tools/main.cpp"):
        if fine in out:
            problems.append(f"{fine}'s downward include was reported")
    if problems:
        print(out)
        print("\n".join(problems))
        sys.exit(1)
    print("check_layers self-test: the upward includes and the stray file were caught")
