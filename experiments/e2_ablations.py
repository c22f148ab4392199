"""Experiment 2: ablations of ASCender (seed 001's Fig. 3) on the pixel-sequence images (196 tokens): each variant
against the full layer, same budget. Terms removed singly and jointly; neighbourhood size k; the separation and
cohesion temperatures; neighbourhood reuse; the windowed mode; gates before vs after the row normalisation (before
it, the gates and λ are inert: docs/ascender.md); separation from step 0 vs delayed (the schedule the seed recommends).

    python3 experiments/queue.py run e2_ablations && python3 experiments/queue.py report e2_ablations
"""
import budget
import lib
import report_util as ru

TASK = "image"
SEEDS = {"full": 3, "quick": 2, "tiny": 1}
STEPS = {"full": 400, "quick": 100, "tiny": 3}

# name -> (extra train flags, what it tests). "full" is the reference every other variant is compared with.
VARIANTS = {
    "full": ([], "the layer with every term (k 8, τ 1, gates before the normalisation)"),
    "no-align": (["--use-align", "0"], "alignment removed"),
    "no-sep": (["--use-sep", "0"], "separation removed"),
    "no-coh": (["--use-coh", "0"], "cohesion removed"),
    "no-terms": (["--use-align", "0", "--use-sep", "0", "--use-coh", "0"], "all three removed (scores only)"),
    "k16": (["--k", "16"], "k = 16"),
    "k32": (["--k", "32"], "k = 32"),
    "tau-sep-0.5": (["--tau-sep", "0.5"], "τ_sep = 0.5"),
    "tau-sep-2": (["--tau-sep", "2"], "τ_sep = 2"),
    "tau-coh-0.5": (["--tau-coh", "0.5"], "τ_coh = 0.5"),
    "tau-coh-2": (["--tau-coh", "2"], "τ_coh = 2"),
    "reuse": (["--asc-mode", "reuse"], "neighbourhoods reused from the scores (no latent top-k)"),
    "window-64": (["--asc-mode", "windowed", "--asc-window", "64"], "windowed, w = 64 (+ 4 global tokens)"),
    "window-128": (["--asc-mode", "windowed", "--asc-window", "128"], "windowed, w = 128 (+ 4 global tokens)"),
    "gates-after": (["--gate-position", "after"], "gates after the row normalisation (they and λ act)"),
    "sep-delayed": (None, "separation off for the first 20 % of steps"),
    "pos-alibi": (["--positional", "alibi"], "ALiBi instead of RoPE (RQ4: other positional encodings)"),
    "pos-learned": (["--positional", "learned"], "learned positions instead of RoPE (RQ4)"),
}
TINY = ["full", "no-sep", "gates-after"]


