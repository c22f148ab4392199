"""Tables of run.sh's output: experiment 5's ASAM step by the profiler (ms per step, mean of the 5 profiled steps) and
bench_asam's rate per attended pair as a share of chunked dense's, before (old) and after (new), per round.
    python3 summarize.py OUT_DIR"""
import csv
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = ["train_step", "asam clustered pattern", "sparse_attention plans", "sparse_attention (sparse_attention_fo",
        "sparse_attention (sparse_attention_ba", "scaled_dot_product_attention (sdpa_fo",
        "scaled_dot_product_attention (sdpa_ba"]


def profile(path):
    got = {}
    for line in path.read_text().splitlines():
        for r in rows:
            if line.startswith(r):
                # the name fills the first 42 columns; then kind, calls, self ms, self %, total ms, ...
                cols = line[42:].split()
                self_ms, total_ms = float(cols[2]), float(cols[4])
                got[r] = total_ms / 5 if r == "train_step" else self_ms / 5
    return got


print("Experiment 5 ListOps ASAM arm, ms per training step (profiler: self time, train_step: total), per round")
print("| row | " + " | ".join(f"old {k} | new {k}" for k in (1, 2, 3)) + " |")
print("|---|" + "---|" * 6)
def profile_path(s, k):  # run.sh's train output folder, or the copy committed beside this script
    p = out / f"train_{s}_{k}" / "profile.txt"
    return p if p.exists() else out / f"train_{s}_{k}_profile.txt"


profs = {(s, k): profile(profile_path(s, k)) for s in ("old", "new") for k in (1, 2, 3)}
for r in rows:
    cells = []
    for k in (1, 2, 3):
        for s in ("old", "new"):
            cells.append(f"{profs[(s, k)].get(r, 0):.1f}")
    print(f"| {r.replace('(', '').strip()} | " + " | ".join(cells) + " |")

print()
print("bench_asam: rate per attended pair as a share of chunked dense's at the same n, forward / f+b, per round")
print("| impl | n | " + " | ".join(f"old {k} | new {k}" for k in (1, 2, 3)) + " |")
print("|---|---|" + "---|" * 6)
tabs = {}
for s in ("old", "new"):
    for k in (1, 2, 3):
        with open(out / f"asam_{s}_{k}.csv") as f:
            tabs[(s, k)] = {(r["impl"], int(r["n"])): r for r in csv.DictReader(f)}
for impl in ("window", "w+g+r", "clustered", "hierarchical"):
    for n in (1024, 4096):
        cells = []
        for k in (1, 2, 3):
            for s in ("old", "new"):
                t = tabs[(s, k)]
                c, x = t[("chunked", n)], t[(impl, n)]
                share = lambda col: (float(c[col]) / float(c["pairs_per_head"])) / (float(x[col]) / float(x["pairs_per_head"]))
                cells.append(f"{100 * share('forward_ms'):.0f} / {100 * share('fwd_bwd_ms'):.0f} %")
        print(f"| {impl} | {n} | " + " | ".join(cells) + " |")
