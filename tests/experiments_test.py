#!/usr/bin/env python3
"""The experiments and their run queue (experiments/): every experiment script runs end to end at the tiny scale
(a few steps per run) and writes its report; the queue stops a run at its deadline with a checkpoint and resumes it,
records failures and goes on, waits for the runs another depends on, and refuses to mix code versions; the results
packed into their tables give the reports that the run folders give.

    ASC_BUILD_DIR=build/release /usr/bin/python3 tests/experiments_test.py      (ctest: experiments_smoke)
    /usr/bin/python3 tests/experiments_test.py atomic_writes                     (one check that needs no build)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "experiments"))
import lib  # noqa: E402

failures = []


def check(ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def queue(*args):
    return subprocess.run([sys.executable, str(REPO / "experiments" / "queue.py"), *args], capture_output=True,
                          text=True)


def tiny_end_to_end(tmp: Path):
    root, rep = tmp / "runs", tmp / "reports"
    r = queue("run", "--scale", "tiny", "--root", str(root))
    check(r.returncode == 0, f"queue run --scale tiny: exit {r.returncode} {r.stderr.strip()[-300:]}")
    check("FAILED" not in r.stdout, f"no run failed: {[l for l in r.stdout.splitlines() if 'FAILED' in l][:3]}")
    s = queue("status", "--scale", "tiny", "--root", str(root))
    lines = [l for l in s.stdout.splitlines() if " runs:" in l]
    check(s.returncode == 0 and len(lines) == 7 and all(" 0 pending" in l and " 0 failed" in l for l in lines),
          f"status: every run done: {s.stdout.strip()}")
    r = queue("report", "--scale", "tiny", "--root", str(root), "--out-dir", str(rep))
    check(r.returncode == 0, f"queue report: exit {r.returncode} {r.stderr.strip()[-300:]}")
    for name in ("e1_ascender_dense", "e2_ablations", "e3_interpretability", "e4_pareto_length", "e5_asam",
                 "e6_firing", "e7_rule_b_rates"):
        md = rep / f"{name}.md"
        text = md.read_text() if md.exists() else ""
        check("## How this was made" in text and "CPU of the runs:" in text and "**Budget**" in text,
              f"{name}: report with budget, CPU and commands")
    check((root / "e6_firing" / "rule-b" / "s0" / "weights.json").exists(), "e6: the after hook wrote weights.json")
    e7 = (rep / "e7_rule_b_rates.md").read_text()
    check("## The default" in e7 and "| oja1e-3 |" in e7, "e7: the rates' table and the default's rule")
    # every experiment reports before any of its runs is done (docs/results.md is written while the study runs)
    r = queue("report", "--scale", "tiny", "--root", str(tmp / "no_runs"), "--out-dir", str(tmp / "no_reports"))
    check(r.returncode == 0 and all((tmp / "no_reports" / f"{n}.md").exists() for n in ("e1_ascender_dense",
          "e2_ablations", "e6_firing")), f"report with no finished run: exit {r.returncode} {r.stderr.strip()[-300:]}")
    e1 = (rep / "e1_ascender_dense.md").read_text()
    check("| ascender | 2 |" in e1 and "paired bootstrap p" in e1, "e1: the comparison table and the paired test")
    check("Attention FLOPs" in e1, "e1: the FLOPs claim answered")
    e4 = (rep / "e4_pareto_length.md").read_text()
    check("Fig. 5" in e4 and "| dense |" in e4, "e4: evaluated e1's models (it waited for them)")
    front, _, apart = e4.partition("At experiment 5's budget")
    check("| asam |" in apart and "| asam |" not in front.split("## Fig. 2")[-1],
          "e4: experiment 5's arms (another budget) are listed apart from the front, not on it")
    e2 = (rep / "e2_ablations.md").read_text()
    check("### The other variants (questions, not claims)" in e2 and "the gates and λ acting" in e2,
          "e2: the variants that answer questions (gates-after at this scale) are answered")
    # a truncated predictions file is refused, not read as shorter
    e1 = root / "e1_ascender_dense" / "image"
    bad = tmp / "bad_run"
    subprocess.run(["cp", "-r", str(e1 / "dense" / "s1"), str(bad)], check=True)
    data = (bad / "predictions.csv.gz").read_bytes()
    (bad / "predictions.csv.gz").write_bytes(data[: len(data) // 2])
    r = subprocess.run([str(lib.tool("stats")), "compare", "--a", str(e1 / "dense" / "s0"), "--b", str(bad)],
                       capture_output=True, text=True)
    check(r.returncode == 1 and "truncated" in r.stderr, f"truncated gzip refused: {r.stderr.strip()}")
    e5 = (rep / "e5_asam.md").read_text()
    check("## Robustness" in e5, "e5: the robustness table")
    e3 = (rep / "e3_interpretability.md").read_text()
    check("latent z" in e3, "e3: ASCender's latent z scored")
    # finished runs keep predictions gzipped and the queue's record
    d = root / "e1_ascender_dense" / "image" / "dense" / "s0"
    check((d / "predictions.csv.gz").exists() and not (d / "predictions.csv").exists(), "predictions gzipped")
    check((lib.read_json(d / "queue.json") or {}).get("state") == "done", "queue.json records done")


EXPERIMENTS = ["e1_ascender_dense", "e2_ablations", "e3_interpretability", "e4_pareto_length", "e5_asam", "e6_firing",
               "e7_rule_b_rates"]


def without_date(markdown: str) -> str:
    return re.sub(r"report written \d{4}-\d{2}-\d{2}", "report written DATE", markdown)


def packed_results(tmp: Path):
    """The results as data (lib.pack): the queue packs each finished run into its experiment's tables; with the run
    folders gone but for the files the runs keep, the reports and figures are those the folders gave; packing is
    deterministic (the queue's run-by-run tables are byte for byte one packing of every folder, and packing the
    tables alone changes nothing); a run that needs another's model runs from the kept files and the tables."""
    import importlib
    root, rep = tmp / "runs", tmp / "reports"  # tiny_end_to_end's runs and reports
    packed = tmp / "packed"
    shutil.copytree(root, packed, symlinks=True)
    for name in EXPERIMENTS:
        check(all((root / name / t).exists() for t in (lib.RUNS_TABLE, lib.PREDICTIONS_TABLE)),
              f"{name}: the queue packed its finished runs into the tables")
        for run in importlib.import_module(name).EXPERIMENT.runs("tiny"):  # what git would hold of the run folders
            d = packed / name / run.id
            for f in sorted(d.rglob("*"), reverse=True):  # deepest first: a folder after its files
                if f.is_file() and f.relative_to(d).as_posix() not in run.keep:
                    f.unlink()
                elif f.is_dir() and not any(f.iterdir()):
                    f.rmdir()
    check(not lib.holds_run(packed / "e1_ascender_dense" / "image" / "dense" / "s0")
          and (packed / "e1_ascender_dense" / "image" / "dense" / "s0" / "best.safetensors").exists()
          and (packed / "e3_interpretability" / "ascender" / "s0" / "dumps" / "decomposition_0.safetensors").exists(),
          "the packed tree: tables, experiment 1's models (experiment 4 evaluates them) and experiment 3's dumps")
    s = queue("status", "--scale", "tiny", "--root", str(packed))
    lines = [l for l in s.stdout.splitlines() if " runs:" in l]
    check(len(lines) == 7 and all(" 0 pending" in l and " 0 failed" in l for l in lines),
          f"status from the tables: every run done: {s.stdout.strip()[-300:]}")
    out = tmp / "packed_reports"
    r = queue("report", "--scale", "tiny", "--root", str(packed), "--out-dir", str(out))
    check(r.returncode == 0, f"report from the tables: exit {r.returncode} {r.stderr.strip()[-300:]}")
    for name in EXPERIMENTS:
        a, b = rep / f"{name}.md", out / f"{name}.md"
        check(b.exists() and without_date(a.read_text()) == without_date(b.read_text()),
              f"{name}: the report from the tables is the one from the run folders")
    figures = sorted(p.relative_to(rep) for p in rep.rglob("*") if p.is_file() and p.suffix in (".png", ".csv"))
    same = [f for f in figures if (out / f).exists() and (out / f).read_bytes() == (rep / f).read_bytes()]
    check(figures and same == figures and sorted(p.relative_to(out) for p in out.rglob("*")
                                                 if p.is_file() and p.suffix in (".png", ".csv")) == figures,
          f"the figures (and the data they draw) from the tables are the folders': {len(same)} of {len(figures)}")
    # deterministic bytes
    repacked = tmp / "repacked"
    shutil.copytree(root, repacked, symlinks=True)
    for name in EXPERIMENTS:
        for t in (lib.RUNS_TABLE, lib.PREDICTIONS_TABLE):
            (repacked / name / t).unlink()
        lib.pack(repacked / name)
        changed = lib.pack(packed / name)
        check(not changed and all((repacked / name / t).read_bytes() == (root / name / t).read_bytes()
                                  == (packed / name / t).read_bytes() for t in (lib.RUNS_TABLE, lib.PREDICTIONS_TABLE)),
              f"{name}: packing again gives the same bytes (at once, run by run, from the tables alone)")
    # the study's records: each run's predictions are its folder's, and a statistic computed from the tables
    rec = lib.tables(packed / "e6_firing").records["rule-b/s0"]
    folder = root / "e6_firing" / "rule-b" / "s0"
    check(rec["summary"] == lib.read_json(folder / "summary.json") and rec["weights"] == lib.read_json(
          folder / "weights.json") and rec["metrics"]["columns"][:3] == ["step", "epoch", "split"],
          "runs.jsonl.gz: a run's summary, weights and curve")
    import csv
    import gzip
    with gzip.open(packed / "e6_firing" / lib.PREDICTIONS_TABLE, "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["run"] == "rule-b/s0"]
    check(rows and abs(sum(int(r["correct"]) for r in rows) / len(rows) - rec["summary"]["test_accuracy"]) < 1e-9,
          "predictions.csv.gz: a run's test accuracy recomputed from its rows")
    # a fresh clone: experiment 4 evaluates experiment 1's kept models, their summaries in the tables only
    shutil.rmtree(packed / "e4_pareto_length")
    r = queue("run", "e4_pareto_length", "--scale", "tiny", "--root", str(packed))
    check(r.returncode == 0 and len(lib.tables(packed / "e4_pareto_length").records) == len(
          importlib.import_module("e4_pareto_length").runs("tiny")),
          f"e4 runs from experiment 1's kept models and tables: exit {r.returncode} {r.stdout.strip()[-300:]}")


def run_stopped_midway(q: lib.Queue, exps: list, run_dir: Path) -> bool:
    """q.run(exps) stopped as a deadline stops it, once the first run has trained a little (its first metrics row), not
    after a fixed time: a fast machine trains these tiny models' 3000 steps within three seconds."""
    metrics = run_dir / "metrics.jsonl"

    def stop_once_training():
        end = time.time() + 120
        while time.time() < end and not (metrics.exists() and metrics.stat().st_size > 0):
            time.sleep(0.05)
        q.interrupted = True  # what the deadline and SIGINT set: the running train gets SIGINT
    watcher = threading.Thread(target=stop_once_training, daemon=True)
    watcher.start()
    finished = q.run(exps, deadline=float("inf"))
    watcher.join()
    return finished


def mechanics(tmp: Path):
    root = tmp / "mech"
    base = ["--task", "grouping", "--train-size", "256", "--val-size", "32", "--test-size", "32", "--d-model", "16",
            "--heads", "2", "--layers", "1", "--ffn", "32", "--batch", "16", "--progress", "none", "--threads", "1",
            "--model", "dense"]
    runs = [lib.Run(id="long", arm="long", seed=0, args=base + ["--steps", "3000", "--eval-every", "100"], steps=3000),
            lib.Run(id="bad", arm="bad", seed=0, args=base + ["--model", "firing", "--steps", "2"], steps=2),
            lib.Run(id="waits", arm="waits", seed=0, args=base + ["--steps", "2"], steps=2, needs=["nowhere/file"]),
            lib.Run(id="short", arm="short", seed=0, args=base + ["--steps", "2"], steps=2)]
    exp = lib.Experiment(name="mech", title="queue mechanics", runs=lambda scale: runs, report=lambda rep: "")
    q = lib.Queue(root, "tiny", log=lambda *_: None)
    check(q.run([exp], deadline=time.time() - 1) is False and not (root / "mech").exists(),
          "a deadline already past starts nothing")
    d = root / "mech" / "long"
    t0 = time.time()
    finished = run_stopped_midway(q, [exp], d)
    check(not finished and time.time() - t0 < 60, "a stop (the deadline, a signal) stops the queue")
    rec = lib.read_json(d / "queue.json") or {}
    check(lib.state_of(d) == "partial" and rec["parts"][0]["exit"] == 130, f"stopped run is partial: {rec}")
    check((d / "ckpt" / "last.safetensors").exists(), "its checkpoint is saved")
    (root / "mech" / "short").mkdir(parents=True)
    (root / "mech" / "short" / "queue.lock").write_text("999999999\n")  # a stale lock: its queue is gone
    logged = []
    finished = lib.Queue(root, "tiny", log=logged.append).run([exp], deadline=float("inf"))
    rec = lib.read_json(d / "queue.json") or {}
    check(not finished and any("wait for the outputs of others" in l for l in logged),
          f"a run left waiting makes the queue report it and return False: {logged[-1:]}")
    check(lib.state_of(d) == "done" and len(rec["parts"]) == 2, f"resumed and done in two parts: {rec}")
    check(lib.read_json(d / "summary.json")["steps"] == 3000, "the resumed run ran all its steps")
    check(lib.state_of(root / "mech" / "bad") == "failed", "a failing run is recorded as failed")
    check(lib.state_of(root / "mech" / "short") == "done", "the queue went on after the failure")
    check(lib.state_of(root / "mech" / "waits") == "pending", "a run whose inputs are missing waits")
    # One experiment, one version of the code.
    rec["code_version"] = "0000000"
    lib.write_json(d / "queue.json", rec)
    try:
        lib.Queue(root, "tiny", log=lambda *_: None).run([exp], deadline=float("inf"))
        check(False, "mixed code versions refused")
    except SystemExit as e:
        check("one version of the code" in str(e), f"mixed code versions refused: {e}")
    logged = []
    lib.Queue(root, "tiny", allow_mixed=True, log=logged.append).run([exp], deadline=float("inf"))
    check(not any("one version" in l for l in logged), "--allow-mixed-versions continues")


def launcher(tmp: Path):
    """--launcher: each run started under it (a recording shell script here; mpirun in use), recorded in queue.json."""
    root, marks = tmp / "launch", tmp / "launched.txt"
    script = tmp / "launch.sh"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{marks}"\nexec "$@"\n')
    script.chmod(0o755)
    base = ["--task", "grouping", "--train-size", "64", "--val-size", "32", "--test-size", "32", "--d-model", "16",
            "--heads", "2", "--layers", "1", "--ffn", "32", "--batch", "16", "--progress", "none", "--threads", "1",
            "--model", "dense", "--steps", "2"]
    runs = [lib.Run(id="r", arm="r", seed=0, args=base, steps=2)]
    exp = lib.Experiment(name="launch", title="launcher", runs=lambda scale: runs, report=lambda rep: "")
    finished = lib.Queue(root, "tiny", log=lambda *_: None, launcher=[str(script)]).run([exp], float("inf"))
    rec = lib.read_json(root / "launch" / "r" / "queue.json") or {}
    check(finished and marks.exists() and "--out" in marks.read_text() and lib.state_of(root / "launch" / "r") == "done",
          f"--launcher starts each run under it: {marks.read_text() if marks.exists() else 'not started'}")
    check(rec.get("command", "").startswith(str(script)), f"queue.json records the launcher: {rec.get('command')}")


def commits(tmp: Path):
    """--commit: each finished run's light files land in a commit of their own; checkpoints stay out."""
    repo = tmp / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "test@example.com")
    git("config", "user.name", "test")
    # as experiments/.gitignore: the run folders stay out (their data is in the tables), and what they hold besides
    (repo / ".gitignore").write_text("results/*/*/\n*.safetensors\nckpt/\nmetrics.jsonl\n")
    git("add", ".gitignore")
    git("commit", "-q", "-m", "what git leaves out")
    (repo / "staged.txt").write_text("not part of the run\n")
    git("add", "staged.txt")
    base = ["--task", "grouping", "--train-size", "64", "--val-size", "16", "--test-size", "16", "--d-model", "16",
            "--heads", "2", "--layers", "1", "--ffn", "32", "--batch", "16", "--steps", "2", "--progress", "none",
            "--threads", "1", "--model", "dense"]
    exp = lib.Experiment(name="c", title="commits", report=lambda rep: "",
                         runs=lambda scale: [lib.Run(id="r/s0", arm="r", seed=0, args=base, steps=2)])
    lib.Queue(repo / "results", "tiny", commit=True, log=lambda *_: None).run([exp], deadline=float("inf"))
    files = git("show", "--name-only", "--format=%s", "HEAD").stdout.split()
    check("results/c/runs.jsonl.gz" in files and "results/c/predictions.csv.gz" in files,
          f"the run committed: its experiment's tables: {files}")
    check(not any("/r/s0/" in f for f in files), f"not its folder: {files}")
    check(not any(f.endswith(".safetensors") for f in files), "no checkpoint committed")
    check("staged.txt" not in files and "staged.txt" in git("diff", "--cached", "--name-only").stdout,
          "what else was staged stays staged, out of the run's commit")
    # A run stopped at the deadline is committed with its checkpoint; a clone (another machine) resumes it, and once it
    # is done the checkpoint and models leave the tree.
    long = base[:base.index("--steps")] + ["--steps", "3000", "--eval-every", "100"] + base[base.index("--steps") + 2:]
    exp = lib.Experiment(name="p", title="partial", report=lambda rep: "",
                         runs=lambda scale: [lib.Run(id="r/s0", arm="r", seed=0, args=long, steps=3000,
                                                     keep=["best.safetensors"])])
    q = lib.Queue(repo / "results", "tiny", commit=True, log=lambda *_: None)
    run_stopped_midway(q, [exp], repo / "results" / "p" / "r" / "s0")
    tracked = git("ls-files", "results/p").stdout.split()
    check("results/p/r/s0/ckpt/last.safetensors" in tracked and "results/p/r/s0/config.json" in tracked,
          f"the stopped run is committed with its checkpoint: {tracked}")
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    cgit = lambda *a: subprocess.run(["git", "-C", str(clone), *a], capture_output=True, text=True)  # noqa: E731
    cgit("config", "user.email", "test@example.com")
    cgit("config", "user.name", "test")
    d = clone / "results" / "p" / "r" / "s0"
    check(lib.state_of(d) == "partial", "the clone holds a partial run")
    lib.Queue(clone / "results", "tiny", commit=True, log=lambda *_: None).run([exp], deadline=float("inf"))
    rec = lib.read_json(d / "queue.json") or {}
    check(lib.state_of(d) == "done" and len(rec["parts"]) == 2, f"the clone resumed it to the end: {rec}")
    check(lib.read_json(d / "summary.json")["steps"] == 3000, "all its steps")
    tracked = cgit("ls-files", "results/p").stdout.split()
    check("results/p/runs.jsonl.gz" in tracked and "results/p/r/s0/best.safetensors" in tracked and
          not any("ckpt/" in f or f.endswith("metrics.jsonl") or f.endswith("summary.json") for f in tracked),
          f"done: the tables and the kept model committed, the rest of the folder out of the tree: {tracked}")
    check((d / "summary.json").exists() and (d / "config.json").exists(), "the run folder itself stays on the disk")
    check(cgit("status", "--porcelain", "results/p").stdout.strip() == "", "nothing of the run left uncommitted")
    check(cgit("diff", "--cached", "--name-only").stdout.strip() == "", "the index as the commit left it")
    # A new run whose estimate does not fit the budget left is not started.
    logged = []
    exp = lib.Experiment(name="q", title="budget", report=lambda rep: "",
                         runs=lambda scale: [lib.Run(id="r/s0", arm="r", seed=0, args=long, steps=3000, cost=1.0)])
    finished = lib.Queue(repo / "results", "tiny", log=logged.append).run([exp], deadline=time.time() + 600)
    check(not finished and not (repo / "results" / "q").exists() and "more than the budget left" in logged[-1],
          f"a run longer than the budget is not started: {logged[-1:]}")


