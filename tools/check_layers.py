#!/usr/bin/env python3
"""check_layers: every #include "folder/..." in the library's folders goes down the layers (docs/architecture.md).

  python3 tools/check_layers.py              # this checkout: exit 0, or 1 listing each include against the order
  python3 tools/check_layers.py --root DIR   # another tree of the same layout
  python3 tools/check_layers.py --self-test  # plants a wrong include in a temporary tree and expects it found

The layers, lowest first; a folder may include itself and the folders listed for it:
  core, autograd, ops, cuda (the CUDA backend), then nn and optim (siblings: neither includes the other), data,
  stats, models, train (the trainer library and what joins nn and optim: the training checkpoint, process groups,
  DDP). tests/, tools/, bench/ and examples/ may include anything.
"""
import argparse
import os
import re
import sys
import tempfile

ALLOWED = {
    "core": {"core"},
    "autograd": {"core", "autograd"},
    "ops": {"core", "autograd", "ops"},
    "cuda": {"core", "autograd", "ops", "cuda"},
    "nn": {"core", "autograd", "ops", "nn"},
    "optim": {"core", "autograd", "ops", "optim"},
    "data": {"core", "autograd", "ops", "data"},
    "stats": {"core", "stats"},
    "models": {"core", "autograd", "ops", "nn", "models"},
    "train": {"core", "autograd", "ops", "cuda", "nn", "optim", "data", "stats", "models", "train"},
}
# Single headers a folder may include against the order, each with the reason.
EXCEPTIONS = {
    # cuda/process_group_nccl.cpp implements the trainer layer's process-group interface; it lives with the CUDA
    # sources because it links CUDA.
    ("cuda/process_group_nccl.cpp", "train/process_group.h"),
    ("cuda/process_group_nccl.cpp", "train/collective_signature.h"),
    # Deprecated forwarding headers of 0.2 (the headers moved to train/), kept one minor version.
    ("nn/serialize.h", "train/checkpoint.h"),
    ("nn/distributed.h", "train/distributed.h"),
    ("nn/process_group.h", "train/process_group.h"),
}
# The public CUDA API (cuda/cuda.h: is_available, devices, TF32) is built into the CPU library: any layer above ops
# may ask it.
PUBLIC_CUDA = "cuda/cuda.h"
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z_0-9]+)/([^"]+)"', re.M)


def violations(root):
    out = []
    for folder, allowed in ALLOWED.items():
        base = os.path.join(root, folder)
        for dirpath, _, files in os.walk(base):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target, header = m.group(1), m.group(1) + "/" + m.group(2)
                    if target not in ALLOWED or target in allowed:
                        continue  # not a layer of the library (a system path such as CLI/), or allowed
                    if (rel, header) in EXCEPTIONS:
                        continue
                    if header == PUBLIC_CUDA and folder not in ("core", "autograd", "ops"):
                        continue
                    line = text.count("\n", 0, m.start()) + 1
                    out.append(f"{rel}:{line}: includes {header}; {folder}/ may include only "
                               f"{', '.join(sorted(allowed))}")
    return out


def self_test():
    with tempfile.TemporaryDirectory() as root:
        for folder in ALLOWED:
            os.makedirs(os.path.join(root, folder))
        with open(os.path.join(root, "nn", "layer.h"), "w") as f:
            f.write('#include "core/tensor.h"\n#include "optim/optimizer.h"\n')
        with open(os.path.join(root, "optim", "sgd.cpp"), "w") as f:
            f.write('#include "optim/sgd.h"\n  #  include "nn/module.h"\n')
        with open(os.path.join(root, "train", "loop.cpp"), "w") as f:
            f.write('#include "nn/module.h"\n#include "optim/sgd.h"\n#include "cuda/cuda.h"\n')
        with open(os.path.join(root, "ops", "x.cpp"), "w") as f:
            f.write('#include "cuda/cuda.h"\n#include <CLI/CLI.hpp>\n')
        found = violations(root)
        expected = ["nn/layer.h:2: includes optim/optimizer.h", "optim/sgd.cpp:2: includes nn/module.h",
                    "ops/x.cpp:1: includes cuda/cuda.h"]
        ok = len(found) == len(expected) and all(any(f.startswith(e) for f in found) for e in expected)
        print("check_layers self-test:", "passed" if ok else "FAILED")
        for f in found:
            print("  found:", f)
        return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                   help="the source tree (default: this checkout)")
    p.add_argument("--self-test", action="store_true", help="check the checker on a planted violation")
    a = p.parse_args()
    if a.self_test:
        return self_test()
    if not os.path.isdir(os.path.join(a.root, "core")):
        print(f"check_layers: {a.root} has no core/ folder: not an ascender source tree", file=sys.stderr)
        return 2
    found = violations(a.root)
    for v in found:
        print(v)
    print(f"check_layers: {len(found)} include(s) against the layer order" if found else
          "check_layers: every include goes down the layers")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
