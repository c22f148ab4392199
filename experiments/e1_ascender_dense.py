"""Experiment 1: ASCender against dense attention, both with RoPE, on ListOps, the pixel-sequence images and the text
task at equal budget (the same examples seen, the same model otherwise). Seed 001's claims: up to +8.3 points of
accuracy (RQ1) and 21 % fewer attention FLOPs (RQ2) against a strong Transformer.

    python3 experiments/queue.py run e1_ascender_dense && python3 experiments/queue.py report e1_ascender_dense
"""
import budget
import lib
import report_util as ru

TASKS = {"full": ["listops", "image", "text"], "quick": ["image"], "tiny": ["image"]}
SEEDS = {"full": 5, "quick": 2, "tiny": 2}
MODELS = ["dense", "ascender"]
CLAIM_ACC = 8.3     # points, "up to"
CLAIM_FLOPS = -21   # percent attention FLOPs against dense
# Experiment 4 evaluates each model: git keeps it as a file, with the config.json that train --eval-only builds the
# model from (it reads the one beside the model file).
KEEP = ["best.safetensors", "config.json"]


def runs(scale):
    out = []
    for task in TASKS[scale]:
        def arm(model):
            f = budget.train_flags(task, model, scale, ["--positional", "rope"])
            return budget.set_flag(f, "--lr", "3e-3") if scale == "quick" else f  # quick: few steps, a larger rate
        asc = arm("ascender")
        flags = {"ascender": asc,  # dense widened to ASCender's parameter count (equal size, ±5 %)
                 "dense": budget.match_params(arm("dense"), budget.params_of(asc))}
        for model in MODELS:
            for seed in range(SEEDS[scale]):
                out.append(lib.Run(id=f"{task}/{model}/s{seed}", arm=f"{task}/{model}", seed=seed, args=flags[model],
                                   steps=budget.steps(scale), cost=budget.cost(task, model, scale),
                                   keep=KEEP))
    return out


def report(rep: lib.Report) -> str:
    scale = rep.scale
    parts = [ru.header(rep, "Experiment 1 — ASCender vs dense attention (both RoPE)",
                       f"{budget.steps(scale)} steps of batch 32 per run ({budget.steps(scale) * 32} examples seen), "
                       f"{SEEDS[scale]} seeds (0–{SEEDS[scale] - 1}) per arm, data seed 0; each task's flags under its "
                       f"heading (dense: ASCender's, its feed-forward width matched to ASCender's parameter count)")]
    acc_rows, eff_rows, verdicts = [], [], []
    family = ru.Family(rep)  # the accuracy claim on every task: Holm-adjusted together
    for task in TASKS[scale]:
        a, b = f"{task}/ascender", f"{task}/dense"
        cmp = rep.compare(a, b)
        parts.append(f"### {budget.TASKS[task]['what']}\n" if scale == "full" else
                     f"### {task} (this scale: `{' '.join(budget.task_flags(task, scale))}`)\n")
        flags = next(r.args for r in rep.runs if r.arm == a)
        parts.append(f"{ru.rerun_note(task, scale)}ASCender's flags: `{' '.join(flags)}`\n")
        if cmp is None:
            parts.append("_no finished runs yet_\n")
            family.add(None, CLAIM_ACC, f"{task}: ASCender up to +{CLAIM_ACC} points", key=task)
            continue
        parts.append(ru.comparison_table(cmp, "ascender", "dense") + "\n")
        acc_rows.append(task)
        n_done, n_all = len(rep.done(a)) + len(rep.done(b)), 2 * SEEDS[scale]
        family.add(cmp, CLAIM_ACC, f"{task}: ASCender up to +{CLAIM_ACC} points", key=task,
                   note=f"**Preliminary: {n_done} of {n_all} runs finished.**" if n_done < n_all else "")
        eff_rows.append([task, *ru.efficiency_cells(rep, a, b)])
        fig = rep.plot("curves", rep.done(a) + rep.done(b), f"curves_{task}", "--metric", "accuracy",
                       "--split", "val", "--label-by", "model")
        if fig:
            parts.append(f"![validation accuracy, {task}]({fig})\n")
        omega = rep.plot("omega", rep.done(a)[:1], f"omega_{task}")
        if omega:
            parts.append(f"ω trajectories of the ASCender run with seed 0 (the rule: the first seed): ![ω]({omega})\n")
    verdicts += family.lines()
    parts.append("## Efficiency at equal budget (seed 001's Table 2)\n")
    parts.append(lib.md_table(["task", "attention FLOPs / token, ascender", "dense", "ratio", "training tokens/s "
                               "ascender", "dense", "inference ms / example ascender", "dense", "peak MB ascender",
                               "dense", "params ascender", "dense"], eff_rows) + "\n")
    parts.append("Equal budget, not equal quality: the accuracies above say whether the quality is equal. Inference "
                 "latency: the test pass in batches of 32, per example.\n")
    if eff_rows:
        ratios = [(r[0], float(r[3].rstrip("×"))) for r in eff_rows if r[3] != "—"]
        if ratios:
            changes = [100 * (ratio - 1) for _, ratio in ratios]
            each = ", ".join(f"{task} {c:+.0f} %" for (task, _), c in zip(ratios, changes))
            holds = all(c <= CLAIM_FLOPS for c in changes)
            for task, ratio in ratios:
                rep.fact("flops_ratio", task, f"{ratio:.2f}")
            rep.fact("flops_ratio", "range", f"{min(r for _, r in ratios):.1f}–{max(r for _, r in ratios):.1f}")
            verdicts.append(f"- **Attention FLOPs {CLAIM_FLOPS:+d} %** (claim) vs measured {each} (ASCender over "
                            f"dense per token, by the FLOP counter of docs/flops.md at each task's length): "
                            f"{'holds' if holds else 'does not hold'} (a threshold: every task must reach it).")
    parts.append("## Verdicts\n")
    parts.append("\n".join(verdicts) if verdicts else "_none yet_")
    parts.append(ru.footer(rep))
    return "\n".join(parts)


EXPERIMENT = lib.Experiment(name="e1_ascender_dense", title="ASCender vs dense (RoPE) on ListOps, image, text",
                            runs=runs, report=report)
