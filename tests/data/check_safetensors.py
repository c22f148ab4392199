#!/usr/bin/env python3
"""Loads a safetensors file WRITTEN BY ascender with the real safetensors library and validates it.

    ./build/tests/test_safetensors                       # writes <tmp>/asc_written.safetensors
    python3 tests/data/check_safetensors.py /tmp/asc_written.safetensors
    /usr/bin/python3 tests/data/check_safetensors.py /tmp/asc_written.safetensors   # + torch, if installed

Prints every tensor; when the file is the one test_safetensors.cpp writes (it has metadata "writer":
"test_safetensors"), also checks every value against the formulas below (written independently of the C++
test) and exits non-zero on any mismatch. Uses safetensors.numpy (all dtypes numpy has), the library's raw
deserializer (for BF16, which numpy lacks) and, when importable, safetensors.torch.
"""
import math
import struct
import sys

import numpy as np
import safetensors
from safetensors import safe_open


def bf16_to_float(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def f16_to_float(bits):
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


# name -> (dtype, shape, list of values in row-major order)
def expected():
    w = [[0.25 * (c * 3 + r) - 1 for c in range(4)] for r in range(3)]  # the transpose of a [4,3] arange
    return {
        "w.f32": ("F32", [3, 4], [v for row in w for v in row]),
        "f64": ("F64", [5], [1.0 / (i + 3) for i in range(5)]),
        "i64": ("I64", [2, 3], [(i * i << 33) - 5 * i for i in range(6)]),
        "mask": ("BOOL", [4], [i % 3 == 1 for i in range(4)]),
        "half": ("F16", [3], [f16_to_float(b) for b in (0x3C00, 0xC100, 0x7BFF)]),
        "brain": ("BF16", [2], [bf16_to_float(b) for b in (0x3FC0, 0xC000)]),
        "scalar": ("F64", [], [-7.25]),
        "empty": ("I64", [2, 0], []),
        "rng.seed": ("I64", [], [struct.unpack("<q", struct.pack("<Q", 0xFEEDFACECAFEBEEF))[0]]),
        "rng.offset": ("I64", [], [12345]),
    }


EXPECTED_META = {"step": "42", "note": 'quote" backslash\\ newline\n tab\t \u00fc'}


def main(path):
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    raw = open(path, "rb").read()
    # 1. the library's own parser/validator, every dtype as raw bytes
    entries = dict(safetensors.deserialize(raw))
    with safe_open(path, framework="numpy") as f:
        meta = f.metadata() or {}
        keys = list(f.keys())
    print(f"{path}: {len(keys)} tensors, metadata {meta}")
    # 2. numpy views via the library (BF16 decoded from the raw bytes: numpy has no bfloat16)
    arrays = {}
    with safe_open(path, framework="numpy") as f:
        for k in keys:
            e = entries[k]
            if e["dtype"] == "BF16":
                bits = np.frombuffer(bytes(e["data"]), dtype="<u2")
                arrays[k] = np.array([bf16_to_float(int(b)) for b in bits]).reshape(e["shape"])
            else:
                arrays[k] = f.get_tensor(k)
            print(f"  {k}: {e['dtype']} {list(e['shape'])} {arrays[k].ravel().tolist()}")

    if meta.get("writer") == "test_safetensors":
        exp = expected()
        check(sorted(keys) == sorted(exp), f"names {sorted(keys)} != {sorted(exp)}")
        for k, (dt, shape, vals) in exp.items():
            if k not in entries:
                continue
            check(entries[k]["dtype"] == dt, f"{k}: dtype {entries[k]['dtype']} != {dt}")
            check(list(entries[k]["shape"]) == shape, f"{k}: shape {entries[k]['shape']} != {shape}")
            got = arrays[k].ravel().tolist()
            check(len(got) == len(vals), f"{k}: {len(got)} values, expected {len(vals)}")
            for i, (g, v) in enumerate(zip(got, vals)):
                check(g == v, f"{k}[{i}]: {g!r} != {v!r}")
        for mk, mv in EXPECTED_META.items():
            check(meta.get(mk) == mv, f"metadata {mk}: {meta.get(mk)!r} != {mv!r}")
        # 3. torch, if this interpreter has it (safetensors.torch needs no numpy bridge)
        try:
            import torch
            from safetensors.torch import load_file
        except ImportError:
            print("torch: not importable here, skipped")
        else:
            tt = load_file(path)
            for k, (dt, shape, vals) in exp.items():
                t = tt[k]
                check(list(t.shape) == shape, f"torch {k}: shape {list(t.shape)} != {shape}")
                got = t.flatten().tolist()
                check(got == vals, f"torch {k}: {got} != {vals}")
            check(tt["brain"].dtype == torch.bfloat16 and tt["half"].dtype == torch.float16, "torch dtypes")
            print(f"torch {torch.__version__}: loaded {len(tt)} tensors, values checked")

        if failures:
            print("FAILED:\n  " + "\n  ".join(failures))
            return 1
        print("OK: every tensor and metadata entry matches")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