def estimates(tmp: Path):
    """A run's time estimate: its arm's finished runs' mean wall time per step (other states and arms ignored), else
    its steps times its cost per step, scaled by the experiment's finished runs' wall time over their cost."""
    exp = lib.Experiment(name="est", title="t", report=lambda rep: "",
                         runs=lambda scale: [lib.Run(id=f"{arm}/s{i}", arm=arm, seed=i, args=[], steps=100, cost=0.5)
                                             for arm in ("a", "b") for i in range(4)])
    root = tmp / "est_root"
    for rid, state, wall in (("a/s0", "done", 30.0), ("a/s1", "done", 50.0), ("a/s2", "failed", 900.0),
                             ("b/s0", "partial", 70.0)):
        (root / "est" / rid).mkdir(parents=True)
        lib.write_json(root / "est" / rid / "queue.json", {"state": state, "wall_s": wall})
    runs = exp.runs("full")
    check(abs(lib.estimate(root, exp, lib.Run(id="a/s3", arm="a", seed=3, args=[], steps=200, cost=0.5), runs) - 80.0)
          < 1e-9, "estimate: twice the steps of the arm's finished runs (40 s each) -> 80 s")
    check(abs(lib.estimate(root, exp, runs[-1], runs) - 40.0) < 1e-9,
          "estimate: an arm with no finished run -> steps x cost x (80 s taken / 100 s costed by a's runs)")
    fresh = tmp / "est_fresh"  # nothing finished: the cost alone
    check(lib.estimate(fresh, exp, runs[-1], runs) == 50.0, "estimate: no finished run at all -> steps x cost")


