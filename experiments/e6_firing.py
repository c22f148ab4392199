"""Experiment 6: the firing network (seed 003) on Fashion-MNIST images — straight-through backprop, rule B (backprop
with Oja and homeostasis on the first layer), rule A (the first layer learns by its local rule only; the layers after
it by backprop) and an MLP of the same size; the firing rates against the target r*, the threshold trajectories, and
the effect of α (outputs per neuron) and of the weight range (non-negative, seed 003's default, vs signed) under rule B.

Seed 003's claims: rule B lets backprop assign credit while Oja and homeostasis keep the weights bounded and the firing
rates at r*; rule A learns with local signals only.

    python3 experiments/queue.py run e6_firing && python3 experiments/queue.py report e6_firing
"""
import csv

import lib
import report_util as ru

SEEDS = {"full": 5, "quick": 2, "tiny": 1}
VARIANT_SEEDS = {"full": 3, "quick": 1, "tiny": 1}
STEPS = {"full": 2000, "quick": 300, "tiny": 3}
R_TARGET = 0.1
DATA = {"full": ["--train-size", "55000"], "quick": ["--train-size", "10000", "--test-size", "2000"],
        "tiny": ["--train-size", "128", "--val-size", "32", "--test-size", "32"]}
COMMON = ["--task", "fashion-mnist", "--batch", "64", "--optimizer", "adamw", "--lr", "1e-3", "--schedule", "cosine",
          "--dropout", "0", "--r-target", str(R_TARGET)]
FIRING = ["--model", "firing", "--firing-hidden", "256", "--firing-backward", "ste"]
ARMS = {  # name -> (flags, what, main arm)
    "ste": (FIRING, "straight-through backprop, no rule", True),
    "rule-b": (FIRING + ["--rule", "B"], "rule B: backprop + Oja + homeostasis (signed W in [-1, 1])", True),
    "rule-a": (FIRING + ["--rule", "A", "--firing-init", "nonnegative"],
               "rule A on the first layer (local only), backprop after it", True),
    "mlp": (["--model", "mlp", "--mlp-hidden", "256"], "MLP 784-256-10, ReLU (the same parameter count ±1 %)", True),
    "rule-b-alpha1": (FIRING + ["--rule", "B", "--fan-out", "1"], "rule B, α = 1", False),
    "rule-b-alpha2": (FIRING + ["--rule", "B", "--fan-out", "2"], "rule B, α = 2", False),
    "rule-b-alpha8": (FIRING + ["--rule", "B", "--fan-out", "8"], "rule B, α = 8", False),
    "rule-b-nonneg": (FIRING + ["--rule", "B", "--firing-init", "nonnegative", "--w-min", "0"],
                      "rule B, non-negative W in [0, 1]", False),
}
TINY = ["ste", "rule-b", "rule-a", "mlp"]


def runs(scale):
    out = []
    for name, (flags, _, main) in ARMS.items():
        if scale == "tiny" and name not in TINY:
            continue
        n = STEPS[scale]
        args = [*COMMON, *DATA[scale], *flags, "--steps", str(n), "--warmup", str(max(1, n // 20))]
        for seed in range((SEEDS if main else VARIANT_SEEDS)[scale]):
            out.append(lib.Run(id=f"{name}/s{seed}", arm=name, seed=seed, args=args, steps=n, cost=0.02))
    return out


def last_value(run_dir, column, split="val"):
    """The column's value in the last metrics.csv row of a split (None when absent)."""
    try:
        with open(run_dir / "metrics.csv") as f:
            rows = [r for r in csv.DictReader(f) if r.get("split") == split and r.get(column) not in (None, "")]
        return float(rows[-1][column]) if rows else None
    except OSError:
        return None


def report(rep: lib.Report) -> str:
    scale = rep.scale
    parts = [ru.header(rep, "Experiment 6 — the firing network on Fashion-MNIST (seed 003)",
                       f"{STEPS[scale]} steps of batch 64 per run ({STEPS[scale] * 64} examples seen); "
                       f"{SEEDS[scale]} seeds per main arm, {VARIANT_SEEDS[scale]} per α / range variant; "
                       f"{' '.join(COMMON + DATA[scale])}; target firing rate r* = {R_TARGET}")]
    rows = []
    for name in rep.arms():
        dirs = rep.done(name)
        acc = [rep.summary(d).get("test_accuracy") for d in dirs]
        rates = [last_value(d, "L0.firing_rate") for d in dirs]
        thresholds = [last_value(d, "L0.firing_threshold") for d in dirs]
        rows.append([name, ARMS[name][1], len(dirs), lib.fmt_mean_std([a for a in acc if a is not None]),
                     lib.fmt_mean_std([r for r in rates if r is not None], 3, 1),
                     lib.fmt_mean_std([t for t in thresholds if t is not None], 3, 1)])
    parts.append(lib.md_table(["arm", "what", "seeds", "test accuracy %", "first-layer firing rate (r* = "
                               f"{R_TARGET})", "mean threshold SP"], rows) + "\n")
    verdicts = []
    for a, b in (("rule-b", "ste"), ("rule-a", "ste"), ("ste", "mlp"), ("rule-b", "mlp")):
        cmp = rep.compare(a, b)
        if cmp:
            parts.append(f"### {a} vs {b}\n\n{ru.comparison_table(cmp, a, b)}\n")
    rates_b = [last_value(d, "L0.firing_rate") for d in rep.done("rule-b")]
    rates_b = [r for r in rates_b if r is not None]
    if rates_b:
        worst = max(abs(r - R_TARGET) for r in rates_b)
        verdicts.append(f"- **Rule B keeps the firing rate at r*** (claim) — first-layer rate at the end "
                        f"{lib.fmt_mean_std(rates_b, 3, 1)} against r* = {R_TARGET} (largest deviation over seeds "
                        f"{worst:.3f}): {'holds' if worst <= 0.02 else 'does not hold'} within ±0.02.")
    acc_a = [rep.summary(d).get("test_accuracy") for d in rep.done("rule-a")]
    if acc_a:
        verdicts.append(f"- **Rule A learns with local signals only** (claim) — its first layer moved by the rule alone, "
                        f"the network reaches {lib.fmt_mean_std(acc_a)} % (chance: 10 %); compare with the backprop arms "
                        f"above for what the local rule costs.")
    fig = rep.plot("firing", rep.done("rule-b")[:1], "firing_rule_b")
    if fig:
        parts.append(f"Firing rates and thresholds of rule B, seed 0 (the first seed): ![firing]({fig})\n")
    curves = rep.plot("curves", [d for n in ("ste", "rule-b", "rule-a", "mlp") for d in rep.done(n)], "curves",
                      "--metric", "accuracy", "--split", "val")
    if curves:
        parts.append(f"![validation accuracy]({curves})\n")
    parts.append("## Verdicts\n\n" + ("\n".join(verdicts) if verdicts else "_none yet_") + "\n")
    parts.append(ru.footer(rep))
    return "\n".join(parts)


EXPERIMENT = lib.Experiment(name="e6_firing", title="firing network: STE, rule B, rule A, MLP; α and weight range",
                            runs=runs, report=report)
