"""Experiment 4: seed 001's Fig. 2, Fig. 4 and Fig. 5 from the models of experiments 1 and 5.
- Fig. 2: test accuracy against attention FLOPs per token and against training speed, every attention arm of
  experiments 1 and 5 (one point per arm: mean over seeds): does ASCender move the Pareto front?
- Fig. 4: ω_align, ω_sep, ω_coh per layer and head at the end of training, mean over the seeds of experiment 1.
- Fig. 5: the ListOps models of experiment 1 (trained on mixed lengths 128–256) evaluated per length bucket, from
  shorter than anything seen to four times the longest (train --eval-only on regenerated test sets of each bucket).

    python3 experiments/queue.py run e4_pareto_length && python3 experiments/queue.py report e4_pareto_length
"""
import csv

import e1_ascender_dense as e1
import e5_asam as e5
import lib
import report_util as ru

BUCKETS = {"full": [(32, 64), (64, 128), (128, 256), (256, 512), (512, 1024)], "quick": [(16, 32), (32, 96)],
           "tiny": [(16, 40)]}
TEST_SIZE = {"full": "500", "quick": "200", "tiny": "8"}
TASK = {"full": "listops", "quick": "image", "tiny": "image"}  # which experiment-1 task's models


def runs(scale):
    task = TASK[scale]
    out = []
    if task != "listops":  # the image task has one length: nothing to bucket at these scales but the plumbing
        buckets = [(None, None)]
    else:
        buckets = BUCKETS[scale]
    for model in e1.MODELS:
        for seed in range(e1.SEEDS[scale]):
            src = f"e1_ascender_dense/{task}/{model}/s{seed}"
            for lo, hi in buckets:
                name = "all" if lo is None else f"{lo}-{hi}"
                args = ["--eval-only", f"{{root}}/{src}/best.safetensors", "--test-size", TEST_SIZE[scale],
                        "--val-size", "8", "--progress", "none"]
                if lo is not None:
                    args += ["--min-len", str(lo), "--max-len", str(hi)]
                out.append(lib.Run(id=f"{model}/s{seed}/{name}", arm=f"{model}/{name}", seed=seed, args=args,
                                   steps=0, cost=0, needs=[f"{src}/best.safetensors", f"{src}/summary.json"]))
    return out


def _arm_points(rep, exp_name, arms_by_task):
    """(task, arm, mean accuracy, std, mean attention FLOPs/token, mean tokens/s) of finished runs of another
    experiment, read from its run directories under the same root."""
    pts = []
    for task, arms in arms_by_task.items():
        for arm in arms:
            dirs = sorted((rep.root / exp_name / task / arm).glob("s*"))
            sums = [lib.read_json(d / "summary.json") for d in dirs if lib.state_of(d) == "done"]
            sums = [s for s in sums if s]
            if not sums:
                continue
            acc = [s["test_accuracy"] for s in sums]
            m = sum(acc) / len(acc)
            sd = (sum((a - m) ** 2 for a in acc) / (len(acc) - 1)) ** 0.5 if len(acc) > 1 else 0.0
            pts.append((task, arm, m, sd, sum(s["attention_flops_per_token"] for s in sums) / len(sums),
                        sum(s["tokens_per_s"] for s in sums) / len(sums)))
    return pts