def versions(tmp: Path):
    """The code version: the last commit of the code's files, marked +uncommitted when they differ from it (a run
    from an edited tree is not the commit's); results, docs and tools/plot.py do not change it."""
    repo = tmp / "version_repo"
    (repo / "core").mkdir(parents=True)
    (repo / "tools").mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "test@example.com")
    git("config", "user.name", "test")
    (repo / "core" / "a.cpp").write_text("int a;\n")
    (repo / "tools" / "plot.py").write_text("# draws\n")
    git("add", ".")
    git("commit", "-q", "-m", "code")
    head = git("rev-parse", "HEAD").stdout.strip()
    saved, lib.REPO = lib.REPO, repo

    def version():  # code_version() is cached: one answer per process, asked again here after each edit
        lib.code_version.cache_clear()
        return lib.code_version()
    try:
        check(version() == head, f"a clean tree: the commit ({version()})")
        (repo / "notes.md").write_text("a result\n")
        (repo / "tools" / "plot.py").write_text("# draws differently\n")
        check(version() == head, "results and tools/plot.py edited: still the commit")
        (repo / "core" / "a.cpp").write_text("int a = 1;\n")
        check(version() == head + "+uncommitted", f"the code edited: {version()}")
        (repo / "core" / "a.cpp").write_text("int a;\n")
        (repo / "core" / "b.cpp").write_text("int b;\n")
        check(version() == head + "+uncommitted", "a new, untracked code file: +uncommitted")
    finally:
        lib.REPO = saved
        lib.code_version.cache_clear()


