#!/usr/bin/env python3
"""Writes tests/data/plot_fixture/: a tiny fake pair of training runs (two seeds of one config) in the layout that
tools/train --out DIR writes, for tests/plot_test.py. Deterministic (numpy seed 0); rerun it after a format change:

    python3 tests/data/make_plot_fixture.py [OUT_DIR]     # default: tests/data/plot_fixture

Contents (a few KB): seed0/ and seed1/ each with config.json, metrics.jsonl, metrics.csv, summary.json,
predictions.csv; seed0/dumps/ with decomposition_3.safetensors (L = 2 layers, H = 2 heads, T = 8, the last two keys
padding: -inf in S_base and S), asam_gate.safetensors (16 samples x 2 heads per layer) and firing_rates.safetensors
(24 neurons per layer); bench_asam.csv (bench_asam --csv columns, two implementations, one skipped measurement).
The numbers are made up but shaped like real ones (falling loss, rising accuracy, A = softmax(S) row-wise).
"""
import csv
import json
import os
import struct
import sys

import numpy as np

LAYERS, HEADS, T = 2, 2, 8
STEPS = [0, 10, 20, 30, 40, 50]
VAL_STEPS = [0, 25, 50]


def write_safetensors(path, tensors, metadata=None):
    """{name: array} (float32 / float64 / int64) in the documented layout; header padded to a multiple of 8."""
    tags = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int64): "I64"}
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": tags[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def r4(x):
    return round(float(x), 4)


def metrics_rows(seed, rng):
    """Train rows at STEPS (with the mechanism measurements), val rows at VAL_STEPS, one test row at the end."""
    rows = []
    for step in sorted(set(STEPS) | set(VAL_STEPS)):
        for split in ("train", "val"):
            if (split == "train" and step not in STEPS) or (split == "val" and step not in VAL_STEPS):
                continue
            progress = step / STEPS[-1]
            row = {"step": step, "epoch": r4(step / 20), "split": split,
                   "loss": r4(1.2 * np.exp(-2 * progress) + 0.1 + 0.05 * rng.random() + 0.03 * (split == "val")),
                   "accuracy": r4(0.5 + 0.4 * progress + 0.03 * rng.random()), "lr": 1e-3,
                   "tokens_per_s": r4(5000 + 100 * rng.random()), "time_s": r4(0.2 * step + 1), "mech": {}}
            if step == 0 and split == "train":
                row["accuracy"] = None  # not measured: null in JSON, an empty cell in the CSV
            if split == "train":
                for l in range(LAYERS):
                    for key, start in (("omega_align", 1.0), ("omega_sep", 0.5), ("omega_coh", 0.25)):
                        row["mech"][f"L{l}.{key}"] = [r4(start + progress * (0.3 * h - 0.2 * l) + 0.02 * rng.random())
                                                      for h in range(HEADS)]
                    row["mech"][f"L{l}.asam_gate"] = r4(0.5 + 0.3 * progress * (1 - 2 * l) + 0.01 * rng.random())
                    row["mech"][f"L{l}.firing_rate"] = r4(0.3 - 0.1 * progress + 0.01 * rng.random())
                    row["mech"][f"L{l}.firing_threshold"] = r4(1.0 + 0.5 * progress * (l + 1))
            rows.append(row)
    rows.append({"step": STEPS[-1], "epoch": r4(STEPS[-1] / 20), "split": "test", "loss": 0.31 + 0.01 * seed,
                 "accuracy": 0.88 - 0.01 * seed, "lr": 1e-3, "tokens_per_s": 5050.0, "time_s": 12.0, "mech": {}})
    return rows


def write_metrics_csv(path, rows):
    """The flattened form: base columns, then one column per mechanism scalar (lists split per head, ".h<i>")."""
    base = ["step", "epoch", "split", "loss", "accuracy", "lr", "tokens_per_s", "time_s"]
    mech_cols = []
    for r in rows:
        for name, v in r["mech"].items():
            for col in ([f"{name}.h{i}" for i in range(len(v))] if isinstance(v, list) else [name]):
                if col not in mech_cols:
                    mech_cols.append(col)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(base + mech_cols)
        for r in rows:
            flat = {}
            for name, v in r["mech"].items():
                flat.update({f"{name}.h{i}": x for i, x in enumerate(v)} if isinstance(v, list) else {name: v})
            w.writerow(["" if r.get(c) is None else r[c] for c in base] + [flat.get(c, "") for c in mech_cols])


