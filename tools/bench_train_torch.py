#!/usr/bin/env python3
"""The PyTorch twin of tools/bench_train.cpp: the same Transformer classifier (token + learned position
embeddings, pre-norm encoder blocks with GELU, final LayerNorm, mean pool, linear head), one AdamW training
step timed the same way. Prints one JSON line with the median step time and the process's peak resident set
(getrusage, as bench_train measures its own). --compile times the model under torch.compile (the compilation runs
in the warm-up steps, not timed); --autocast runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)
(the linear layers' and attention's products in bfloat16). Run with any PyTorch: bench_train picks $ASC_TORCH_PYTHON, .venv-bench or
Debian's python3-torch."""
import argparse, json, resource, statistics, time
import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--length", type=int, default=128)
p.add_argument("--width", type=int, default=128)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--ffn", type=int, default=512)
p.add_argument("--vocab", type=int, default=64)
p.add_argument("--classes", type=int, default=2)
p.add_argument("--dropout", type=float, default=0.1)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--compile", action="store_true", help="torch.compile the model (default mode)")
p.add_argument("--autocast", action="store_true", help="forward and loss under CPU autocast to bfloat16")
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(a.vocab, a.width)
        self.pos_emb = nn.Embedding(a.length, a.width)
        self.blocks = nn.ModuleList([
            nn.TransformerEncoderLayer(a.width, a.heads, a.ffn, a.dropout, activation="gelu", batch_first=True,
                                       norm_first=True) for _ in range(a.layers)])
        self.norm = nn.LayerNorm(a.width)
        self.head = nn.Linear(a.width, a.classes)

    def forward(self, tokens):
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x).mean(1))


model = Classifier()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
forward = torch.compile(model) if a.compile else model
tokens = torch.randint(0, a.vocab, (a.batch, a.length))
labels = torch.randint(0, a.classes, (a.batch,))


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
        loss = nn.functional.cross_entropy(forward(tokens), labels)
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(a.warmup):
    step()
times = []
for _ in range(a.steps):
    t0 = time.perf_counter()
    step()
    times.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"framework": "pytorch", "version": torch.__version__, "threads": torch.get_num_threads(),
                  "compiled": a.compile, "autocast": a.autocast, "ms_median": statistics.median(times), "ms_min": min(times),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                  "params": sum(p.numel() for p in model.parameters())}))