def verdicts():
    """The verdict rules of docs/stats.md as the reports apply them (report_util.Family: Holm across the family, then
    stats json's claim_verdict), on made-up comparisons, one per rule."""
    import report_util as ru

    class Rep:  # what Family needs of a Report: the stats tool and the facts
        facts = {}

        def stats(self, requests):
            return lib.Report.stats(self, requests)

        def fact(self, section, key, value):
            self.facts.setdefault(section, {})[key] = value

    def cmp(diff, welch, paired, seeds_ci, pair_ci, learns=1e-9):
        g = {"n": 5, "mean": 0.5, "std": 0.01}
        return {"a": "A", "b": "B", "group_a": g, "group_b": g, "difference": diff,
                "welch_t_test": {"p": welch, "low": seeds_ci[0], "high": seeds_ci[1]},
                "paired_bootstrap": {"p": paired, "low": pair_ci[0], "high": pair_ci[1]},
                "mde_seeds": 0.01, "mde_examples": 0.01,
                "baseline_learns": {"p": learns, "correct": 600, "examples": 1000, "majority_rate": 0.5}}

    def one(c, claim=8.3, direction=0):
        fam = ru.Family(Rep())
        fam.add(c, claim, "c", direction=direction)
        return fam.lines()[0]
    line = one(cmp(0.011, 0.04, 0.001, (0.005, 0.019), (0.005, 0.017)))
    check("**rejected**" in line and "smaller than claimed" in line,
          f"a significant gain far below the claim, both intervals below it: {line}")
    line = one(cmp(0.011, 0.04, 0.001, (0.005, 0.019), (0.005, 0.017)), claim=1.8)
    check("**smaller than claimed**" in line, f"one interval excludes the claim: {line}")
    line = one(cmp(0.07, 0.01, 0.001, (0.05, 0.09), (0.06, 0.09)))
    check("**holds**" in line, f"a significant gain whose intervals hold the claim: {line}")
    line = one(cmp(0.002, 0.5, 0.4, (-0.1, 0.1), (-0.1, 0.1)))
    check("**inconclusive**" in line, f"nothing significant, the claim within the intervals: {line}")
    line = one(cmp(0.002, 0.5, 0.4, (-0.1, 0.1), (-0.1, 0.1), learns=0.2))
    check("**not testable**" in line and "does not learn" in line, f"a baseline at the majority rate: {line}")
    line = one(cmp(-0.03, 0.01, 0.001, (-0.05, -0.01), (-0.04, -0.02)), claim=0, direction=-1)
    check("**holds**" in line, f"a claim of a loss, a significant loss: {line}")
    # Holm: alone, p 0.04 / 0.001 makes a gain significant; in a family of three with two null results, the Welch
    # p is adjusted to 0.12 and the same comparison is inconclusive
    fam = ru.Family(Rep())
    fam.add(cmp(0.07, 0.04, 0.001, (0.05, 0.09), (0.06, 0.08)), 8.3, "a")
    fam.add(cmp(0.0, 0.9, 0.9, (-0.1, 0.1), (-0.1, 0.1)), 8.3, "b")
    fam.add(cmp(0.0, 0.8, 0.8, (-0.1, 0.1), (-0.1, 0.1)), 8.3, "c")
    first = fam.lines()[0]
    check("**inconclusive**" in first and "adjusted 0.1200" in first, f"Holm across three tasks: {first}")