def report(rep: lib.Report) -> str:
    scale = rep.scale
    parts = [ru.header(rep, "Experiment 4 — Pareto front, ω per head, length generalisation (seed 001, Figs. 2, 4, 5)",
                       "no training of its own: the models and summaries of experiments 1 and 5; the ListOps models "
                       f"re-evaluated on {TEST_SIZE[scale]} regenerated test examples per length bucket")]
    # ---- Fig. 2
    pts = _arm_points(rep, "e1_ascender_dense", {t: e1.MODELS for t in e1.TASKS[scale]})
    pts += [p for p in _arm_points(rep, "e5_asam", {t: e5.ARMS for t in e5.TASKS[scale]}) if p[1] != "dense"]
    if pts:
        rep.fig_dir.mkdir(parents=True, exist_ok=True)
        rows = []
        for xcol, name, xlabel in ((4, "pareto_flops", "attention FLOPs per token"), (5, "pareto_speed",
                                                                                       "training tokens / s")):
            path = rep.fig_dir / f"{name}.csv"
            with open(path, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["x", "y", "yerr", "group"])
                for task, arm, m, sd, flops, tps in pts:
                    w.writerow([flops if xcol == 4 else tps, 100 * m, 100 * sd, f"{task}: {arm}"])
            fig = rep.plot("xy", [path], name, "--xlabel", xlabel, "--ylabel", "test accuracy %", "--logx",
                           "--title", "accuracy against cost (mean ± std over seeds)")
            if fig:
                parts.append(f"![{name}]({fig})\n")
        for task, arm, m, sd, flops, tps in pts:
            rows.append([task, arm, f"{100 * m:.2f} ± {100 * sd:.2f}", f"{flops:,.0f}", f"{tps:,.0f}"])
        verdicts = []
        for task in sorted({p[0] for p in pts}):
            asc = [p for p in pts if p[0] == task and p[1] == "ascender"]
            if not asc:
                continue
            _, _, m, _, flops, _ = asc[0]
            dominators = [p[1] for p in pts if p[0] == task and p[1] != "ascender" and p[2] >= m and p[4] <= flops]
            verdicts.append(f"- **{task}: ASCender moves the accuracy–FLOPs Pareto front** (seed 001, Fig. 2) — "
                            + (f"does not hold: {', '.join(dominators)} is as accurate or more at fewer attention "
                               f"FLOPs (means over seeds)" if dominators else
                               "holds on the means over seeds: no other arm is both as accurate and cheaper") + ".")
        parts.append("## Verdicts\n\n" + ("\n".join(verdicts) if verdicts else "_none yet_") + "\n")
        parts.insert(1, "## Fig. 2 — accuracy against attention FLOPs and speed\n\n"
                     + lib.md_table(["task", "arm", "test accuracy %", "attention FLOPs / token", "tokens / s"], rows)
                     + "\n\nA point moves the Pareto front when no other point of its task is both more accurate and "
                       "cheaper.\n")
    # ---- Fig. 4: final ω per layer and head, mean over the seeds of experiment 1
    task = e1.TASKS[scale][0]
    omegas = {}
    for d in sorted((rep.root / "e1_ascender_dense" / task / "ascender").glob("s*")):
        if lib.state_of(d) != "done":
            continue
        with open(d / "metrics.csv") as f:
            rows = [r for r in csv.DictReader(f) if r.get("split") == "val"]
        if rows:
            for k, v in rows[-1].items():
                if ".omega_" in k and v not in ("", None):
                    omegas.setdefault(k, []).append(float(v))
    if omegas:
        table = sorted(omegas.items())
        parts.append(f"## Fig. 4 — ω per layer and head at the end of training ({task}, mean ± std over "
                     f"{len(next(iter(omegas.values())))} seeds)\n\n"
                     + lib.md_table(["layer.term.head", "ω"], [[k, lib.fmt_mean_std(v, 3, 1)] for k, v in table])
                     + "\n")
    # ---- Fig. 5: accuracy per length bucket
    buckets = sorted({r.arm.split("/")[1] for r in rep.runs}, key=lambda b: int(b.split("-")[0]) if b[0].isdigit() else 0)
    rows, csv_rows = [], []
    for model in e1.MODELS:
        cells = [model]
        for b in buckets:
            acc = [rep.summary(d).get("test_accuracy") for d in rep.done(f"{model}/{b}")]
            acc = [a for a in acc if a is not None]
            cells.append(lib.fmt_mean_std(acc))
            if acc and b[0].isdigit():
                m = sum(acc) / len(acc)
                sd = (sum((a - m) ** 2 for a in acc) / (len(acc) - 1)) ** 0.5 if len(acc) > 1 else 0.0
                lo, hi = (int(x) for x in b.split("-"))
                csv_rows.append([(lo + hi) / 2, 100 * m, 100 * sd, model])
        rows.append(cells)
    parts.append(f"## Fig. 5 — test accuracy % per length bucket ({TASK[scale]} models of experiment 1)\n\n"
                 + lib.md_table(["model", *buckets], rows) + "\n")
    if csv_rows:
        path = rep.fig_dir / "length.csv"
        rep.fig_dir.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows([["x", "y", "yerr", "group"], *csv_rows])
        fig = rep.plot("xy", [path], "length", "--lines", "--logx", "--xlabel", "sequence length (bucket centre)",
                       "--ylabel", "test accuracy %", "--title", "trained on 128–256 tokens; evaluated per bucket")
        if fig:
            parts.append(f"![accuracy per length]({fig})\n")
    parts.append(ru.footer(rep))
    return "\n".join(parts)


EXPERIMENT = lib.Experiment(name="e4_pareto_length", title="Pareto front, ω per head, accuracy per length bucket",
                            runs=runs, report=report)
