#!/usr/bin/env python3
"""`mpirun -np 2 train ...` is the run `train ...` makes in one process, on the same global batch (CTest train_mpirun).

  python3 tests/train_mpirun_test.py build/release/tools/train [mpirun]

Each case trains a small model in one process and on 2 ranks with the same flags (dropout 0: dropout's masks are each
rank's own draws) and compares what the two wrote:
  equivalence   a classifier and a byte-level LM (texts of unequal lengths: the ranks' shares hold unequal numbers of
                predicted bytes), in float32 and float64: every metrics.csv row (step, epoch, loss, accuracy, lr) and
                every tensor of best.safetensors and ckpt/last.safetensors within the tolerance below
  resume        a 2-rank job stopped (--stop-after) and continued by one process, and by 2 ranks again, ends as the
                uninterrupted run did
  lost rank     rank 1 killed (SIGKILL, core/fault.h) mid-run: the job ends with a non-zero exit naming the rank; its
                last checkpoint is whole, and one process resumes it to the uninterrupted run's end
  refusals      a batch that is not a multiple of the processes, a firing rule, --eval-only: one clear line, no run
Tolerances: the ranks' products have fewer rows than one process's (batch / 2), and a GEMM's blocking, with it the
order of its additions, depends on the shape; the gradients' average adds the two halves in another order. float64
agrees to 1e-9 relative, float32 to 2e-4 (after a dozen Adam steps, whose first steps amplify the last bits).
"""
import csv
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

SMALL = ("--train-size 192 --val-size 48 --test-size 48 --d-model 16 --heads 2 --layers 1 --ffn 32 --batch 16 "
         "--steps 12 --eval-every 4 --log-every 2 --dropout 0 --threads 1 --progress none").split()
TOL = {"float32": 2e-4, "float64": 1e-9}


def read_safetensors(path):
    """({name: list of numbers}, metadata) of a safetensors file (its F32 / F64 / I64 tensors)."""
    blob = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    fmt = {"F32": "f", "F64": "d", "I64": "q"}
    out = {}
    for name, v in header.items():
        if v["dtype"] not in fmt:
            continue
        a, b = v["data_offsets"]
        count = (b - a) // struct.calcsize(fmt[v["dtype"]])
        out[name] = list(struct.unpack(f"<{count}{fmt[v['dtype']]}", data[a:b]))
    return out, meta


def rows(run_dir):
    """metrics.csv's rows as (step, split, epoch, loss, accuracy, lr)."""
    with open(Path(run_dir) / "metrics.csv") as f:
        return [(int(r["step"]), r["split"], float(r["epoch"]), float(r["loss"]), float(r["accuracy"]), float(r["lr"]))
                for r in csv.DictReader(f)]


def close(a, b, tol):
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def differences(a_dir, b_dir, tol, files=("best.safetensors", "ckpt/last.safetensors")):
    """What differs between two runs' metrics and weights, as a list of lines (empty: the same within tol)."""
    out = []
    ra, rb = rows(a_dir), rows(b_dir)
    if [r[:2] for r in ra] != [r[:2] for r in rb]:
        return [f"metrics.csv: rows {[r[:2] for r in ra]} vs {[r[:2] for r in rb]}"]
    for x, y in zip(ra, rb):
        for name, u, v in zip(("epoch", "loss", "accuracy", "lr"), x[2:], y[2:]):
            if not close(u, v, tol):
                out.append(f"metrics.csv step {x[0]} {x[1]} {name}: {u} vs {v}")
    for f in files:
        (ta, _), (tb, _) = read_safetensors(Path(a_dir) / f), read_safetensors(Path(b_dir) / f)
        if set(ta) != set(tb):
            out.append(f"{f}: tensors {sorted(set(ta) ^ set(tb))} in one only")
            continue
        for name in ta:
            worst = max((abs(u - v) / max(1.0, abs(u), abs(v)) for u, v in zip(ta[name], tb[name])), default=0.0)
            if worst > tol:
                out.append(f"{f} {name}: relative difference {worst:.3g} > {tol}")
    return out


