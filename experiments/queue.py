#!/usr/bin/env python3
"""The run queue of the experiments: which runs are done, run the rest within a time budget, write the reports.

    python3 experiments/queue.py status                     # every experiment: runs done / partial / pending, time left
    python3 experiments/queue.py run --budget-min 150 --commit   # run (and commit each finished run) for 150 minutes
    python3 experiments/queue.py run e1_ascender_dense --scale quick
    python3 experiments/queue.py report e1_ascender_dense   # bench/results/experiments/e1_ascender_dense.md + PNGs
    python3 experiments/queue.py pack                       # each experiment's tables from its run folders here
    python3 experiments/queue.py unpack --to /tmp/runs e5_asam   # run folders written back from the tables

Runs are resumable: a run stopped by the budget (or Ctrl-C) keeps its checkpoint and continues bit-identically at the
next `run`, in this session or a later one. A finished run is packed into its experiment's two tables (runs.jsonl.gz,
predictions.csv.gz), which are what git keeps. experiments/README.md describes the experiments and the files.
"""
import argparse
import importlib
import json
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lib  # noqa: E402

EXPERIMENTS = ["e1_ascender_dense", "e2_ablations", "e3_interpretability", "e4_pareto_length", "e5_asam",
               "e6_firing", "e7_rule_b_rates"]


def load(names: list[str]) -> list[lib.Experiment]:
    exps = []
    for name in names or EXPERIMENTS:
        if name not in EXPERIMENTS:
            raise SystemExit(f"queue: unknown experiment '{name}' ({', '.join(EXPERIMENTS)})")
        exps.append(importlib.import_module(name).EXPERIMENT)
    return exps


def default_root(scale: str) -> Path:
    return lib.REPO / "experiments" / "results" / scale


def cmd_status(args) -> int:
    root = args.root or default_root(args.scale)
    total_left = 0.0
    for exp in load(args.experiments):
        runs = exp.runs(args.scale)
        states = [lib.state_of(lib.run_dir(root, exp, r)) for r in runs]
        left = sum(lib.estimate(root, exp, r, runs) for r, s in zip(runs, states) if s in ("pending", "partial"))
        total_left += left
        counts = {s: states.count(s) for s in ("done", "partial", "pending", "failed")}
        print(f"{exp.name:22s} {len(runs):4d} runs: {counts['done']:4d} done, {counts['partial']:3d} partial, "
              f"{counts['pending']:4d} pending, {counts['failed']:3d} failed; ~{lib.fmt_duration(left)} of training "
              f"left — {exp.title}")
        if args.verbose:
            for r, s in zip(runs, states):
                print(f"    {s:8s} {r.id}")
    print(f"total: ~{lib.fmt_duration(total_left)} of training left at scale '{args.scale}' "
          f"(estimates: the mean wall time of each arm's finished runs, else the seconds per step measured beforehand "
          f"times the experiment's finished runs' wall time over that measure); code version {lib.code_version()}")
    return 0


def cmd_run(args) -> int:
    root = args.root or default_root(args.scale)
    deadline = time.time() + args.budget_min * 60 if args.budget_min else float("inf")
    q = lib.Queue(root, args.scale, threads=args.threads, commit=args.commit, allow_mixed=args.allow_mixed_versions,
                  progress_every=args.progress_every, launcher=shlex.split(args.launcher))
    finished = q.run(load(args.experiments), deadline)
    print("queue: every run is done" if finished else
          "queue: not every run is done (the budget ended, a signal stopped it, or runs wait for others); "
          "`run` again to continue")
    return 0 if finished else 3