def fake_run(d: Path, rng, rate: float, n: int = 500, correct=None, **summary):
    """A finished run made up here: per-example predictions (each right with probability `rate`, or as `correct`
    says), summary.json with the test accuracy and `summary`, the queue's done marker."""
    import gzip
    d.mkdir(parents=True)
    correct = correct or [1 if rng.random() < rate else 0 for _ in range(n)]
    rows = "".join(f"{i},{i % 10},{i % 10 if c else (i + 1) % 10},{c}\n" for i, c in enumerate(correct))
    with gzip.open(d / "predictions.csv.gz", "wt") as f:
        f.write("index,label,prediction,correct\n" + rows)
    lib.write_json(d / "summary.json", {"test_accuracy": sum(correct) / len(correct), **summary})
    lib.write_json(d / "queue.json", {"state": "done"})


def e4_verdicts(tmp: Path):
    """Experiment 4's full-scale verdicts on made-up runs (the tiny scale has no length buckets): per-example
    predictions drawn so that ASCender is clearly better than dense attention in the training lengths and clearly
    worse at the longest, and its accuracy falls there; on image its gain is too small to be significant."""
    import random
    import e1_ascender_dense as e1
    import e4_pareto_length as e4
    root, rng = tmp / "e4_root", random.Random(0)

    def run(d: Path, rate: float, n: int = 500, correct=None, **summary):
        fake_run(d, rng, rate, n, correct, **summary)
        (d / "metrics.csv").write_text("step,split,L0.omega_align.h0\n1,val,0.1\n")
    rate = {("ascender", "128-256"): 0.60, ("dense", "128-256"): 0.40, ("ascender", "512-1024"): 0.15,
            ("dense", "512-1024"): 0.35}
    for r in e4.runs("full"):
        model, bucket = r.arm.split("/")
        run(root / "e4_pareto_length" / r.id, rate.get((model, bucket), 0.3))
    for task in ("listops", "image"):
        for model in e1.MODELS:
            for seed in range(e1.SEEDS["full"]):
                flops = 2e5 if model == "dense" else 5e5
                if task == "listops":  # ASCender 30 points better
                    rate, correct = (0.8 if model == "ascender" else 0.5), None
                else:  # the same predictions, but 4 of 2000 examples more right in ASCender's seed 0: a gain, tiny
                    correct = [i % 2 for i in range(2000)]
                    if model == "ascender" and seed == 0:
                        correct[0:8:2] = [1] * 4
                run(root / "e1_ascender_dense" / task / model / f"s{seed}", rate, n=2000, correct=correct,
                    attention_flops_per_token=flops, tokens_per_s=1e4)
    text = e4.report(lib.Report(e4.EXPERIMENT, root, "full", tmp / "e4_out"))
    verdicts = text.split("## Verdicts", 1)[-1]
    check("listops: ASCender moves the accuracy–FLOPs Pareto front** (seed 001, Fig. 2) — holds" in verdicts,
          "e4: a significant gain over the cheaper arm moves the front")
    check("image: ASCender moves the accuracy–FLOPs Pareto front** (seed 001, Fig. 2) — not shown" in verdicts,
          "e4: a gain that is not significant does not")
    check("maintains quality under increasing sequence lengths** (seed 001, Fig. 5; trained on 128-256 tokens) — does "
          "not hold" in verdicts, "e4: a significant fall at the longest lengths")
    check("degrades less than dense attention at 512-1024 tokens (seed 001, Fig. 5: trained on 128-256)** (claim) — "
          "**rejected**" in verdicts, "e4: significantly below dense attention at the longest lengths")


