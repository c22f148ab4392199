# PyTorch twin of softmax_bench.cpp: the same shapes, 2 threads, best of 5 batches of 50 calls.
import time

import torch

torch.set_num_threads(2)


def best_ms(f):
    for _ in range(5):
        f()
    best = 1e30
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(50):
            f()
        best = min(best, (time.perf_counter() - t0) * 1e3 / 50)
    return best


for n in (2, 4, 5, 8, 15, 16, 17, 24, 31, 32, 33):
    rows = (1 << 19) // n
    x = torch.randn(rows, n)
    gy = torch.randn(rows, n)
    xr = x.clone().requires_grad_(True)

    def fb():
        xr.grad = None
        torch.softmax(xr, -1).backward(gy)
    f = best_ms(lambda: torch.softmax(x, -1))
    lf = best_ms(lambda: torch.log_softmax(x, -1))
    print(f"pytorch {torch.__version__},{n},{f:.4f},{lf:.4f},{best_ms(fb):.4f}")