def cmd_report(args) -> int:
    root = args.root or default_root(args.scale)
    out_dir = args.out_dir or lib.REPO / "bench" / "results" / "experiments"
    if args.scale != "full" and not args.out_dir:
        out_dir = out_dir / args.scale
    out_dir.mkdir(parents=True, exist_ok=True)
    exps = load(args.experiments)
    for exp in exps:
        rep = lib.Report(exp, root, args.scale, out_dir)
        rep.draw = not args.no_figures
        body = exp.report(rep)
        rep.arm_facts()
        md = out_dir / f"{exp.name}.md"
        lib.write_atomic(md, body.rstrip() + "\n")
        lib.write_atomic(md.with_suffix(".json"), json.dumps(rep.facts, indent=1, sort_keys=True, ensure_ascii=False)
                         + "\n")
        print(f"report: {md}" + (f" and {len(rep.figures)} figure(s) in {rep.fig_dir}" if rep.figures else ""))
    if args.scale == "full" and not args.out_dir and not args.experiments:
        write_results_page(exps, root, out_dir)
    return 0


RESULTS_HEAD = """# Results: the mechanisms' claims against our measurements

Written by `python3 experiments/queue.py report` from the full-scale runs of [`experiments/`](../experiments/README.md)
— do not edit by hand. Each section is one experiment: its report (tables with budgets, statistics, figures and the
exact commands) and its verdicts, one line per claim, by the rules of docs/stats.md ("Verdicts on a claim"), the first
that applies: **not testable** (the baseline does not beat the majority class: nothing to compare), **rejected** (the
claimed effect lies beyond both 95 % intervals of the difference, over seeds and over test examples), **smaller than
claimed** (a significant difference in the claimed direction, one interval excluding the claim), **holds** (a
significant difference in the claimed direction, the claim within its intervals), **inconclusive** (the rest; the MDE
beside it). "Significant": Welch's test over seeds and the paired bootstrap over examples both at p < 0.05, each
Holm-adjusted across the experiment's comparisons of one claim. Speed, FLOP and robustness claims are thresholds,
read as the reports say (**mixed**: seeds on both sides of a threshold).
Every task is scaled down from the Long Range Arena to fit a 2-core machine; the reports say how.
"""


def cmd_pack(args) -> int:
    root = args.root or default_root(args.scale)
    for name in args.experiments or EXPERIMENTS:
        if name not in EXPERIMENTS:
            raise SystemExit(f"queue: unknown experiment '{name}' ({', '.join(EXPERIMENTS)})")
        exp_dir = root / name
        drop = tuple(args.drop or ())
        unknown = [run_id for run_id in drop if run_id not in lib.tables(exp_dir).records
                   and not lib.holds_run(exp_dir / run_id)]
        if drop and len(args.experiments) != 1 or unknown:
            raise SystemExit(f"queue: --drop takes the ids of one experiment's runs (unknown here: {unknown})")
        for run_id in drop:  # its folder would come back at the next pack: the run is to be rerun
            if (exp_dir / run_id).is_dir():
                shutil.rmtree(exp_dir / run_id)
        changed = lib.pack(exp_dir, drop) if exp_dir.is_dir() else False
        runs = len(lib.tables(exp_dir).records)
        print(f"pack: {exp_dir}: {runs} runs" + (" (tables written)" if changed else " (tables unchanged)"))
    return 0


def cmd_unpack(args) -> int:
    root = args.root or default_root(args.scale)
    for name in args.experiments or EXPERIMENTS:
        if name not in EXPERIMENTS:
            raise SystemExit(f"queue: unknown experiment '{name}' ({', '.join(EXPERIMENTS)})")
        t = lib.tables(root / name)
        for run_id, record in t.records.items():
            lib.unpack_run(record, t.predictions().get(run_id), args.to / name / run_id)
        print(f"unpack: {len(t.records)} runs of {name} into {args.to / name}")
    return 0


def relink(markdown: str, prefix: str) -> str:
    """Relative links of a report (relative to its folder) made relative to another page: PREFIX/link. Absolute
    links, web addresses, anchors and links that already climb (../) are left alone."""
    return re.sub(r"\]\((?!https?:|/|\.\./|#)([^)]+)\)", lambda m: f"]({prefix}/{m.group(1)})", markdown)