def e5_verdicts(tmp: Path):
    """Experiment 5's full-scale verdicts on made-up runs: ASAM far better than dense attention on ListOps; the
    adaptive gate worth far more than claimed, the hierarchical pattern harmful; ASAM 3× dense's speed on ListOps,
    half of it on text, either side of the claim by seed on image; one seed's layer failing above 8192 tokens."""
    import random
    import e5_asam as e5
    root, rng = tmp / "e5_root", random.Random(1)
    rate = {"listops/asam": 0.8, "listops/no-adaptive-gate": 0.5, "listops/no-hierarchical": 0.95}
    speed = {("listops", "asam"): [3e4] * 5, ("text", "asam"): [5e3] * 5, ("image", "asam"): [1e4, 3e4, 3e4, 3e4, 3e4]}
    for r in e5.runs("full"):
        d = root / "e5_asam" / r.id
        task, model = r.arm.split("/")
        if model.startswith("robust-"):
            d.mkdir(parents=True)
            lib.write_json(d / "queue.json", {"state": "done"})
            lib.write_json(d / "summary.json", {})  # an evaluation's summary: done needs one
            longest = 8192 if (model == "robust-asam" and r.seed == 2) else 16384
            lib.write_json(d / "robustness.json", {
                "float32_vs_float64_max_relative": 3e-7, "noise_correlation": 0.9, "fgsm_relative_change": 0.1,
                "lengths": [{"length": n, "ok": n <= longest} for n in (4096, 8192, 16384)]})
            continue
        tps = speed.get((task, model), [1e4] * 5)[r.seed]
        fake_run(d, rng, rate.get(r.arm, 0.5), n=2000, tokens_per_s=tps, steps=600, nonfinite_steps=0)
    text = e5.report(lib.Report(e5.EXPERIMENT, root, "full", tmp / "e5_out"))
    ablation = {row.split(" | ")[0].strip("| "): row.split(" | ")[2] for row in text.splitlines()
                if row.startswith("| − ")}
    check(ablation.get("− adaptive gate (fixed at 0.5)", "").startswith("-")
          and ablation.get("− hierarchical", "").startswith("+"),
          f"e5: the ablation table gives variant − full (a harmful removal negative): {ablation}")
    verdicts = text.split("## Verdicts", 1)[-1]
    for want, what in [
            ("listops: ASAM 37.2 vs Transformer 36.4 (+0.8)** (claim) — **holds**", "a significant gain over dense"),
            ("listops: the adaptive gate adds 1.4 points to the full model (seed 004: 37.2 with it, 35.8 without)** "
             "(claim) — **holds**", "an ablation's significant loss holds"),
            ("listops: the hierarchical pattern adds 3.7 points to the full model (seed 004: 37.2 with it, 33.5 "
             "without)** (claim) — **rejected**", "a component that hurts does not"),
            ("listops: ASAM trains 2.1–4.8× faster than the standard Transformer** (seed 004; claim) — holds: "
             "ASAM's training speed (tokens/s) over dense attention's is 3.00× to 3.00× over 5 seeds",
             "speed holds where every seed reaches 2.1×"),
            ("text: ASAM trains 2.1–4.8× faster than the standard Transformer** (seed 004; claim) — does not hold",
             "speed does not hold where no seed does"),
            ("image: ASAM trains 2.1–4.8× faster than the standard Transformer** (seed 004; claim) — mixed",
             "speed is mixed where the seeds disagree"),
            ("ASAM never produces a non-finite step (NaN rate 0 %)** (seed 004, robustness; claim) — holds",
             "no skipped step: NaN rate holds"),
            ("ASAM float32 agrees with float64 to < 1e-6** (seed 004, robustness; claim) — holds: largest relative "
             "difference 3.0e-07", "precision below the threshold"),
            ("ASAM runs forward + backward at lengths up to 16384** (seed 004, robustness; claim) — does not hold: "
             "every seed's layer ran up to 8192 tokens", "one seed's failure at 16384 fails the length claim")]:
        check(want in verdicts, f"e5: {what}")


def seed_matching(tmp: Path):
    """Report.compare_seeds sets an arm against another on the seeds both have finished (a part-run arm against its
    reference's same seeds); compare takes every finished run."""
    import random
    exp = lib.Experiment(name="pair", title="t", report=lambda rep: "", runs=lambda scale: [
        lib.Run(id=f"{arm}/s{i}", arm=arm, seed=i, args=[], steps=1) for arm in ("a", "b") for i in range(3)])
    root, rng = tmp / "pair_root", random.Random(2)
    for arm, seeds in (("a", (0, 1, 2)), ("b", (0, 2))):
        for i in seeds:
            fake_run(root / "pair" / arm / f"s{i}", rng, 0.5 + 0.1 * i, n=200)
    rep = lib.Report(exp, root, "full", tmp / "pair_out")
    got = rep.compare_seeds("a", "b")
    check(got["group_a"]["n"] == 2 and got["group_b"]["n"] == 2, "compare_seeds: the two seeds both arms finished")
    check(rep.compare("a", "b")["group_a"]["n"] == 3, "compare: every finished run")