def variant_flags(name, scale):
    extra, _ = VARIANTS[name]
    if extra is None:  # sep-delayed: the step count depends on the scale
        extra = ["--sep-start", str(STEPS[scale] // 5)]
    flags = budget.train_flags(TASK, "ascender", scale, ["--positional", "rope"])
    for name, value in zip(extra[::2], extra[1::2]):  # the variant's options replace the reference's
        flags = budget.set_flag(flags, name, value)
    flags = budget.set_flag(flags, "--steps", STEPS[scale])
    return budget.set_flag(flags, "--warmup", max(1, STEPS[scale] // 10))


def runs(scale):
    names = TINY if scale == "tiny" else list(VARIANTS)
    return [lib.Run(id=f"{name}/s{seed}", arm=name, seed=seed, args=variant_flags(name, scale), steps=STEPS[scale],
                    cost=budget.cost(TASK, "ascender", scale))
            for name in names for seed in range(SEEDS[scale])]


def per_seed_differences(rep: lib.Report, name: str) -> str:
    """The variant's test accuracy minus the full layer's, seed by seed (runs of one seed share their data order)."""
    a, b = rep.by_seed(name, "test_accuracy"), rep.by_seed("full", "test_accuracy")
    return " / ".join(f"{100 * (a[s] - b[s]):+.2f}" for s in a if s in b and None not in (a[s], b[s])) or "—"


# The variants that answer a question rather than test a claim: the seed recommends delaying separation and asks
# (RQ4) whether the layer works with other positional encodings; gates-after asks whether letting the gates act
# changes anything. Each is answered with the same tests as a claim, without a direction to confirm.
QUESTIONS = {
    "sep-delayed": "separation off for the first 20 % of steps (the seed's recommended schedule) against on from step 0",
    "gates-after": "the gates and λ acting (after the row normalisation) against inert (before it)",
    "pos-alibi": "RQ4: ALiBi instead of RoPE",
    "pos-learned": "RQ4: learned absolute positions instead of RoPE",
}


def answer(rep: lib.Report, name: str, cmp: dict) -> str:
    diff, p, welch, mde = ru.tests_of(cmp)
    q = QUESTIONS[name]
    if None in (diff, p, welch, mde):
        return f"- **{q}** — no answer yet: needs 2 finished seeds per arm and predictions."
    tests = f"paired p {lib.fmt_p(p)}, Welch p {lib.fmt_p(welch)}; per seed {per_seed_differences(rep, name)}"
    if ru.significant(p, welch):
        return f"- **{q}** — a difference: {diff:+.2f} points ({tests})."
    return f"- **{q}** — no difference detected: {diff:+.2f} points ({tests}; differences below {mde:.1f} go unseen)."


def report(rep: lib.Report) -> str:
    scale = rep.scale
    parts = [ru.header(rep, "Experiment 2 — ASCender ablations (seed 001, Fig. 3)",
                       f"{budget.TASKS[TASK]['what']} (flags at this scale: {' '.join(budget.task_flags(TASK, scale))}); "
                       f"{STEPS[scale]} steps of batch 32 per run, {SEEDS[scale]} seeds per variant; RoPE; "
                       f"{' '.join(budget.MODEL)}")]
    rows, verdicts, answers = [], [], []
    family = ru.Family(rep)  # "every term contributes": one claim per term, Holm-adjusted together
    for name in rep.arms():
        if name == "full":
            continue
        cmp = rep.compare_seeds(name, "full")
        if cmp is not None and name in ("no-align", "no-sep", "no-coh", "no-terms"):
            family.add(cmp, 0, f"{VARIANTS[name][1]} lowers accuracy", direction=-1, key=name)
        if cmp is not None and name in QUESTIONS:
            answers.append(answer(rep, name, cmp))
        what = VARIANTS[name][1]
        if cmp is None:
            rows.append([name, what, "—", "—", "—", "—", "—", "—"])
            continue
        pb = (cmp.get("paired_bootstrap") or {}).get("p")
        part = "" if cmp["group_a"]["n"] == SEEDS[scale] else f" ({cmp['group_a']['n']} of {SEEDS[scale]} seeds)"
        rows.append([name, what, f"{ru.pct(cmp['group_a']['mean'])} ± {ru.pct(cmp['group_a'].get('std'))}{part}",
                     f"{100 * cmp['difference']:+.2f}",
                     f"[{ru.pct((cmp.get('difference_ci') or {}).get('low'))}, "
                     f"{ru.pct((cmp.get('difference_ci') or {}).get('high'))}]",
                     per_seed_differences(rep, name), lib.fmt_p(pb),
                     ru.pct(max(cmp.get('mde_examples') or 0, cmp.get('mde_seeds') or 0))])
    verdicts += family.lines()
    full = [rep.summary(d).get("test_accuracy") for d in rep.done("full")]
    parts.append(f"Full layer: test accuracy {lib.fmt_mean_std([v for v in full if v is not None])} % "
                 f"over {len(full)} seeds.\n")
    task_flags = budget.task_flags(TASK, scale)
    tokens = int(task_flags[task_flags.index("--image-size") + 1]) ** 2  # one token per pixel of the pooled image
    parts.append(lib.md_table(["variant", "what", "test accuracy %", "Δ vs full (points)", "95 % CI over seeds",
                               "Δ per seed (s0 / s1 / …)",
                               "paired p", "MDE"], rows))
    parts.append("\nA variant whose interval includes 0 and whose p is above 0.05 is indistinguishable from the full "
                 "layer at this budget; the MDE column says how large a difference could have been seen. The third "
                 "window of the plan, w = 256, is not run: key j is in row i's window when |i − j| < w, so at "
                 f"{tokens} tokens a window of 256 holds every key and the variant is the full "
                 "layer. The seed fixes the initialisation and the data order, so one seed's runs share most of "
                 "their randomness: where the seeds differ from each other by more than the variants of one seed do "
                 "(the per-seed column), Welch's test over seeds counts that spread as noise and its MDE is large; "
                 "the column is the paired view, shown beside the verdict rules of docs/stats.md, which read "
                 "Welch's test and the paired test over examples together.\n")
    parts.append("## Verdicts\n\n" + ("\n".join(verdicts) if verdicts else "_none yet_") + "\n")
    if answers:  # inside the verdicts section, which docs/results.md gathers
        parts.append("### The other variants (questions, not claims)\n\n" + "\n".join(answers) + "\n")
    heads = rep.plot("heads", rep.done("full")[:1], "heads_full")
    if heads:
        parts.append(f"Head specialisation of the full layer, seed 0 (the first seed): ![heads]({heads})\n")
    parts.append(ru.footer(rep))
    return "\n".join(parts)


EXPERIMENT = lib.Experiment(name="e2_ablations", title="ASCender ablations (terms, k, τ, reuse, window, gates, schedule)",
                            runs=runs, report=report)
