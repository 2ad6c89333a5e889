"""The engine's layers, and the check that the code keeps to them (ctest c/layers).

Each folder of engine/ is a layer, and kernels/ is one more. A layer may use itself and the
layers it sits on, directly or through others (the closure of SITS_ON below):

    common   errors, dtype codes, buffers, the JSON reader, cpuid (sits on nothing)
    runtime  the CUDA runtime: devices, streams, events, launch   (common)
             checks, host waits, cuBLASLt handles, graphs
    kernels  CPU and CUDA kernels over raw buffers                (runtime)
    core     tensors, views, autograd, the gradient sums          (kernels)
    obs      telemetry store, Prometheus, NVML, trace             (core)
    io       safetensors, checkpoint writer, checksums            (core)
    optim    optimizer ops, step stats, amp, low-precision copies (core)
    dist     communicators, mesh, reducer, comm autograd         (obs, optim)
    ops      one op family a file, collectives inside ops        (dist)
    data     tokenizers, loader, docs, shards, s3                 (io)
    cuda     the allocator's CUDA table, tt_cuda_init, cuDNN      (ops, data)
             attention, the low-precision GEMMs

(host/, the program, is no part of the library and may use everything.)

Checked here:
  symbols  every strong undefined symbol of an object of libtetra_engine (and of
           libtetra_cuda in a CUDA build) is defined by an object of its own layer or of one
           it sits on; weak references are the hooks a higher layer fills when it is linked
           in (the kernels' CUDA tables, the CUDA strided copy, the low-precision GEMMs) and
           are not counted, nor are tables handed down at start-up (tt_cuda_init gives the
           allocator its device table and the attention kernel cuDNN's); and no objects
           form a cycle, within a layer or across layers (within core: tensor < grad <
           autograd < view; within dist: util < nccl < comm, the watchdog handed down).
  includes every #include "..." of kernels/ names a file in kernels/; every one of an
           engine layer names its own layer, one it sits on, a public header at engine/'s
           root, or a kernels/ header (kernels' headers declare types and tables only:
           what links is what the symbol check sees).

Usage: check_layers.py SOURCE_DIR OBJECT_LIST_FILE...
  Each OBJECT_LIST_FILE holds a library's object files (tetra_engine, tetra_cuda), one a
  line.
"""
import os
import re
import subprocess
import sys

SITS_ON = {
    "common": [],
    "runtime": ["common"],
    "kernels": ["runtime"],
    "core": ["kernels"],
    "obs": ["core"],
    "io": ["core"],
    "optim": ["core"],
    "dist": ["obs", "optim"],
    "ops": ["dist"],
    "data": ["io"],
    "cuda": ["ops", "data"],
}


def below(layer, seen=None):
    """The layers `layer` may use: itself and the closure of SITS_ON."""
    seen = set() if seen is None else seen
    if layer in seen:
        sys.exit(f"FAIL: SITS_ON has a cycle through {layer}")
    out = {layer}
    for lower in SITS_ON[layer]:
        out |= below(lower, seen | {layer})
    return out


ALLOWED = {layer: below(layer) for layer in SITS_ON}


def layer_of(path):
    """Layer of a source path relative to the root, None for engine/'s public headers,
    'host' for the program."""
    parts = path.split("/")
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] == "engine" and len(parts) > 2:
        return parts[1]
    return None


def source_of(obj):
    """engine/core/tensor.c for .../CMakeFiles/tetra_engine.dir/engine/core/tensor.c.o
    (or tetra_cuda.dir/..., tetra_kernels_cpu.dir/...)."""
    rel = re.split(r"tetra_(?:engine|cuda|kernels_cpu)\.dir/", obj, maxsplit=1)[-1]
    return rel[:-2] if rel.endswith(".o") else rel


def check_symbols(objects):
    defined, undefined = {}, {}
    for obj in objects:
        src = source_of(obj)
        out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
        refs = set()
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBRCVWG":
                defined[f[2]] = src
            elif len(f) == 2 and f[0] == "U":
                refs.add(f[1])
        undefined[src] = refs
    errors = []
    uses = {src: set() for src in undefined}
    for src, refs in sorted(undefined.items()):
        for sym in sorted(refs):
            dst = defined.get(sym)
            if dst is None or dst == src:
                continue
            uses[src].add(dst)
            a, b = layer_of(src), layer_of(dst)
            if b not in ALLOWED[a]:
                errors.append(f"{src} ({a}) calls {sym} of {dst} ({b}): {a} sits on "
                              f"{', '.join(sorted(ALLOWED[a] - {a})) or 'nothing'}")
    # Cycles of objects (Tarjan's strongly connected components), any of them.
    index, low, stack, on_stack, counter = {}, {}, [], set(), [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(uses[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                across = len({layer_of(c) for c in comp}) > 1
                errors.append(("cycle across layers: " if across else "cycle of files: ") +
                              " <-> ".join(sorted(comp)))

    sys.setrecursionlimit(10000)
    for v in sorted(uses):
        if v not in index:
            visit(v)
    return errors


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def resolve(root, src, name):
    """The file `#include "name"` in src opens: its own folder first, then the include
    directories in the build's order (engine, kernels)."""
    for base in (os.path.dirname(src), "engine", "kernels"):
        cand = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def check_includes(root):
    errors = []
    sources = []
    for top in ("engine", "kernels"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith((".c", ".h", ".cu")):
                    sources.append(os.path.relpath(os.path.join(d, f), root))
    for src in sorted(sources):
        a = layer_of(src)
        if a is None or a == "host":
            continue
        with open(os.path.join(root, src), encoding="utf-8") as fh:
            text = fh.read()
        for name in INCLUDE.findall(text):
            dst = resolve(root, src, name)
            if dst is None:
                continue   # a generated or system header reached through -I
            b = layer_of(dst)
            if a == "kernels":
                if b != "kernels":
                    errors.append(f'{src} includes "{name}" ({dst}): kernels/ includes '
                                  "nothing from engine/")
            elif b is not None and b != "kernels" and b not in ALLOWED[a]:
                errors.append(f'{src} ({a}) includes "{name}" ({dst}, {b}): {a} sits on '
                              f"{', '.join(sorted(ALLOWED[a] - {a}))}")
    return errors


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("Usage: ")[1])
    root, objects = sys.argv[1], []
    for listing in sys.argv[2:]:
        with open(listing, encoding="utf-8") as fh:
            named = [l.strip() for l in fh if l.strip()]
        if not named:
            sys.exit(f"FAIL: {listing} names no object files")
        objects += named
    layers = {layer_of(source_of(o)) for o in objects}
    unknown = layers - set(SITS_ON)
    if unknown:
        sys.exit(f"FAIL: objects in folders that are no layer: {sorted(unknown)} (add them "
                 "to SITS_ON in tests/layers/check_layers.py and TETRA_LAYERS)")
    errors = check_symbols(objects) + check_includes(root)
    for e in errors:
        print("FAIL:", e)
    if errors:
        sys.exit(1)
    print(f"layers: {len(objects)} objects in {len(layers)} layers, every reference and "
          "include downward, no cycle of files")


if __name__ == "__main__":
    main()
