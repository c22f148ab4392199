#!/usr/bin/env python3
"""The PyTorch twin of tools/bench_firing.cpp: one firing layer (docs/firing.md) with learning rule B, written
carefully in PyTorch — Z = X Wᵀ, F = 1[Z >= SP], Y = F f Z, autograd's backward of the upstream gradient G
(Y.backward(G); with --loss, of the loss <G, Y>) with the exact gate (F is a constant), an SGD step and the Oja /
homeostasis terms of the pre-step W and f (one simultaneous update) under no_grad — timed per step the same way (best of reps after warm-up). Prints one JSON line per
firing rate. Run with Debian's python3-torch: /usr/bin/python3."""
import argparse, json, time
import torch

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=256)
p.add_argument("--d", type=int, default=784)
p.add_argument("--neurons", type=int, default=1024)
p.add_argument("--fan-out", type=int, default=4)
p.add_argument("--rates", type=float, nargs="+", default=[0.5])
p.add_argument("--reps", type=int, default=10)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--loss", action="store_true", help="backward of the loss <G, Y> instead of Y.backward(G)")
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)

B, d, P, A = a.batch, a.d, a.neurons, a.fan_out
eta_bp, eta_w, eta_f, eta_sp = 1e-3, 1e-3, 1e-3, 1e-2
z_ref2, y_ref2, beta, r_target = 1.0 + 1e-6, 1.0 + 1e-6, 0.1, 0.1

x = torch.randn(B, d)
G = torch.randn(B, P, A)
W = (torch.rand(P, d) * 2 - 1).div_(d ** 0.5).requires_grad_()
f = torch.ones(P, A, requires_grad=True)
r_bar = torch.zeros(P)
m_bar = torch.zeros(P)


def step(SP):
    global r_bar, m_bar
    Z = x @ W.t()                                   # (B, P)
    F = (Z >= SP).to(Z.dtype).detach()              # the exact gate
    Y = F.unsqueeze(-1) * f * Z.unsqueeze(-1)       # (B, P, A)
    if a.loss:
        (Y * G).sum().backward()
    else:
        Y.backward(G)
    with torch.no_grad():
        # One simultaneous update (docs/firing.md §4): the Oja terms from the pre-step W and f, then SGD, then both.
        Zd, Yd = Z.detach(), Y.detach()
        FZ = F * Zd
        dW = eta_w / B * (FZ.t() @ x - (FZ * Zd).sum(0).unsqueeze(1) / z_ref2 * W)  # Oja on W
        FY = Yd * F.unsqueeze(-1)
        df = eta_f / B * ((FY * Zd.unsqueeze(-1)).sum(0) - (FY * Yd).sum(0) / y_ref2 * f)  # Oja on f
        W.sub_(eta_bp * W.grad).add_(dW)            # SGD + Oja
        f.sub_(eta_bp * f.grad).add_(df)
        W.grad = None
        f.grad = None
        r_bar = (1 - beta) * r_bar + beta * F.mean(0)                                # homeostasis
        m_bar = (1 - beta) * m_bar + beta * (F * torch.relu(Zd - SP)).mean(0)
        SP.add_(eta_sp * (r_bar - r_target))
        W.clamp_(-1, 1)
        f.clamp_(-1, 1)


for rate in a.rates:
    with torch.no_grad():
        SP = torch.quantile(x @ W.t(), 1 - rate, dim=0)  # thresholds giving this firing rate per neuron
    SP0 = SP.clone()
    for _ in range(2):
        step(SP0.clone())
    best = 1e30
    for _ in range(a.reps):
        SP = SP0.clone()
        t0 = time.perf_counter()
        step(SP)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"rate": rate, "step_ms": best * 1e3}), flush=True)