def results_page_text(exps, out_dir: Path) -> str:
    """docs/results.md from the reports alone: each experiment's verdict lines (the section "## Verdicts" of its
    report), how many of its runs were done (the report's header), and a link to it."""
    parts = [RESULTS_HEAD]
    for exp in exps:
        text = (out_dir / f"{exp.name}.md").read_text()
        m = re.search(r"from (\d+) of (\d+) runs", text)
        done, total = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        verdicts = ""
        if "## Verdicts" in text:
            verdicts = text.split("## Verdicts", 1)[1].split("\n## ", 1)[0].strip()
        rel = (out_dir / f"{exp.name}.md").relative_to(lib.REPO)
        verdicts = relink(verdicts, f"../{rel.parent}")
        parts.append(f"## {exp.title}\n\n[report](../{rel}) — {done} of {total} runs finished.\n\n"
                     + (verdicts if done and verdicts and verdicts != "_none yet_"
                        else "_Not run at full scale yet: no verdict._") + "\n")
    return "\n".join(parts)


def write_results_page(exps, root, out_dir):
    page = lib.REPO / "docs" / "results.md"
    lib.write_atomic(page, results_page_text(exps, out_dir))
    print(f"report: {page}")


def main() -> int:
    p = argparse.ArgumentParser(prog="queue.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("experiments", nargs="*", help=f"experiments (default: all): {', '.join(EXPERIMENTS)}")
    common.add_argument("--scale", choices=lib.SCALES, default="full",
                        help="tiny (seconds: CI), quick (minutes), full (the budgeted study; default)")
    common.add_argument("--root", type=Path, help="where runs live (default experiments/results/SCALE)")
    s = sub.add_parser("status", parents=[common], help="runs done / partial / pending and the time left")
    s.add_argument("-v", "--verbose", action="store_true", help="list every run")
    r = sub.add_parser("run", parents=[common], help="run pending and partial runs until done or the budget ends")
    r.add_argument("--budget-min", type=float, default=0, help="minutes, then stop with checkpoints (0: no limit)")
    r.add_argument("--threads", type=int, default=0, help="CPU threads per run (0: OpenMP's default)")
    r.add_argument("--commit", action="store_true", help="git-commit each finished run's files")
    r.add_argument("--progress-every", type=float, default=0, metavar="S",
                   help="show each run's progress line every S seconds (0: only its start and end)")
    r.add_argument("--launcher", default="", metavar="CMD",
                   help="start each run under this launcher, e.g. 'mpirun -np 2': a job of several processes that "
                        "makes the run one process would (docs/train.md, \"Several processes and machines\")")
    r.add_argument("--allow-mixed-versions", action="store_true",
                   help="continue an experiment whose runs were made by another version of the code")
    rp = sub.add_parser("report", parents=[common], help="tables and figures from the finished runs")
    rp.add_argument("--out-dir", type=Path, help="default bench/results/experiments (a subfolder per scale)")
    rp.add_argument("--no-figures", action="store_true",
                    help="do not draw figures; reference those already in the output folder (what the test of the "
                         "committed reports uses)")
    pk = sub.add_parser("pack", parents=[common],
                        help="write each experiment's tables (runs.jsonl.gz, predictions.csv.gz) from its finished run "
                             "folders and what the tables held")
    pk.add_argument("--drop", action="append", metavar="RUN",
                    help="a run id of the one experiment named, to rerun: its record leaves the tables and its folder "
                         "(kept files included) is deleted (repeatable)")
    up = sub.add_parser("unpack", parents=[common],
                        help="write run folders back from the tables (to read them with stats compare or plot.py)")
    up.add_argument("--to", type=Path, required=True, help="the folder to write DIR/<experiment>/<run>/ in")
    args = p.parse_args()
    if getattr(args, "budget_min", 0) < 0 or getattr(args, "threads", 0) < 0 or getattr(args, "progress_every", 0) < 0:
        p.error("--budget-min, --threads and --progress-every must be >= 0")
    return {"status": cmd_status, "run": cmd_run, "report": cmd_report, "pack": cmd_pack,
            "unpack": cmd_unpack}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
