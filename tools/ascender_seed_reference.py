#!/usr/bin/env python3
"""The speed reference of tools/bench_ascender: a twin of the PyTorch reference head that accompanies the ASCender
method description, run with PyTorch (Debian's python3-torch) in the same benchmark run.

It reproduces that code's behaviour, including where it differs from the method's own formulas (see
docs/ascender.md §12.4) — it is a timing reference, not a correctness reference:
  * its neighbour gather expands k̂ along the key axis before gathering, so it returns the token's own key k times
    (u_i = k̂_i: alignment degenerates to cos(k_i, k_j));
  * row normalisation uses the unbiased std; 1e-6 is added to τ_sep, τ_coh, κ, τ_score and the centroid's
    denominator; ρ_i includes i; there are no gates; its top-k includes i; masks apply only after the statistics.
ascender's AscenderAttention follows the formulas instead.

Usage: ascender_seed_reference.py --n 128 512 --batch 4 --d-model 128 --heads 2 --k 16 --d-z 16 --reps 3
Prints one JSON object per n: {"n": .., "forward_ms": .., "fwd_bwd_ms": ..} (best of reps, 2 threads).
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


class SeedHead(torch.nn.Module):
    """One head of the reference code (bias-free projections, scalar parameters as in the original)."""

    def __init__(self, d_model, d_head, d_z, k):
        super().__init__()
        self.q, self.key, self.v = (torch.nn.Linear(d_model, d_head, bias=False) for _ in range(3))
        self.z = torch.nn.Linear(d_model, d_z, bias=False)
        self.e = torch.nn.Linear(d_model, d_z, bias=False)
        self.k = k
        self.tau_sep = self.tau_coh = 1.0
        scalar = lambda v: torch.nn.Parameter(torch.tensor(v))
        self.lam_a, self.lam_s, self.lam_c = scalar(1.0), scalar(1.0), scalar(1.0)
        self.om_a, self.om_s, self.om_c = scalar(0.1), scalar(0.1), scalar(0.1)
        self.temp, self.delta, self.kappa = scalar(1.0), scalar(0.2), scalar(32.0)

    @staticmethod
    def row_norm(b, eps=1e-6):
        return (b - b.mean(-1, keepdim=True)) / (b.std(-1, keepdim=True) + eps)  # unbiased std, as the code does

    def forward(self, x):
        B, N, _ = x.shape
        q, key, v, z, e = self.q(x), self.key(x), self.v(x), self.z(x), self.e(x)
        d = q.size(-1)
        s_base = q @ key.transpose(-2, -1) / d ** 0.5
        en = F.normalize(e, dim=-1)
        a = en @ en.transpose(-2, -1)
        kk = min(self.k, N)
        idx = torch.topk(a, k=kk, dim=-1).indices                            # includes i itself
        k_hat = F.normalize(key, dim=-1)
        # The code's gather: k̂ expanded along the key axis, so every gathered row is k̂_i itself.
        gathered = k_hat.unsqueeze(2).expand(B, N, N, d).gather(2, idx.unsqueeze(-1).expand(B, N, kk, d))
        u = F.normalize(gathered.sum(2), dim=-1)
        b_align = self.lam_a * (k_hat @ u.transpose(-2, -1))
        zi2 = (z * z).sum(-1, keepdim=True)
        d2 = zi2 + zi2.transpose(-2, -1) - 2 * (z @ z.transpose(-2, -1))
        w_sep = torch.exp(-d2 / (self.tau_sep + 1e-6))
        w_coh = torch.exp(-d2 / (self.tau_coh + 1e-6))
        eta = torch.clamp(w_sep.sum(-1, keepdim=True) / (self.kappa + 1e-6), 0.0, 1.0)
        b_sep = -self.lam_s * eta * (w_sep * F.relu(a - self.delta))
        c = (w_coh @ z) / (w_coh.sum(-1, keepdim=True) + 1e-6)
        r_coh = -((z.unsqueeze(1) - c.unsqueeze(2)) ** 2).sum(-1)             # (B, N, N, d_z) intermediate
        b_coh = self.lam_c * r_coh / (self.tau_coh + 1e-6)
        s = s_base + self.om_a * self.row_norm(b_align) + self.om_s * self.row_norm(b_sep) + \
            self.om_c * self.row_norm(b_coh)
        return torch.softmax(s / (self.temp + 1e-6), dim=-1) @ v


class SeedAttention(torch.nn.Module):
    """H seed heads side by side and an output projection: the layer shape the benchmark compares."""

    def __init__(self, d_model, heads, d_z, k):
        super().__init__()
        self.heads = torch.nn.ModuleList(SeedHead(d_model, d_model // heads, d_z, k) for _ in range(heads))
        self.out = torch.nn.Linear(d_model, d_model)

    def forward(self, x):
        return self.out(torch.cat([h(x) for h in self.heads], dim=-1))


def best_ms(fn, reps):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--d-z", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = SeedAttention(args.d_model, args.heads, args.d_z, args.k)
    for n in args.n:
        x = torch.randn(args.batch, n, args.d_model)
        model(x).sum().backward()  # warm-up: first-call allocations and thread start-up are not timed
        with torch.no_grad():
            fwd = best_ms(lambda: model(x), args.reps)

        def step():
            model.zero_grad(set_to_none=True)
            model(x).sum().backward()

        fwd_bwd = best_ms(step, args.reps)
        print(json.dumps({"n": n, "forward_ms": fwd, "fwd_bwd_ms": fwd_bwd}), flush=True)


if __name__ == "__main__":
    main()
