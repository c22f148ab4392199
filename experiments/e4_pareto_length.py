"""Experiment 4: seed 001's Fig. 2, Fig. 4 and Fig. 5 from the models of experiments 1 and 5.
- Fig. 2: test accuracy against attention FLOPs per token and against training speed, the arms of experiment 1 (one
  point per arm: mean over seeds): does ASCender move the Pareto front? Experiment 5's arms, trained on another
  budget, are listed beside it, not placed on it.
- Fig. 4: ω_align, ω_sep, ω_coh per layer and head at the end of training, mean over the seeds of experiment 1.
- Fig. 5: the ListOps models of experiment 1 (trained on mixed lengths 128–256) evaluated per length bucket, from
  shorter than anything seen to four times the longest (train --eval-only on regenerated test sets of each bucket).

    python3 experiments/queue.py run e4_pareto_length && python3 experiments/queue.py report e4_pareto_length
"""
import csv
from pathlib import Path
from typing import NamedTuple

import budget
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


class Point(NamedTuple):
    """One arm of one task on the accuracy–cost plane: means over its finished seeds, and what they came from."""
    task: str
    arm: str
    mean: float             # test accuracy, 0-1
    sd: float
    flops: float            # attention FLOPs per token
    tps: float              # training tokens per second
    dirs: list[Path]        # the finished runs
    acc: list[float]        # their test accuracies


def _arm_points(rep, exp_name, arms_by_task) -> list[Point]:
    """The finished runs of another experiment under the same root (its tables, or its run folders here)."""
    pts = []
    for task, arms in arms_by_task.items():
        for arm in arms:
            done = [(d, lib.run_json(d, "summary.json")) for d in lib.run_dirs(rep.root / exp_name, f"{task}/{arm}/s*")
                    if lib.state_of(d) == "done"]
            done = [(d, s) for d, s in done if s]
            if not done:
                continue
            sums = [s for _, s in done]
            acc = [s["test_accuracy"] for s in sums]
            m = sum(acc) / len(acc)
            sd = (sum((a - m) ** 2 for a in acc) / (len(acc) - 1)) ** 0.5 if len(acc) > 1 else 0.0
            pts.append(Point(task, arm, m, sd, sum(s["attention_flops_per_token"] for s in sums) / len(sums),
                             sum(s["tokens_per_s"] for s in sums) / len(sums), [d for d, _ in done], acc))
    return pts


POINT_COLUMNS = ["task", "arm", "test accuracy %", "attention FLOPs / token", "tokens / s"]


def _point_row(p: Point) -> list[str]:
    return [p.task, p.arm, f"{100 * p.mean:.2f} ± {100 * p.sd:.2f}", f"{p.flops:,.0f}", f"{p.tps:,.0f}"]


def _dominators(task, pts) -> list[str]:
    """The arms of the task as accurate as ASCender or more, at no more attention FLOPs (means over seeds)."""
    asc = next(p for p in pts if p.task == task and p.arm == "ascender")
    return [p.arm for p in pts if p.task == task and p.arm != "ascender" and p.mean >= asc.mean
            and p.flops <= asc.flops]


def _cheaper_tests(rep, task, pts) -> list:
    """ASCender against each arm of its task that costs fewer attention FLOPs: (arm point, difference in points,
    paired p, Welch p) — what decides whether an undominated ASCender moves the front."""
    asc = next(p for p in pts if p.task == task and p.arm == "ascender")
    others = [p for p in pts if p.task == task and p.arm != "ascender"]
    out = []
    for p in (p for p in others if p.flops < asc.flops):
        cmp = rep.compare_dirs(asc.dirs, p.dirs, f"{task}/ascender", f"{task}/{p.arm}", strict=False)
        diff, paired, welch, _ = ru.tests_of(cmp) if cmp else (100 * (asc.mean - p.mean), None, None, None)
        if welch is None and len(asc.acc) > 1 and len(p.acc) > 1:
            welch = rep.stats([{"op": "welch_t_test", "a": asc.acc, "b": p.acc}])[0]["p"]
        out.append((p, diff, paired, welch))
    return out


