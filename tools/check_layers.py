#!/usr/bin/env python3
"""Checks the include rule between trainmem's layers (docs/architecture.md, "Layers and the
include rule"): no layer includes a header of a layer above it.

Usage: tools/check_layers.py [REPO_ROOT]   (default: the folder above this script)

Scans every `#include "..."` of include/, src/ and kernels/, resolves it to a file of the
repository (the including file's folder first, then include/, src/, kernels/, as the build's
include paths do) and follows includes transitively, so a header reached through another one
counts. Exit 0 when every rule holds; exit 1 printing `file:line: rule: chain` for each
include that breaks one. Python 3 standard library only.
"""
import os
import re
import sys

# The base vocabulary: headers every layer may include. They include only each other.
BASE = [
    "include/trainmem/dtype.hpp",
    "include/trainmem/hd.hpp",
    "include/trainmem/error.hpp",
    "include/trainmem/checked.hpp",
    "include/trainmem/op_types.hpp",  # Trans, AdamWParams
    "include/trainmem/train_enums.hpp",  # Optimizer, Checkpointing, Attention
    "include/trainmem/param_init.hpp",
    "include/trainmem/cuda_check.hpp",
    "include/trainmem/categories.hpp",  # Category, Phase, CategoryBytes
]

# The rules. Each: (name, files it applies to, kind, patterns). Paths are relative to the
# repository root; a pattern ending in "/" matches a folder, one ending in "*" a prefix, any
# other one exact path. kind "only": every header the file reaches (transitively) must match
# a pattern; kind "never": no header it reaches may match one.
RULES = [
    ("base includes only base", BASE, "only", BASE),
    ("kernels include only kernels and base", ["kernels/"], "only", ["kernels/"] + BASE),
    ("ledger includes only base",
     ["include/trainmem/ledger.hpp", "src/ledger.cpp"], "only",
     ["include/trainmem/ledger.hpp"] + BASE),
    ("analytic never includes the ledger, backends, model, run, probes, kernels",
     ["include/trainmem/analytic.hpp", "src/analytic*"], "never",
     ["include/trainmem/ledger.hpp", "include/trainmem/backend.hpp",
      "include/trainmem/model*", "include/trainmem/optimizer.hpp",
      "include/trainmem/run*", "include/trainmem/probes.hpp",
      "include/trainmem/reconcile.hpp", "include/trainmem/device_allocator.hpp",
      "kernels/", "src/cuda/", "src/probes/", "src/cli/"]),
    ("backends and model never include run or the cli",
     ["include/trainmem/backend.hpp", "include/trainmem/model*",
      "include/trainmem/optimizer.hpp", "src/backends.cpp", "src/cpu_backend.cpp",
      "src/meta_backend.cpp", "src/model*", "src/optimizer.cpp", "src/cuda/"], "never",
     ["include/trainmem/run*", "include/trainmem/report*", "src/cli/"]),
    ("the library never includes the cli",
     ["include/", "kernels/", "src/"], "never", ["src/cli/"]),
]
# Not checked yet: src/cuda/device_allocator.cpp includes probes/cupti_tag.hpp and
# trainmem/probes.hpp (CUPTI tagging of each allocation); a rule "the device allocator never
# includes probes" waits for that tagging to become a wrapper around the allocator.

EXCEPT = {"src/cli/": ["src/cli/"]}  # the cli's own files may include each other
SCAN = ["include", "src", "kernels"]
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
        for d, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if name.endswith(SUFFIXES):
                    yield os.path.relpath(os.path.join(d, name), root).replace(os.sep, "/")


def check(root):
    tree = Tree(root)
    broken = []
    for rel in sorted(files(root)):
        for name, applies, kind, patterns in RULES:
            if not any_match(rel, applies):
                continue
            exempt = [e for k, ex in EXCEPT.items() if matches(rel, k) for e in ex]
            for line, inc in tree.includes(rel):
                reached = {inc: [rel, inc]}
                for h, chain in tree.reach(inc).items():
                    reached.setdefault(h, [rel] + chain)
                for h, chain in sorted(reached.items(), key=lambda kv: (len(kv[1]), kv[0])):
                    if any_match(h, exempt):
                        continue
                    bad = (kind == "only") != any_match(h, patterns)
                    if bad:
                        broken.append(f"{rel}:{line}: {name}: " + " -> ".join(chain))
                        break  # one report per include line and rule
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
    print(f"check_layers: {len(RULES)} rules hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