class Runner:
    def __init__(self, train, mpirun, root):
        self.train, self.mpirun, self.root = train, mpirun, Path(root)
        self.env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")

    def run(self, args, ranks=1, env=None):
        cmd = ([self.mpirun, "-np", str(ranks), "--oversubscribe"] if ranks > 1 else []) + [self.train] + args
        r = subprocess.run(cmd, env=dict(self.env, **(env or {})), capture_output=True, text=True, timeout=600,
                           errors="replace")
        return r.returncode, r.stdout + r.stderr


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    train = str(Path(sys.argv[1]).resolve())
    mpirun = sys.argv[2] if len(sys.argv) > 2 else shutil.which("mpirun")
    if not mpirun:
        print("train_mpirun: no mpirun (apt-get install openmpi-bin): skipped")
        return 77
    failures = []

    def check(name, problems):
        print(("ok   " if not problems else "FAIL ") + name)
        for p in problems[:10]:
            print("       " + p)
        if problems:
            failures.append(name)

    with tempfile.TemporaryDirectory(prefix="asc_mpirun_") as tmp:
        r = Runner(train, mpirun, tmp)
        texts = Path(tmp) / "lines.tsv"  # texts of 20 to 60 bytes: unequal predicted bytes per rank
        texts.write_text("".join(f"{i % 3}\t{'the cat sat on the mat ' * (1 + i % 3)}{i}\n" for i in range(300)))
        cases = {
            "dense classifier": ["--task", "grouping", "--model", "dense"],
            "byte-level LM": ["--task", f"file:{texts}", "--model", "lm", "--max-len", "32"],
        }
        for case, args in cases.items():
            for dtype in ("float32", "float64"):
                one, two = Path(tmp) / f"{case}-{dtype}-1".replace(" ", "_"), Path(tmp) / f"{case}-{dtype}-2".replace(" ", "_")
                base = args + SMALL + ["--dtype", dtype]
                rc1, log1 = r.run(base + ["--out", str(one)])
                rc2, log2 = r.run(base + ["--out", str(two)], ranks=2)
                if rc1 != 0 or rc2 != 0:
                    check(f"{case} {dtype}: 1 process == 2 ranks", [f"exit {rc1} / {rc2}", log1[-800:], log2[-800:]])
                    continue
                problems = differences(one, two, TOL[dtype])
                if "2 processes, each reading 8 of every step's 16 examples" not in log2:
                    problems.append(f"no line about the 2 processes in the job's output: {log2[-400:]}")
                check(f"{case} {dtype}: 1 process == 2 ranks (tolerance {TOL[dtype]})", problems)

        # resume: a 2-rank job stopped after 5 steps, continued by 1 process and by 2 ranks
        base = cases["dense classifier"] + SMALL + ["--dtype", "float64", "--ckpt-every", "4"]
        ref = Path(tmp) / "dense_classifier-float64-1"
        for cont in (1, 2):
            d = Path(tmp) / f"resume-{cont}"
            rc, log = r.run(base + ["--out", str(d), "--stop-after", "5"], ranks=2)
            problems = [] if rc == 130 else [f"the stopped job's exit: {rc} (expected 130)", log[-600:]]
            rc, log = r.run(base + ["--out", str(d), "--resume"], ranks=cont)
            problems += [] if rc == 0 else [f"the resumed run's exit: {rc}", log[-600:]]
            if not problems:
                problems = differences(ref, d, TOL["float64"], files=("best.safetensors",))
            check(f"resume: 2 ranks stopped at step 5, continued by {cont} process(es) == uninterrupted", problems)

        # a lost rank: rank 1 killed at the end of step 6 (checkpoints every 4 steps)
        d = Path(tmp) / "lost"
        rc, log = r.run(base + ["--out", str(d)], ranks=2,
                        env={"ASC_FAULT_KILL_RANK": "1", "ASC_FAULT_KILL_STEP": "6"})
        problems = []
        if rc == 0:
            problems.append("the job with a killed rank exited 0")
        if "rank 1" not in log:
            problems.append(f"the job's output does not name rank 1: {log[-600:]}")
        if not (d / "ckpt" / "last.safetensors").exists():
            problems.append("no checkpoint left")
        else:
            _, meta = read_safetensors(d / "ckpt" / "last.safetensors")
            if meta.get("step") != "4":
                problems.append(f"the checkpoint holds step {meta.get('step')}, expected 4")
            rc, log = r.run(base + ["--out", str(d), "--resume"])
            if rc != 0:
                problems += [f"resuming the lost job in one process: exit {rc}", log[-600:]]
            else:
                problems += differences(ref, d, TOL["float64"], files=("best.safetensors",))
        check("lost rank: the job ends naming rank 1; its checkpoint resumes to the uninterrupted run", problems)

        # refusals, before anything is written
        for args, expect in (
            (cases["dense classifier"] + SMALL + ["--batch", "15"], "--batch 15 is not a multiple of the 2 processes"),
            (["--task", "fashion-mnist", "--model", "firing", "--rule", "B"] + SMALL, "--rule B: a firing rule"),
        ):
            d = Path(tmp) / "refused"
            rc, log = r.run(args + ["--out", str(d)], ranks=2)
            problems = [] if rc != 0 and expect in log else [f"exit {rc}, output: {log[-600:]}"]
            if expect.startswith("--rule") and "dataset-fashion-mnist" in log:
                problems = []  # no Fashion-MNIST on this machine: the task is refused first
            if (d / "metrics.csv").exists():
                problems.append("a refused job wrote metrics.csv")
            check(f"refused on 2 ranks: {expect}", problems)
            shutil.rmtree(d, ignore_errors=True)

    print(f"train_mpirun: {len(failures)} failed" if failures else "train_mpirun: all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
