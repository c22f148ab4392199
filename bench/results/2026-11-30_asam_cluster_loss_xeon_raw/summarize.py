# Per side: train_step ms per step (the profile's range, 5 steps) and the rows the change touches, over the rounds.
#   python3 summarize.py OUT_DIR
import glob
import re
import sys

out = sys.argv[1]
rows_of_interest = ["train_step", "pow (unary)", "pow (unary_backward)", "sub (binary)", "neg (unary)", "matmul",
                    "softmax (softmax_forward)", "test accuracy"]
for side in ("old", "new"):
    for path in sorted(glob.glob(f"{out}/train_{side}_*/profile.txt")):
        cells = {}
        for line in open(path):
            for name in rows_of_interest:
                if line.startswith(name + " ") and name not in cells:
                    parts = line[41:].split()  # kind, calls, self ms, self %, total ms, ...
                    total = float(parts[4]) if name == "train_step" else float(parts[2])
                    cells[name] = total / 5
        log = open(path.replace("profile.txt", "../" + path.split("/")[-2] + ".log")).read()
        acc = re.search(r"test accuracy ([0-9.]+)%", log)
        print(side, path.split("/")[-2], " ".join(f"{k}={v:.1f}" for k, v in cells.items()),
              f"test_acc={acc.group(1) if acc else '?'}")