def _pareto_verdicts(rep, tasks, pts) -> list[str]:
    """Seed 001's Fig. 2: ASCender moves the accuracy–FLOPs front, one verdict per task. A point is on the front when
    no other is as accurate and cheaper; one that is on it only by being more accurate than the cheaper arms moves it
    only if that gain is real: significant (paired p < 0.05 over test examples and Welch p < 0.05 over seeds; Welch
    alone for arms evaluated on other test examples) over every cheaper arm, the p-values Holm-adjusted across every
    task's comparisons (one claim tested on several tasks: docs/stats.md)."""
    dominators = {task: _dominators(task, pts) for task in tasks}
    tests = {task: [] if dominators[task] else _cheaper_tests(rep, task, pts) for task in tasks}
    flat = [t for task in tasks for t in tests[task]]
    adj_paired, adj_welch = ([], [])
    if flat:
        adj_paired, adj_welch = rep.stats([{"op": "holm_adjust", "p": [t[2] for t in flat]},
                                           {"op": "holm_adjust", "p": [t[3] for t in flat]}])
    adjusted = iter(zip(adj_paired, adj_welch))  # in flat's order, which the loop below walks
    out = []
    for task in tasks:
        asc = next(p for p in pts if p.task == task and p.arm == "ascender")
        label = f"- **{task}: ASCender moves the accuracy–FLOPs Pareto front** (seed 001, Fig. 2) — "
        if dominators[task]:
            out.append(label + f"does not hold: {', '.join(dominators[task])} is as accurate or more at fewer attention "
                               f"FLOPs (means over seeds).")
            continue
        if not tests[task]:
            out.append(label + "holds: no other arm is as accurate, and none is cheaper (means over seeds).")
            continue
        gains, weak = [], []
        for p, diff, paired, welch in tests[task]:
            pp, pw = next(adjusted)
            shown = ", ".join(f"{n} p {lib.fmt_p(v)}" + (f" (adjusted {lib.fmt_p(a)})" if len(flat) > 1 else "")
                              for n, v, a in (("paired", paired, pp), ("Welch", welch, pw)) if v is not None)
            text = (f"{p.arm} ({diff:+.2f} points, {shown or 'untested'}; ASCender costs "
                    f"{asc.flops / p.flops:.2f}× its FLOPs)")
            real = diff > 0 and ru.significant(pp, pw, paired_optional=True)
            rep.fact("pareto", task if p.arm == "dense" else f"{task}/{p.arm}",
                     {"paired_holm": lib.fmt_p(pp), "welch_holm": lib.fmt_p(pw)})
            (gains if real else weak).append(text)
        if weak:
            out.append(label + ("not shown: ASCender is on the front only by its mean accuracy; its gain over the "
                                "cheaper " + "; ".join(weak) + " is not significant"
                                + (f" (significant over {'; '.join(gains)})" if gains else "") + "."))
        else:
            out.append(label + "holds: significantly more accurate than every cheaper arm: " + "; ".join(gains) + ".")
    return out


def _training_bucket(scale) -> str:
    """The lengths experiment 1 trained its ListOps models on, as a bucket name ("128-256")."""
    args = next(r.args for r in e1.runs(scale) if r.arm == "listops/ascender")
    return f"{args[args.index('--min-len') + 1]}-{args[args.index('--max-len') + 1]}"


def _length_section(rep, scale, buckets, verdicts) -> str:
    """Seed 001's Fig. 5: "ASCender maintains quality under increasing sequence lengths". Two readings, two verdicts:
    its accuracy in the longest bucket against its own in the training lengths (holds unless significantly lower,
    Welch over seeds: the buckets are different test sets), and against dense attention's in each bucket longer
    than the training lengths (paired over the bucket's test examples and Welch over seeds)."""
    train, longest = _training_bucket(scale), buckets[-1]
    rows, longer = [], ru.Family(rep)  # ASCender − dense beyond the training lengths: one claim per bucket, Holm
    for b in buckets:
        cmp = rep.compare(f"ascender/{b}", f"dense/{b}")
        if cmp is None:
            continue
        diff, paired, welch, mde = ru.tests_of(cmp)
        rows.append([b, f"{diff:+.2f}", lib.fmt_p(paired), lib.fmt_p(welch), f"{mde:.1f}" if mde else "—"])
        if int(b.split("-")[0]) >= int(train.split("-")[1]):
            longer.add(cmp, 0, f"ASCender degrades less than dense attention at {b} tokens (seed 001, Fig. 5: "
                       f"trained on {train})", direction=1, key=b)
    out = ["### ASCender − dense per bucket (points)\n", lib.md_table(["bucket", "ascender − dense", "paired p",
                                                                        "Welch p", "MDE"], rows) + "\n"]
    drops = {}
    for model in e1.MODELS:
        acc = {b: [rep.summary(d)["test_accuracy"] for d in rep.done(f"{model}/{b}")] for b in (train, longest)}
        if all(len(v) > 1 for v in acc.values()):
            welch = rep.stats([{"op": "welch_t_test", "a": acc[longest], "b": acc[train]}])[0]["p"]
            mean = {b: 100 * sum(v) / len(v) for b, v in acc.items()}
            drops[model] = (mean[train], mean[longest], welch)
            rep.fact("length", model, {"train": f"{mean[train]:.1f}", "longest": f"{mean[longest]:.1f}",
                                       "train_bucket": train, "longest_bucket": longest})
    if "ascender" in drops:
        t, l, w = drops["ascender"]
        kept = not (l < t and w < 0.05)
        d = drops.get("dense")
        verdicts.append(
            f"- **ASCender maintains quality under increasing sequence lengths** (seed 001, Fig. 5; trained on {train} "
            f"tokens) — {'holds' if kept else 'does not hold'}: {t:.2f} % in the training lengths, {l:.2f} % at "
            f"{longest} tokens ({l - t:+.2f} points, Welch p {lib.fmt_p(w)})"
            + (f"; dense attention {d[0]:.2f} → {d[1]:.2f} % ({d[1] - d[0]:+.2f})" if d else "") + ".")
    verdicts += longer.lines()  # the rules of docs/stats.md: a claim of a direction (ASCender − dense > 0)
    return "\n".join(out)


