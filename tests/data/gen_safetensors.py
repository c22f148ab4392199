#!/usr/bin/env python3
"""Writes tests/data/reference.safetensors with the REAL safetensors library (interop proof for nn/safetensors).

    python3 -m pip install --user safetensors numpy ml_dtypes
    python3 tests/data/gen_safetensors.py          # rewrites tests/data/reference.safetensors

Every value is a simple formula of the element index i (row-major); tests/test_safetensors.cpp re-derives
the same formulas independently and checks the loaded tensors against them.
"""
import os
import sys

import numpy as np
from safetensors.numpy import save_file

try:
    import ml_dtypes  # numpy has no bfloat16; safetensors.numpy stores ml_dtypes.bfloat16 as BF16
except ImportError:
    sys.exit("gen_safetensors.py needs ml_dtypes for the BF16 tensor: python3 -m pip install --user ml_dtypes")


def idx(n):
    return np.arange(n, dtype=np.int64)


tensors = {
    # f32[2,3]: 0.5*i - 1.25 (exact in binary)
    "f32": (0.5 * idx(6) - 1.25).astype(np.float32).reshape(2, 3),
    # f64[4]: 1/(i+1) (not exact: checks all 64 bits survive)
    "f64": 1.0 / (idx(4) + 1).astype(np.float64),
    # i64[3,2]: (i-3)*2^40 + i (negative and > 2^32)
    "i64": ((idx(6) - 3) * (1 << 40) + idx(6)).reshape(3, 2),
    # bool[5]: i%2==0 or i%3==0
    "mask": (idx(5) % 2 == 0) | (idx(5) % 3 == 0),
    # f16[4]: fixed values, bit patterns 3C00 C100 2E66 7BFF
    "half": np.array([1.0, -2.5, 0.1, 65504.0], dtype=np.float16),
    # bf16[2,2]: fixed values, bit patterns 3FC0 C000 4050 0000
    "brain": np.array([[1.5, -2.0], [3.25, 0.0]], dtype=ml_dtypes.bfloat16),
    # a 0-d tensor and an empty one
    "scalar": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((0, 3), dtype=np.float32),
    # nested name as a module's state_dict would have
    "layer.0.weight": (idx(4) * 0.25).astype(np.float64).reshape(2, 2),
}
metadata = {"format": "np", "producer": "gen_safetensors.py", "unicode": "\u00fc\u2192\U0001F600"}

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.safetensors")
save_file(tensors, out, metadata=metadata)
print(f"wrote {out} ({os.path.getsize(out)} bytes)")
