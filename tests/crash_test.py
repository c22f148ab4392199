#!/usr/bin/env python3
"""The train tool killed at every write, and at random moments, then resumed: every file of the run directory must
equal an uninterrupted run's, but for the fields that record time or the process's resources (docs/train.md, "What
survives a crash").

    crash_test.py TRAIN_BINARY [--random N] [--keep]

1. A reference run, uninterrupted.
2. For N = 1, 2, ...: the run started with ASC_FAULT_DIE_AT=N ASC_FAULT_TORN=1 (core/fault.h: SIGKILL at the N-th
   write point of the process — a file complete before its rename, the rename, a record appended, which is first
   written half), then `--resume` without the hook until it finishes; its files compared with the reference. The
   loop ends at the first N the run finishes before reaching: every write point of the run has been a place to die.
   For every third N, the resumed process is killed too, at its own first write points (a crash during a resume).
3. --random N: N runs killed with SIGKILL after a random delay, resumed and killed again until one finishes.

A resume may instead refuse with one clear line only where no run was started (no config.json); then the run is
started again as at first, and must end the same. Exit 0 when every case matches; 1 with the differences otherwise.
"""
import argparse
import csv
import io
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

# The run: tiny, every kind of file (metrics, checkpoints, best model, predictions, summary, dumps, an analysis).
RUN_FLAGS = ["--task", "grouping", "--train-size", "64", "--val-size", "16", "--test-size", "16", "--model", "ascender",
             "--d-model", "16", "--heads", "2", "--layers", "1", "--ffn", "32", "--k", "4", "--batch", "16",
             "--steps", "12", "--eval-every", "4", "--log-every", "2", "--ckpt-every", "4", "--progress", "none",
             "--threads", "1", "--dump-decomposition", "0", "--cluster-metrics", "4"]

# Fields that record time or this process's resources, and so differ between any two runs (docs/train.md).
TIME_COLUMNS = {"tokens_per_s", "time_s"}  # metrics.csv and metrics.jsonl
TIME_SUMMARY = {"wall_s", "tokens_per_s", "peak_mem_mb", "test_ms_per_example", "fp32_peak_flops"}  # summary.json
# checkpoint metadata: the wall time; the metrics files' sizes (the time fields' digits vary); the metadata checksum
TIME_METADATA = {"wall_s", "metrics.csv_bytes", "metrics.jsonl_bytes", "crc32"}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}
    return tensors, meta


def comparable(path):
    """The file's content with its time fields removed."""
    name = os.path.basename(path)
    if name.endswith(".safetensors"):
        tensors, meta = read_safetensors(path)
        return tensors, {k: v for k, v in meta.items() if k not in TIME_METADATA}
    with open(path, "rb") as f:
        raw = f.read()
    if name == "metrics.csv":
        rows = list(csv.DictReader(io.StringIO(raw.decode())))
        return raw.split(b"\n", 1)[0], [{k: v for k, v in r.items() if k not in TIME_COLUMNS} for r in rows], \
            raw.endswith(b"\n")
    if name == "metrics.jsonl":
        lines = raw.decode().split("\n")
        assert lines[-1] == "", f"{path}: the last line has no newline"
        return [{k: v for k, v in json.loads(line).items() if k not in TIME_COLUMNS} for line in lines[:-1]]
    if name == "summary.json":
        return {k: v for k, v in json.loads(raw).items() if k not in TIME_SUMMARY}
    return raw


def files_of(d):
    out = []
    for root, _, names in os.walk(d):
        out += [os.path.relpath(os.path.join(root, n), d) for n in names]
    return sorted(out)


def differences(ref, got):
    a, b = files_of(ref), files_of(got)
    if a != b:
        return [f"files differ: only in the reference {sorted(set(a) - set(b))}, only here {sorted(set(b) - set(a))}"]
    out = []
    for rel in a:
        try:
            same = comparable(os.path.join(ref, rel)) == comparable(os.path.join(got, rel))
        except Exception as e:  # a file that cannot even be read
            same, rel = False, f"{rel} ({e})"
        if not same:
            out.append(f"{rel} differs")
    return out