def report(rep: lib.Report) -> str:
    scale = rep.scale
    verdicts = []
    parts = [ru.header(rep, "Experiment 4 — Pareto front, ω per head, length generalisation (seed 001, Figs. 2, 4, 5)",
                       "no training of its own: the models and summaries of experiments 1 and 5; the ListOps models "
                       f"re-evaluated on {TEST_SIZE[scale]} regenerated test examples per length bucket")]
    # ---- Fig. 2
    # The front is drawn and judged at one budget, experiment 1's (its steps, RoPE). Experiment 5's sparse arms train
    # for fewer steps with learned positions: beside the front they would look worse for their budget, not their
    # attention, so they are listed apart and not judged.
    pts = _arm_points(rep, "e1_ascender_dense", {t: e1.MODELS for t in e1.TASKS[scale]})
    apart = _arm_points(rep, "e5_asam", {t: e5.ARMS for t in e5.TASKS[scale]})
    if pts:
        rep.fig_dir.mkdir(parents=True, exist_ok=True)
        for xcol, name, xlabel in ((4, "pareto_flops", "attention FLOPs per token"), (5, "pareto_speed",
                                                                                       "training tokens / s")):
            path = rep.fig_dir / f"{name}.csv"
            with lib.atomic_open(path, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["x", "y", "yerr", "group"])
                for task, arm, m, sd, flops, tps, *_ in pts:
                    w.writerow([flops if xcol == 4 else tps, 100 * m, 100 * sd, f"{task}: {arm}"])
            fig = rep.plot("xy", [path], name, "--xlabel", xlabel, "--ylabel", "test accuracy %", "--logx",
                           "--title", "accuracy against cost (mean ± std over seeds)")
            if fig:
                parts.append(f"![{name}]({fig})\n")
        rows = [_point_row(p) for p in pts]
        verdicts += _pareto_verdicts(rep, [t for t in sorted({p.task for p in pts})
                                           if any(p.task == t and p.arm == "ascender" for p in pts)], pts)
        parts.insert(1, "## Fig. 2 — accuracy against attention FLOPs and speed\n\n"
                     + lib.md_table(POINT_COLUMNS, rows)
                     + "\n\nA point is on the Pareto front when no other point of its task is as accurate and cheaper; "
                       "it moves the front only if it is cheaper, or its gain over every cheaper point is "
                       "significant.\n"
                     + (f"\nAt experiment 5's budget ({e5.STEPS[scale]} steps"
                        + "".join(f", {t} {n}" for (t, sc), n in e5.TASK_STEPS.items() if sc == scale)
                        + "; learned positions; not comparable with "
                        f"the points above, which had {budget.steps(scale)} steps and RoPE, so not on the front):\n\n"
                        + lib.md_table(POINT_COLUMNS, [_point_row(p) for p in apart]) + "\n" if apart else ""))
    # ---- Fig. 4: final ω per layer and head, mean over the seeds of experiment 1
    task = e1.TASKS[scale][0]
    omegas = {}
    for d in lib.run_dirs(rep.root / "e1_ascender_dense", f"{task}/ascender/s*"):
        if lib.state_of(d) != "done":
            continue
        rows = [r for r in lib.run_metrics(d) if r.get("split") == "val"]
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
        with lib.atomic_open(path, "w", newline="") as f:
            csv.writer(f).writerows([["x", "y", "yerr", "group"], *csv_rows])
        fig = rep.plot("xy", [path], "length", "--lines", "--logx", "--xlabel", "sequence length (bucket centre)",
                       "--ylabel", "test accuracy %", "--title", "trained on 128–256 tokens; evaluated per bucket")
        if fig:
            parts.append(f"![accuracy per length]({fig})\n")
    if TASK[scale] == "listops":
        parts.append(_length_section(rep, scale, buckets, verdicts))
    parts.append("## Verdicts\n\n" + ("\n".join(verdicts) if verdicts else "_none yet_") + "\n")
    parts.append(ru.footer(rep))
    return "\n".join(parts)


EXPERIMENT = lib.Experiment(name="e4_pareto_length", title="Pareto front, ω per head, accuracy per length bucket",
                            runs=runs, report=report)
