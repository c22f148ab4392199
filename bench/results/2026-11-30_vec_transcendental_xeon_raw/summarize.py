# Medians over the rounds of rows.csv (label, op, forward ms, forward + backward ms) as a markdown table.
#   python3 summarize.py OUT/rows.csv
import collections
import statistics
import sys

rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, op, fwd, fb = line.strip().split(",")
    side = "old" if label.endswith("old") else "new" if label.endswith("new") else "torch"
    rows[(op, side)].append((float(fwd), float(fb)))
ops = list(dict.fromkeys(op for op, _ in rows))


def med(op, side, i):
    return statistics.median(v[i] for v in rows[(op, side)])


def rng(op, side, i):
    vals = [v[i] for v in rows[(op, side)]]
    return f"{min(vals):.2f}-{max(vals):.2f}"


print("| op | fwd old ms | fwd new ms | fwd PyTorch ms | new / PyTorch | f+b old ms | f+b new ms | f+b PyTorch ms |"
      " new / PyTorch |")
print("|---|---|---|---|---|---|---|---|---|")
for op in ops:
    print(f"| {op} | {rng(op, 'old', 0)} | {rng(op, 'new', 0)} | {rng(op, 'torch', 0)} | "
          f"{med(op, 'new', 0) / med(op, 'torch', 0):.2f} | {rng(op, 'old', 1)} | {rng(op, 'new', 1)} | "
          f"{rng(op, 'torch', 1)} | {med(op, 'new', 1) / med(op, 'torch', 1):.2f} |")
