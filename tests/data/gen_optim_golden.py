#!/usr/bin/env python3
"""Golden values for tests/test_optim.cpp: torch.optim run over a fixed gradient sequence in float64.

Prints a C++ table (config name -> the parameter after each of 5 steps, row-major (2, 3)) to paste into the test.
Run: python3 tests/data/gen_optim_golden.py   (torch 1.13 was used for the committed values)
"""
import torch

P0 = [0.5, -1.25, 2.0, 0.75, -0.3, 1.1]
# Five steps of (2, 3) gradients; some entries shrink late so AMSGrad's running max matters, one is 0.
G = [
    [0.3, -0.8, 1.5, 2.0, 0.05, -1.2],
    [0.1, -0.6, 1.1, 1.5, -0.4, -0.9],
    [-0.2, 0.4, 0.2, 0.1, 0.0, -0.3],
    [0.25, 0.9, -0.05, 0.02, 0.6, 0.1],
    [-0.35, 0.15, 0.4, -0.01, -0.2, 0.05],
]

CONFIGS = [
    ("sgd_plain", torch.optim.SGD, dict(lr=0.1)),
    ("sgd_momentum", torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    ("sgd_nesterov", torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("sgd_dampening_wd", torch.optim.SGD, dict(lr=0.1, momentum=0.8, dampening=0.3, weight_decay=0.05)),
    ("sgd_nesterov_wd", torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("adam", torch.optim.Adam, dict(lr=0.01)),
    ("adam_amsgrad_wd", torch.optim.Adam, dict(lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, amsgrad=True)),
    ("adamw", torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    ("adamw_amsgrad", torch.optim.AdamW, dict(lr=0.02, betas=(0.85, 0.9), weight_decay=0.05, amsgrad=True)),
    ("rmsprop", torch.optim.RMSprop, dict(lr=0.01)),
    ("rmsprop_momentum", torch.optim.RMSprop, dict(lr=0.01, alpha=0.9, momentum=0.8)),
    ("rmsprop_centered", torch.optim.RMSprop, dict(lr=0.01, centered=True, eps=1e-4)),
    ("rmsprop_all", torch.optim.RMSprop, dict(lr=0.005, alpha=0.95, momentum=0.7, centered=True, weight_decay=0.1)),
]

print(f"// torch {torch.__version__}")
for name, cls, kw in CONFIGS:
    p = torch.tensor(P0, dtype=torch.float64).reshape(2, 3).requires_grad_(True)
    opt = cls([p], **kw)
    rows = []
    for g in G:
        p.grad = torch.tensor(g, dtype=torch.float64).reshape(2, 3)
        opt.step()
        rows.append(", ".join(repr(v) for v in p.detach().flatten().tolist()))
    print(f'    {{"{name}", {{')
    for r in rows:
        print(f"        {{{r}}},")
    print("    }},")
