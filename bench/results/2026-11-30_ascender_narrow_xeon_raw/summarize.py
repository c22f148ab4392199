"""Tables of run.sh's output: experiment 1's ASCender step by the profiler (ms per step, mean of the 5 profiled
steps), and bench_ascender's fused / dense forward + backward ratio, before (old) and after (new), per round.
    python3 summarize.py OUT_DIR"""
import csv
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = ["train_step", "ascender_attention (ascender_forward)", "ascender_attention (ascender_backward)"]


def profile(path):
    got = {}
    for line in path.read_text().splitlines():
        for r in rows:
            if line.startswith(r + " ") or line.startswith(r + "\t"):
                cols = line[42:].split()  # the name fills 42 columns; then kind, calls, self ms, self %, total ms
                got[r] = float(cols[4]) / 5 if r == "train_step" else float(cols[2]) / 5
    return got


print("Experiment 1 ListOps ASCender arm, ms per training step (profiler: self time, train_step: total), per round")
print("| row | " + " | ".join(f"old {k} | new {k}" for k in (1, 2, 3)) + " |")
print("|---|" + "---|" * 6)
profs = {(s, k): profile(out / f"train_{s}_{k}_profile.txt") for s in ("old", "new") for k in (1, 2, 3)}
for r in rows:
    cells = [f"{profs[(s, k)].get(r, 0):.1f}" for k in (1, 2, 3) for s in ("old", "new")]
    print(f"| {r} | " + " | ".join(cells) + " |")
print()
print("bench_ascender (B 4, d_model 128, 2 heads of 64, d_z = d_a = 16): fused / dense, forward + backward, per round")
print("| n | " + " | ".join(f"old {k} | new {k}" for k in (1, 2, 3)) + " |")
print("|---|" + "---|" * 6)
tabs = {}
for s in ("old", "new"):
    for k in (1, 2, 3):
        with open(out / f"bench_{s}_{k}.csv") as f:
            tabs[(s, k)] = {(r["impl"], int(r["n"])): r for r in csv.DictReader(f)}
for n in (512, 1024):
    cells = []
    for k in (1, 2, 3):
        for s in ("old", "new"):
            t = tabs[(s, k)]
            cells.append(f"{float(t[('fused', n)]['fwd_bwd_ms']) / float(t[('dense', n)]['fwd_bwd_ms']):.2f}")
    print(f"| {n} | " + " | ".join(cells) + " |")