def decomposition(rng):
    """Per layer: base scores, three normalised bias terms, S = S_base + Σ ω β̃, A = softmax(S) over the 6 real
    keys."""
    out = {}
    valid = np.arange(T) < T - 2
    for l in range(LAYERS):
        s_base = rng.standard_normal((HEADS, T, T))
        terms = {k: np.tanh(rng.standard_normal((HEADS, T, T))) for k in ("align", "sep", "coh")}
        s = s_base + 1.0 * terms["align"] - 0.5 * terms["sep"] + 0.25 * terms["coh"]
        s_base[:, :, ~valid] = -np.inf
        s[:, :, ~valid] = -np.inf
        a = np.exp(s - s.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        out.update({f"L{l}.S_base": s_base, f"L{l}.align": terms["align"], f"L{l}.sep": terms["sep"],
                    f"L{l}.coh": terms["coh"], f"L{l}.S": s, f"L{l}.A": a})
    out = {k: v.astype(np.float32) for k, v in out.items()}
    out["tokens"] = rng.integers(0, 10, T).astype(np.int64)
    return out


def main(root):
    rng = np.random.default_rng(0)
    for seed in (0, 1):
        run = os.path.join(root, f"seed{seed}")
        os.makedirs(run, exist_ok=True)
        config = {"task": "listops", "model": "ascender", "layers": LAYERS, "heads": HEADS, "d_model": 16,
                  "lr": 1e-3, "steps": STEPS[-1], "seed": seed, "git_commit": f"abc{seed}", "out": f"runs/seed{seed}"}
        with open(os.path.join(run, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        rows = metrics_rows(seed, rng)
        with open(os.path.join(run, "metrics.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        write_metrics_csv(os.path.join(run, "metrics.csv"), rows)
        with open(os.path.join(run, "summary.json"), "w") as f:
            json.dump({"best_step": 50, "val_accuracy": 0.87, "test_accuracy": 0.88 - 0.01 * seed, "test_loss": 0.31,
                       "wall_s": 12.0, "peak_mem_mb": 40.0, "tokens_per_s": 5050.0, "params": 5000,
                       "flops_per_token": 20000, "attention_flops_per_token": 4000}, f, indent=1)
        with open(os.path.join(run, "predictions.csv"), "w") as f:
            f.write("index,label,prediction,correct,loss\n")
            for i in range(4):
                y, p = i % 2, (i + seed) % 2
                f.write(f"{i},{y},{p},{int(y == p)},{r4(0.2 + 0.5 * (y != p))}\n")
    dumps = os.path.join(root, "seed0", "dumps")
    os.makedirs(dumps, exist_ok=True)
    write_safetensors(os.path.join(dumps, "decomposition_3.safetensors"), decomposition(rng),
                      {"example": "3", "label": "1"})
    write_safetensors(os.path.join(dumps, "asam_gate.safetensors"),
                      {f"L{l}.gate": rng.beta(2 + 3 * l, 3, (16, HEADS)).astype(np.float32) for l in range(LAYERS)})
    write_safetensors(os.path.join(dumps, "firing_rates.safetensors"),
                      {f"L{l}.rate": rng.beta(1 + l, 4, 24).astype(np.float32) for l in range(LAYERS)})
    with open(os.path.join(root, "bench_asam.csv"), "w") as f:
        f.write("impl,n,forward_ms,fwd_bwd_ms,peak_mb,pairs_per_head,speedup_vs_chunked,note\n")
        for n in (512, 1024, 2048, 4096):
            f.write(f"chunked,{n},{r4(n * n / 4e5)},{r4(n * n / 1.5e5)},{r4(n * n / 6e4)},{n * n},1.000,\"\"\n")
            naive = f"{r4(n * n / 3e5)},{r4(n * n / 1e5)},{r4(n * n / 2e4)}" if n < 4096 else "-1.000,-1.000,-1.0"
            f.write(f"naive,{n},{naive},{n * n},-1.000,\"{'skipped: over --naive-gb' if n == 4096 else ''}\"\n")
            f.write(f"window,{n},{r4(n / 400)},{r4(n / 150)},{r4(n / 60)},{n * 256},{r4(n / 256)},\"w 256\"\n")
    print(f"wrote {root}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                 "plot_fixture"))
