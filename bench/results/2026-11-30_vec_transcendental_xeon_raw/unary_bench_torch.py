# PyTorch twin of unary_bench.cpp: the same ops on a (2048, 512) float32 tensor, 2 threads, best of 5 batches of 20.
import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
g = torch.Generator().manual_seed(1)
x0 = torch.randn(2048, 512, generator=g) * 2.0
gy = torch.randn(2048, 512, generator=g)
xpos = x0.abs() + 1e-3
ops = [("exp", torch.exp), ("log", torch.log), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid),
       ("silu", F.silu), ("softplus", lambda t: F.softplus(t, 1.0, 20.0)),
       ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh")), ("gelu", F.gelu)]


def best_ms(f):
    for _ in range(5):
        f()
    best = 1e30
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20):
            f()
        best = min(best, (time.perf_counter() - t0) * 1e3 / 20)
    return best


for name, op in ops:
    inp = xpos if name == "log" else x0
    x = inp.clone().requires_grad_(True)
    with torch.no_grad():
        fwd = best_ms(lambda: op(inp))

    def fb():
        x.grad = None
        op(x).backward(gy)
    print(f"pytorch {torch.__version__},{name},{fwd:.4f},{best_ms(fb):.4f}")
