#!/usr/bin/env python3
"""Checks the include rule between trainmem's layers (docs/architecture.md, "Layers"): a file
includes only headers of its own layer or of the layers below it.

Usage: tools/check_layers.py [REPO_ROOT]   (default: the folder above this script)

The rule is stated once, in CMakeLists.txt: each `trainmem_add_layer(NAME ... DEPS ...
[PRIVATE_DEPS ...])` declares a layer and the trainmem_* layers it may use (directly; the layers
below those are allowed through them), and `add_executable(trainmem SOURCES)` with
`target_link_libraries(trainmem PRIVATE trainmem_<layer>)` places the executable's sources above
the layer it links. This script reads both from there. A layer owns `include/trainmem/<name>/`
(its public headers), `src/<name>/` and a top-level `<name>/` folder where one exists
(kernels/). Every file of include/, src/, the layers' folders and the executable belongs to
exactly one layer (a file in none is an error, so a new file must be placed). Each
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
SEARCH = ["include", "src", "kernels"]
SUFFIXES = (".hpp", ".h", ".cuh", ".cpp", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
EXECUTABLE = "trainmem"  # the pseudo-layer of the executable's sources


def cmake_calls(text, command):
    """The argument lists (tokens) of every call of `command` in CMake text, comments dropped."""
    text = re.sub(r"#[^\n]*", "", text)
    out = []
    for m in re.finditer(r"\b" + re.escape(command) + r"\s*\(", text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            j += 1
        out.append(text[m.end():j - 1].split())
    return out


def read_layers(root):
    """{layer: (the files it owns (patterns), the layers it may use directly)} from CMakeLists.txt."""
    with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
        text = f.read()
    layers = {}
    for args in cmake_calls(text, "trainmem_add_layer"):
        name, deps, in_deps = args[0], [], False
        for tok in args[1:]:
            if tok in ("SOURCES", "DEPS", "PRIVATE_DEPS"):
                in_deps = tok != "SOURCES"
            elif in_deps and tok.startswith("trainmem_"):
                deps.append(tok[len("trainmem_"):])
        owned = [H + name + "/", "src/" + name + "/"]
        if os.path.isdir(os.path.join(root, name)):
            owned.append(name + "/")
        layers[name] = (owned, deps)
    exe_sources, exe_deps = [], []
    for args in cmake_calls(text, "add_executable"):
        if args and args[0] == EXECUTABLE:
            exe_sources = [a.replace("${PROJECT_SOURCE_DIR}/", "") for a in args[1:]]
    for args in cmake_calls(text, "target_link_libraries"):
        if args and args[0] == EXECUTABLE:
            exe_deps += [a[len("trainmem_"):] for a in args[1:] if a.startswith("trainmem_")]
    if exe_sources:
        layers[EXECUTABLE] = (exe_sources, exe_deps)
    for name, (_, deps) in layers.items():
        for dep in deps:
            if dep not in layers:
                raise SystemExit(f"check_layers: CMakeLists.txt: layer {name} uses {dep}, "
                                 "which is not a layer (trainmem_add_layer)")
    return layers


LAYERS = {}


def scan_roots():
    roots = ["include", "src"]
    for name, (patterns, _) in LAYERS.items():
        for p in patterns:
            if not p.startswith(("include/", "src/")):
                roots.append(p.rstrip("/"))
    return roots


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
    for top in scan_roots():
        path = os.path.join(root, top)
        if os.path.isfile(path):
            yield top
            continue
        if not os.path.isdir(path):
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
            broken.append(f"{rel}:1: belongs to no layer (or to several): place it in a layer's "
                          "folder (include/trainmem/<layer>/, src/<layer>/)")
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
    LAYERS.update(read_layers(root))
    broken = check(root)
    for b in broken:
        print(b)
    if broken:
        print(f"check_layers: {len(broken)} problem(s): upward includes, files in no layer")
        return 1
    print(f"check_layers: {len(LAYERS) - (EXECUTABLE in LAYERS)} layers and the executable "
          "(CMakeLists.txt), every include in or below its own")
    return 0


if __name__ == "__main__":
    sys.exit(main())
