#!/usr/bin/env python3
"""Checks the include rule between trainmem's layers (docs/architecture.md, "Layers"): a file
includes only headers of its own layer or of the layers below it.

Usage: tools/check_layers.py [REPO_ROOT]   (default: the folder above this script)

Every file of include/, src/, kernels/ and tools/trainmem_main.cpp belongs to exactly one layer
(LAYERS below; a file that matches none is an error, so a new file must be placed). Each
`#include "..."` is resolved to a file of the repository (the including file's folder first,
then include/, src/, kernels/) and followed transitively, so a header reached through another
one counts. Exit 0 when every include stays in or below its layer; exit 1 printing
`file:line: LAYER may not include LAYER: chain` for each one that does not. Python 3 standard
library only. The build checks the other half (calls): the layer_link_* executables link each
layer's library whole against only the layers it may use.
"""
import os
import re
import sys

H = "include/trainmem/"

# layer: (the files it owns, the layers directly below it that it may use). Patterns: a trailing
# "/" matches a folder, a trailing "*" a prefix, anything else one exact path.
LAYERS = {
    "base": ([H + n for n in (
        "dtype.hpp", "hd.hpp", "error.hpp", "checked.hpp", "op_types.hpp", "train_enums.hpp",
        "categories.hpp", "param_init.hpp", "cuda_check.hpp", "config.hpp", "safetensors.hpp",
        "figures.hpp", "parallel.hpp", "bytes.hpp", "atomic_file.hpp", "input_file.hpp")] +
        ["src/base/"], []),
    "ledger": ([H + "ledger.hpp", "src/ledger/"], ["base"]),
    "analytic": ([H + "analytic.hpp", H + "analytic_rank.hpp", H + "dist_refs.hpp",
                  H + "plan.hpp", "src/analytic/"], ["base"]),
    "comm": ([H + "collective.hpp", "src/comm/"], ["base"]),
    "kernels": (["kernels/"], ["base"]),
    "backends": ([H + "backend.hpp", H + "device_allocator.hpp", H + "device_rules.hpp",
                  "src/backends/"], ["kernels", "ledger"]),
    "probes": ([H + "probes.hpp", H + "cupti_tag_allocator.hpp", "src/probes/"], ["backends"]),
    "model": ([H + "model.hpp", H + "decoder_layer.hpp", H + "model_acts.hpp", H + "model_io.hpp", H + "optimizer.hpp", H + "sharded_step.hpp",
               "src/model/"], ["backends", "comm"]),
    "report": ([H + "report.hpp", H + "report_writer.hpp", H + "diff.hpp", H + "svg_chart.hpp",
                "src/report/"],
               ["analytic"]),
    "run": ([H + "run.hpp", H + "run_layout.hpp", H + "run_report.hpp", H + "reconcile.hpp", H + "timeline.hpp",
             H + "fit.hpp", "src/run/"], ["model", "probes", "report", "comm"]),
    "cli": ([H + "cli.hpp", "src/cli/", "tools/trainmem_main.cpp"], ["run"]),
}

SCAN = ["include", "src", "kernels", "tools/trainmem_main.cpp"]
SEARCH = ["include", "src", "kernels"]
SUFFIXES = (".hpp", ".h", ".cuh", ".cpp", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def matches(path, pattern):
    if pattern.endswith("/"):
        return path.startswith(pattern)
    if pattern.endswith("*"):
        return path.startswith(pattern[:-1])
    return path == pattern


def any_match(path, patterns):
    return any(matches(path, p) for p in patterns)


class Tree:
    def __init__(self, root):
        self.root = root
        self.cache = {}

    def includes(self, rel):
        """[(line, included repo-relative path)] of rel's quoted includes that resolve."""
        if rel in self.cache:
            return self.cache[rel]
        out = []
        with open(os.path.join(self.root, rel), encoding="utf-8", errors="replace") as f:
            for n, text in enumerate(f, 1):
                m = INCLUDE.match(text)
                if not m:
                    continue
                target = self.resolve(rel, m.group(1))
                if target:
                    out.append((n, target))
        self.cache[rel] = out
        return out

    def resolve(self, rel, name):
        for base in [os.path.dirname(rel)] + SEARCH:
            cand = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(os.path.join(self.root, cand)):
                return cand.replace(os.sep, "/")
        return None  # a third-party or generated header

    def reach(self, rel):
        """{header: chain from rel} of everything rel includes, transitively."""
        seen = {}
        stack = [(rel, [rel])]
        while stack:
            cur, chain = stack.pop()
            for _, inc in self.includes(cur):
                if inc not in seen and inc != rel:
                    seen[inc] = chain + [inc]
                    stack.append((inc, chain + [inc]))
        return seen


def files(root):
    for top in SCAN:
        path = os.path.join(root, top)
        if os.path.isfile(path):
            yield top
            continue
        for d, _, names in os.walk(path):
            for name in sorted(names):
                if name.endswith(SUFFIXES):
                    yield os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")


def layer_of(rel):
    owners = [name for name, (patterns, _) in LAYERS.items() if any_match(rel, patterns)]
    return owners[0] if len(owners) == 1 else None


def allowed(layer):
    """The layer itself and every layer below it (the transitive closure of its uses)."""
    out, stack = set(), [layer]
    while stack:
        cur = stack.pop()
        if cur not in out:
            out.add(cur)
            stack.extend(LAYERS[cur][1])
    return out


def check(root):
    tree = Tree(root)
    broken = []
    for rel in sorted(files(root)):
        layer = layer_of(rel)
        if layer is None:
            broken.append(f"{rel}:1: belongs to no layer (or to several): place it in LAYERS")
            continue
        ok = allowed(layer)
        for line, inc in tree.includes(rel):
            reached = {inc: [rel, inc]}
            for h, chain in tree.reach(inc).items():
                reached.setdefault(h, [rel] + chain)
            for h, chain in sorted(reached.items(), key=lambda kv: (len(kv[1]), kv[0])):
                owner = layer_of(h)
                if owner is not None and owner not in ok:
                    broken.append(f"{rel}:{line}: {layer} may not include {owner}: " +
                                  " -> ".join(chain))
                    break  # one report per include line
    return broken


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    broken = check(root)
    for b in broken:
        print(b)
    if broken:
        print(f"check_layers: {len(broken)} upward include(s)")
        return 1
    print(f"check_layers: {len(LAYERS)} layers, every include in or below its own")
    return 0


if __name__ == "__main__":
    sys.exit(main())