def results_links():
    """docs/results.md copies the reports' verdicts: their figure links are rewritten to start from docs/."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("experiments_queue", REPO / "experiments" / "queue.py")
    q = importlib.util.module_from_spec(spec)  # by its path: the standard library has a module named queue too
    spec.loader.exec_module(q)
    text = "a ![fig](e3/x.png) b [r](../y.md) c [w](https://e.org/z) d [h](#top) e [f](/abs/p.png)"
    got = q.relink(text, "../bench/results/experiments")
    check(got == "a ![fig](../bench/results/experiments/e3/x.png) b [r](../y.md) c [w](https://e.org/z) d [h](#top) "
          "e [f](/abs/p.png)", f"relink: {got}")


def cli(tmp: Path):
    r = queue("run", "--budget-min", "-1", "--scale", "tiny", "--root", str(tmp / "x"))
    check(r.returncode == 2 and "usage" in r.stderr, f"negative budget: usage, exit 2 ({r.returncode})")
    r = queue("status", "nosuchexperiment")
    check(r.returncode != 0 and "unknown experiment" in r.stderr, "unknown experiment named")
    r = queue("--help")
    check(r.returncode == 0 and "status" in r.stdout, "--help")


def model_summary(tmp: Path):
    """lib.read_safetensors against a file written here byte by byte, and experiment 6's weights.json (the mean
    pairwise cosine of W's rows through |sum of unit rows|^2) against the cosine of every pair computed directly."""
    import json
    import random
    import struct
    import e6_firing
    rng = random.Random(1)
    p, d = 5, 7
    w = [rng.uniform(-1, 1) for _ in range(p * d)]
    w[2 * d:3 * d] = [0.0] * d  # a zero row: cosine 0 with every other row
    w[0] = 1.0  # one weight at the clip
    sp = [0.5, -1.0, 2.0, 0.0, 0.25]
    tensors = {"model.hidden.W": ("F32", [p, d], struct.pack(f"<{p * d}f", *w)),
               "model.hidden.SP": ("F64", [p], struct.pack(f"<{p}d", *sp)),
               "model.step": ("I64", [1], struct.pack("<q", 3))}
    header, blob = {"__metadata__": {"format": "pt"}}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header).encode()
    run = tmp / "summary_run"
    (run / "ckpt").mkdir(parents=True)
    (run / "ckpt" / "last.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + blob)
    t = lib.read_safetensors(run / "ckpt" / "last.safetensors")
    w32 = list(struct.unpack(f"<{p * d}f", struct.pack(f"<{p * d}f", *w)))
    check(set(t) == {"model.hidden.W", "model.hidden.SP"} and t["model.hidden.W"][0] == [p, d]
          and list(t["model.hidden.W"][1]) == w32 and list(t["model.hidden.SP"][1]) == sp,
          "read_safetensors: float tensors with their shapes and values, other dtypes and the metadata left out")
    e6_firing.weight_summary(run)
    got = lib.read_json(run / "weights.json") or {}
    rows = [w32[i * d:(i + 1) * d] for i in range(p)]
    norm = [sum(v * v for v in r) ** 0.5 for r in rows]
    pairs = [sum(a * b for a, b in zip(rows[i], rows[j])) / (norm[i] * norm[j]) if norm[i] and norm[j] else 0.0
             for i in range(p) for j in range(p) if i != j]
    want = sum(pairs) / len(pairs)
    check(abs(got.get("w_row_cosine", 9) - want) < 1e-9 and abs(got.get("w_at_clip", 9) - 1 / (p * d)) < 1e-12
          and abs(got.get("sp_mean", 9) - sum(sp) / p) < 1e-12,
          f"e6 weights.json: mean pairwise cosine {got.get('w_row_cosine')} (direct: {want}), the fraction at the clip")


def e7_choice():
    """Experiment 7's rule for rule B's default rate: the largest rate within 0.5 points of η = 0 and not significantly
    below it; 0 when none qualifies; not chosen while a rate's runs are missing. Stub comparisons, known answers."""
    import e7_rule_b_rates as e7

    def cmp(diff_points, paired=0.5, welch=0.5):
        return {"difference": diff_points / 100, "paired_bootstrap": {"p": paired}, "welch_t_test": {"p": welch},
                "mde_examples": 0.01, "mde_seeds": 0.01}

    class Stub:
        def __init__(self, table):
            self.table = table

        def compare(self, a, b):
            return self.table.get(a)

    cases = [  # (oja1e-6, oja1e-5, oja1e-4, oja1e-3) -> chosen
        ((cmp(0.1), cmp(-0.3), cmp(-2.0, 0.001, 0.01), cmp(-40, 1e-4, 1e-4)), "1e-5"),
        ((cmp(0.1), cmp(-0.3), cmp(-0.4, 0.001, 0.01), cmp(-40, 1e-4, 1e-4)), "1e-5"),  # within 0.5 but significant
        ((cmp(-0.6), cmp(-0.3), cmp(-3.0), cmp(-40)), "1e-5"),  # the largest that qualifies, not the first
        ((cmp(-0.6), cmp(-1.0), cmp(-3.0), cmp(-40)), "0"),
        ((cmp(0.2), cmp(0.1), cmp(0.3), cmp(0.4)), "1e-3"),
    ]
    for (c6, c5, c4, c3), want in cases:
        got, _ = e7.choose(Stub({"oja1e-6": c6, "oja1e-5": c5, "oja1e-4": c4, "oja1e-3": c3}))
        check(got == want, f"e7 default rule: chose {got}, want {want}")
    got, _ = e7.choose(Stub({"oja1e-6": cmp(0.1)}))
    check(got is None, f"e7 default rule: nothing chosen while runs are missing (got {got})")


def gpu_e5(tmp: Path):
    """experiments/gpu_e5.sh: usage and exit 2 on bad arguments, `prepare` writes experiment 5's own ListOps flags;
    the committed GPU report regenerates byte-identical from the committed device outputs."""
    import budget
    import e5_asam
    script = REPO / "experiments" / "gpu_e5.sh"
    for args in ([], ["run"], ["nosuchmode", "a", "b"]):
        r = subprocess.run(["bash", str(script), *args], capture_output=True, text=True)
        check(r.returncode == 2 and "usage" in r.stderr, f"gpu_e5.sh {args}: usage, exit 2 ({r.returncode})")
    r = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
    check(r.returncode == 0 and "prepare BUILD BIN" in r.stdout, "gpu_e5.sh --help")
    build = tmp / "fake_build"
    (build / "tools").mkdir(parents=True)
    for f in ("tools/train", "tools/bench_asam", "libascender.so.0.2", "libascender_cuda.so.0.2"):
        (build / f).write_text(f)
    r = subprocess.run(["bash", str(script), "prepare", str(build), str(tmp / "bin")], capture_output=True, text=True)
    # built here from e5's pieces, not through e5_asam.arm_flags (which prepare calls)
    asam = e5_asam.flags("listops", "asam", "full")
    dense = budget.match_params(e5_asam.flags("listops", "dense", "full"), budget.params_of(asam))
    got = {m: (tmp / "bin" / f"flags_{m}.txt").read_text().split() if (tmp / "bin" / f"flags_{m}.txt").exists()
           else None for m in ("asam", "dense")}
    check(r.returncode == 0 and got == {"asam": list(map(str, asam)), "dense": list(map(str, dense))}
          and (tmp / "bin" / "train").read_text() == "tools/train", f"gpu_e5.sh prepare: {r.stderr}")
    d = REPO / "bench" / "results" / "experiments" / "e5_gpu"
    if (d / "COMMAND.txt").exists():
        out = tmp / "e5_gpu.md"
        r = subprocess.run([sys.executable, str(REPO / "experiments" / "gpu_e5_report.py"), str(out),
                            (d / "COMMAND.txt").read_text().strip(), str(d / "part1"), str(d / "part3"),
                            str(d / "profile")], capture_output=True, text=True)
        check(r.returncode == 0 and out.exists() and out.read_text() == (d.parent / "e5_gpu.md").read_text(),
              f"e5_gpu.md regenerates from bench/results/experiments/e5_gpu ({r.stderr[-300:]})")


def atomic_writes(tmp: Path):
    """lib.write_atomic / atomic_open: a file is replaced whole through <name>.tmp.<pid> beside it (fsync'd, then
    os.replace), never left half-written: an exception inside the writer, a failing rename or kill -9 leave the old
    file as it was; no temporary file stays (sweep_tmp removes one that kill -9 left). The gzip form writes the bytes
    gzip.open writes. A metrics.jsonl whose last line was cut short is read without it."""
    import gzip
    d = tmp / "atomic"
    d.mkdir()
    target = d / "state.json"
    lib.write_atomic(target, "old\n")
    check(target.read_text() == "old\n" and sorted(os.listdir(d)) == ["state.json"], "write_atomic: new file, no tmp")
    seen, real_replace, real_fsync, synced = [], os.replace, os.fsync, []

    def replace(src, dst):  # at the rename: the old file untouched, the new one whole beside it, already synced
        seen.append((Path(src).parent == Path(dst).parent, Path(src).name, Path(dst).read_bytes(),
                     Path(src).read_bytes(), bool(synced)))
        real_replace(src, dst)
    os.replace, os.fsync = replace, lambda fd: (synced.append(fd), real_fsync(fd))
    try:
        lib.write_atomic(target, b"new\n")
    finally:
        os.replace, os.fsync = real_replace, real_fsync
    check(seen == [(True, f"state.json.tmp.{os.getpid()}", b"old\n", b"new\n", True)]
          and target.read_bytes() == b"new\n" and sorted(os.listdir(d)) == ["state.json"],
          f"write_atomic: fsync'd, renamed over the old file from its own folder, no tmp left: {seen}")
    # a crash mid-write: an exception inside the writer, then a failing rename
    try:
        with lib.atomic_open(target, "w") as f:
            f.write("half of a new")
            f.flush()
            raise KeyboardInterrupt  # BaseException too
    except KeyboardInterrupt:
        pass
    check(target.read_bytes() == b"new\n" and sorted(os.listdir(d)) == ["state.json"],
          "atomic_open: an exception mid-write leaves the old file and no tmp")

    def failing(src, dst):
        raise OSError(5, "simulated crash at the rename")
    os.replace = failing
    try:
        lib.write_json(target, {"a": 1})
        check(False, "write_json: the failed rename is raised")
    except OSError:
        pass
    finally:
        os.replace = real_replace
    check(target.read_bytes() == b"new\n" and sorted(os.listdir(d)) == ["state.json"],
          "write_json: a failed rename leaves the old file and no tmp")
    try:
        lib.atomic_open(target, "a").__enter__()
        check(False, "atomic_open refuses append mode")
    except ValueError:
        pass
    # gzip: the bytes gzip.open writes (the header names the file, not its tmp); mtime=0 the packed tables' form
    (d / "a").mkdir()
    (d / "b").mkdir()
    with gzip.open(d / "a" / "p.csv.gz", "wt", newline="") as f:
        f.write("x,y\r\n1,2\n")
    header = (d / "a" / "p.csv.gz").read_bytes()
    with lib.atomic_open(d / "b" / "p.csv.gz", "wt", gzip_level=9, mtime=int.from_bytes(header[4:8], "little"),
                         newline="") as f:
        f.write("x,y\r\n1,2\n")
    check((d / "b" / "p.csv.gz").read_bytes() == header and os.listdir(d / "b") == ["p.csv.gz"],
          "atomic_open gzip: gzip.open's bytes, no tmp")
    with lib.atomic_open(d / "t.gz", "wb", gzip_level=9, mtime=0) as f:
        f.write(b"table\n")
    check((d / "t.gz").read_bytes()[4:8] == b"\0\0\0\0" and gzip.decompress((d / "t.gz").read_bytes()) == b"table\n",
          "atomic_open gzip, mtime 0: no time in the header")
    # kill -9 in the middle of a large write: the old file or the whole new one, then the dead writer's tmp swept
    big = d / "big.bin"
    lib.write_atomic(big, b"o" * 100)
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys; sys.path.insert(0, sys.argv[1]); import lib\n"
        "print('go', flush=True)\n"
        "while True: lib.write_atomic(lib.Path(sys.argv[2]), b'n' * (8 << 20))"), str(REPO / "experiments"),
        str(big)], stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    time.sleep(0.3)
    child.kill()
    child.wait()
    child.stdout.close()
    data = big.read_bytes()
    check(data in (b"o" * 100, b"n" * (8 << 20)), f"kill -9 mid-write: the old or the whole new file ({len(data)} B)")
    stale = d / f"big.bin.tmp.{child.pid}"
    stale.write_bytes(b"n")  # whether or not the kill fell inside a write, as it would have left it
    mine = lib.tmp_path(d / "mine")
    mine.write_bytes(b"")
    check(lib.sweep_tmp(d) == [stale] and mine.exists() and not stale.exists(),
          "sweep_tmp: a dead writer's tmp removed, a live one's kept")
    mine.unlink()
    # a torn last line of an appended JSON-lines file is dropped; a malformed one inside is not
    run = d / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 1.5}\n{"step": 2, "spl')
    m = lib.read_metrics(run)
    check(m == {"columns": ["step", "split", "loss"], "rows": [[1, "train", 1.5]]},
          f"read_metrics: a torn last line dropped: {m}")
    try:
        lib.jsonl_rows('{"a": 1}\n{"a": \n{"a": 2}\n')
        check(False, "jsonl_rows: a malformed line inside is an error")
    except ValueError:
        pass


ALONE = {"atomic_writes": atomic_writes, "verdicts": lambda tmp: verdicts()}  # checks that need no build: `experiments_test.py NAME` runs one


def main():
    if sys.argv[1:]:
        unknown = [n for n in sys.argv[1:] if n not in ALONE]
        if unknown:
            print(f"experiments_test: {unknown}: not a check that runs alone ({', '.join(ALONE)})")
            return 2
        with tempfile.TemporaryDirectory() as tmp:
            for name in sys.argv[1:]:
                ALONE[name](Path(tmp))
        print(f"experiments_test: {len(failures)} failure(s)" if failures else "experiments_test: all checks passed")
        return 1 if failures else 0
    if not (lib.REPO / "build").exists() and not os.environ.get("ASC_BUILD_DIR"):
        print("experiments_test: no build directory")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tiny_end_to_end(tmp)
        packed_results(tmp)
        model_summary(tmp)
        mechanics(tmp)
        launcher(tmp)
        commits(tmp)
        estimates(tmp)
        versions(tmp)
        verdicts()
        e4_verdicts(tmp)
        e5_verdicts(tmp)
        seed_matching(tmp)
        results_links()
        cli(tmp)
        gpu_e5(tmp)
        e7_choice()
        atomic_writes(tmp)
    if failures:
        print(f"experiments_test: {len(failures)} failure(s)")
        return 1
    print("experiments_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