class Runner:
    def __init__(self, train, root):
        self.train, self.root = train, root

    def run(self, out, resume=False, die_at=None, kill_after=None):
        """The tool's exit status (-9: killed), and its stderr."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASC_FAULT_")}
        env["OMP_NUM_THREADS"] = "1"
        if die_at is not None:
            env["ASC_FAULT_DIE_AT"], env["ASC_FAULT_TORN"] = str(die_at), "1"
        cmd = [self.train] + RUN_FLAGS + ["--out", out] + (["--resume"] if resume else [])
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _, err = p.communicate(timeout=kill_after)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
            _, err = p.communicate()
        return p.returncode, err

    def finish(self, out, first_rc, first_err, kill_resumes=()):
        """Resumes a killed run until it finishes (each of `kill_resumes` kills one resume at that write point);
        returns a complaint or None."""
        rc, err = first_rc, first_err
        for attempt in range(20):
            if rc == 0:
                return None
            if rc != -signal.SIGKILL:
                return f"exit {rc} (not a kill): {err.strip()}"
            die = kill_resumes[attempt] if attempt < len(kill_resumes) else None
            rc, err = self.run(out, resume=True, die_at=die)
            if rc == 1 and "no config.json, so no run was started" in err:
                rc, err = self.run(out, die_at=die)  # nothing to resume: the run started again, as at first
        return "did not finish in 20 resumes"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("train")
    ap.add_argument("--random", type=int, default=3, help="runs killed at random moments (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random moments")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="asc_crash_")
    r = Runner(args.train, root)
    failures = []
    t0 = time.time()
    # Every run writes to the same --out (config.json records it), then moves aside.
    out, ref = os.path.join(root, "run"), os.path.join(root, "ref")
    rc, err = r.run(out)
    if rc != 0:
        print(f"crash_test: the reference run failed ({rc}): {err}")
        return 1
    t_ref = time.time() - t0
    os.rename(out, ref)

    def settle(name, problem):
        if problem:
            failures.append(f"{name}: {problem}")
            os.rename(out, os.path.join(root, name.replace(" ", "_")))
        else:
            shutil.rmtree(out)

    # 2. every write point
    n = 0
    while True:
        n += 1
        rc, err = r.run(out, die_at=n)
        if rc == 0:
            shutil.rmtree(out)
            break  # the run has fewer than n write points: all covered
        kills = (1, 2) if n % 3 == 0 else ()
        problem = r.finish(out, rc, err, kills) or "; ".join(differences(ref, out))
        settle(f"killed at write {n}" + (f" and its resumes at {kills}" if kills else ""), problem)
    points = n - 1
    print(f"crash_test: killed at each of the run's {points} write points (torn records), then resumed: "
          f"{points - len([f for f in failures if f.startswith('killed')])} of {points} match the uninterrupted run")

    # 3. random moments
    rng = random.Random(args.seed)
    for i in range(args.random):
        rc, err = r.run(out, kill_after=rng.uniform(0.02, 1.2) * t_ref)
        kills = 0
        while rc == -signal.SIGKILL and kills < 20:
            kills += 1
            rc, err = r.run(out, resume=True, kill_after=rng.uniform(0.1, 1.2) * t_ref)
        problem = r.finish(out, rc, err) or "; ".join(differences(ref, out))
        settle(f"random run {i} ({kills} kills)", problem)
    print(f"crash_test: {args.random} runs killed at random moments and resumed; {time.time() - t0:.1f} s")

    for f in failures:
        print("FAIL:", f)
    if args.keep or failures:
        print(f"crash_test: runs kept in {root}")
    else:
        shutil.rmtree(root)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
