"""Pieces of the experiments' markdown reports: the header every table carries (date, CPU, code version, budget),
comparison tables from `stats compare`, the verdict rule against a claim, efficiency cells, the footer of commands."""
from __future__ import annotations

import datetime

import lib


def header(rep: lib.Report, title: str, budget_text: str) -> str:
    versions = sorted({(lib.run_json(rep.dir(r), "queue.json") or {}).get("code_version", "?")
                       for r in rep.runs if lib.state_of(rep.dir(r)) == "done"})
    done = sum(lib.state_of(rep.dir(r)) == "done" for r in rep.runs)
    mixed = "" if len(versions) <= 1 else " — **runs from several code versions: rerun before drawing conclusions**"
    return (f"# {title}\n\n"
            f"Scale **{rep.scale}**{' (a smoke test of the script: the numbers mean nothing)' if rep.scale == 'tiny' else ''}; "
            f"report written {datetime.date.today().isoformat()} from {done} of {len(rep.runs)} runs; "
            f"CPU: {lib.cpu_model()}; code version (last commit of the library and tools): "
            f"{', '.join(versions) or '—'}{mixed}.\n\n"
            f"**Budget**: {budget_text}. Tasks are scaled down from the Long Range Arena to fit this machine; each "
            f"section names its task's size. Equal budget = the same number of training examples seen; wall time is "
            f"reported beside, not equalised.\n")


def footer(rep: lib.Report) -> str:
    example = next((lib.run_json(rep.dir(r), "queue.json") for r in rep.runs
                    if lib.state_of(rep.dir(r)) == "done"), None) or {}
    scale = "" if rep.scale == "full" else f" --scale {rep.scale}"
    return ("\n## How this was made\n\n```sh\n"
            f"python3 experiments/queue.py run {rep.exp.name}{scale}      # resumable; --budget-min N to stop in time\n"
            f"python3 experiments/queue.py report {rep.exp.name}{scale}\n"
            + (f"# one of its runs:\n{example['command'].replace(str(lib.REPO) + '/', '')}\n"
               if example.get("command") else "")
            + "```\n\nStatistics (docs/stats.md): mean ± sample std over seeds; 95 % percentile-bootstrap intervals "
            "(10 000 resamples, seed 0); paired bootstrap and approximate randomisation over test examples (each "
            "example's correctness averaged over a model's seeds); Cohen's d and Cliff's δ over seeds; MDE = the "
            "smallest difference detectable at α = 0.05 with power 0.8.\n")


def pct(v, digits=2) -> str:
    return "—" if v is None else f"{100 * v:.{digits}f}"


def comparison_table(cmp: dict, a_name: str, b_name: str) -> str:
    def row(name, g):
        ci = g.get("ci") or {}
        return [name, g["n"], f"{pct(g['mean'])} ± {pct(g['std'])}" if g.get("std") is not None else pct(g["mean"]),
                pct(g.get("iqm")), f"[{pct(ci.get('low'))}, {pct(ci.get('high'))}]"]
    t = lib.md_table(["model", "seeds", "test accuracy % (mean ± std)", "IQM", "95 % CI of the mean"],
                     [row(a_name, cmp["group_a"]), row(b_name, cmp["group_b"])])
    lines = [t, ""]
    diff = f"{a_name} − {b_name}: **{pct(cmp['difference'])} points**"
    if "difference_ci" in cmp:
        ci = cmp["difference_ci"]
        welch = (cmp.get("welch_t_test") or {}).get("p")
        diff += (f" (95 % CI over seeds [{pct(ci['low'])}, {pct(ci['high'])}]; Welch's t-test p {lib.fmt_p(welch)}; "
                 f"Cohen's d "
                 f"{_num(cmp.get('cohens_d'))}, Cliff's δ {_num(cmp.get('cliffs_delta'))}; MDE over seeds "
                 f"{pct(cmp.get('mde_seeds'))} points)")
    lines.append(diff + ".")
    if "paired_bootstrap" in cmp:
        pb, ar = cmp["paired_bootstrap"], cmp["approximate_randomization"]
        lines.append(f"Over the {cmp['test_examples']} test examples: paired bootstrap p = {lib.fmt_p(pb['p'])} "
                     f"(95 % CI [{pct(pb['low'])}, {pct(pb['high'])}]), approximate randomisation p = "
                     f"{lib.fmt_p(ar['p'])}; MDE at this test-set size {pct(cmp.get('mde_examples'))} points.")
    return "\n".join(lines)


def _num(v, digits=2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def tests_of(cmp: dict):
    """(difference in points, paired p over examples, Welch p over seeds, MDE in points) — None where a statistic is
    missing (a single seed, no per-example predictions)."""
    diff = 100 * cmp["difference"] if cmp.get("difference") is not None else None
    p = (cmp.get("paired_bootstrap") or {}).get("p")
    welch = (cmp.get("welch_t_test") or {}).get("p")
    mdes = [cmp.get("mde_examples"), cmp.get("mde_seeds")]
    mde = 100 * max(mdes) if all(m is not None for m in mdes) else None
    return diff, p, welch, mde


def significant(paired, welch, paired_optional: bool = False) -> bool:
    """The project's test of a difference: p < 0.05 both over test examples (paired) and over seeds (Welch). A paired
    p may be missing (paired_optional) only where the runs compared were evaluated on different test examples."""
    return (welch is not None and welch < 0.05
            and (paired < 0.05 if paired is not None else paired_optional))


def verdict_accuracy(cmp: dict, claim_points: float, label: str) -> str:
    """The rule, the same for every claim of a gain in accuracy:
    holds          the difference is positive with p < 0.05 both in the paired test over test examples and in Welch's
                   t-test over seeds (a t-test, not the bootstrap interval: with 2-5 seeds that interval is too narrow)
                   and the claimed size is not above both 95 % intervals of the difference (over seeds, over examples);
    holds in direction only
                   such a significant gain, but the claimed size lies above both intervals: a gain, smaller than claimed;
    does not hold  a significant loss (both tests), or the claimed gain is at least the larger MDE (examples, seeds)
                   and the result is not a significant gain;
    not testable   the claimed gain is below that MDE, or a statistic is missing (fewer than 2 seeds per arm, no
                   per-example predictions): this budget could not tell."""
    diff, p, welch, mde = tests_of(cmp)
    if None in (diff, p, welch, mde):
        return (f"- **{label}** (claim) — not testable here: the comparison needs at least 2 finished seeds per arm "
                f"and per-example predictions.")
    sig = significant(p, welch)
    highs = [100 * c["high"] for c in (cmp.get("difference_ci"), cmp.get("paired_bootstrap")) if c and "high" in c]
    if sig and diff > 0 and highs and claim_points > max(highs):
        v = (f"holds in direction only: a significant gain of {diff:+.2f} points (paired p {lib.fmt_p(p)}, Welch p "
             f"{lib.fmt_p(welch)}), but the claimed {claim_points:+.1f} lies above both 95 % intervals (highest bound "
             f"{max(highs):+.2f})")
    elif sig and diff > 0:
        v = f"holds: a significant gain of {diff:+.2f} points (paired p {lib.fmt_p(p)}, Welch p {lib.fmt_p(welch)})"
    elif sig and diff < 0:
        v = f"does not hold: a significant loss of {diff:+.2f} points (paired p {lib.fmt_p(p)}, Welch p {lib.fmt_p(welch)})"
    elif claim_points < mde:
        v = (f"not testable at this budget: the claimed {claim_points:+.1f} is below the MDE of {mde:.1f} points "
             f"(measured {diff:+.2f})")
    else:
        v = (f"does not hold at this budget: {diff:+.2f} points, not significant (paired p {lib.fmt_p(p)}, Welch p "
             f"{lib.fmt_p(welch)}), while a gain of {claim_points:.1f} would have been detected (MDE {mde:.1f})")
    return f"- **{label}** (claim) — {v}."


def verdict_term(cmp: dict, what: str) -> str:
    """Seed 001's Fig. 3 claims every term contributes: removing it lowers accuracy. Holds on a significant loss
    (paired p < 0.05 and Welch p < 0.05); otherwise no effect was detected, at the stated MDE."""
    diff, p, welch, mde = tests_of(cmp)
    if None in (diff, p, welch, mde):
        return f"- **{what} lowers accuracy** (claim) — not testable here: needs 2 seeds per arm and predictions."
    sig = significant(p, welch)
    if sig and diff < 0:
        v = f"holds: {diff:+.2f} points (paired p {lib.fmt_p(p)}, Welch p {lib.fmt_p(welch)})"
    elif sig and diff > 0:
        v = f"does not hold: the layer is better without it, {diff:+.2f} points (paired p {lib.fmt_p(p)})"
    else:
        v = (f"no effect detected: {diff:+.2f} points (paired p {lib.fmt_p(p)}, Welch p {lib.fmt_p(welch)}; "
             f"differences below {mde:.1f} go unseen)")
    return f"- **{what} lowers accuracy** (claim) — {v}."


def efficiency_cells(rep: lib.Report, a: str, b: str) -> list[str]:
    def mean_of(arm, key):
        vals = [rep.summary(d).get(key) for d in rep.done(arm)]
        vals = [v for v in vals if isinstance(v, (int, float))]
        return sum(vals) / len(vals) if vals else None
    fa, fb = mean_of(a, "attention_flops_per_token"), mean_of(b, "attention_flops_per_token")
    ratio = f"{fa / fb:.2f}×" if fa and fb else "—"
    f = lambda v, d=0: "—" if v is None else f"{v:,.{d}f}"  # noqa: E731
    return [f(fa), f(fb), ratio, f(mean_of(a, "tokens_per_s")), f(mean_of(b, "tokens_per_s")),
            f(mean_of(a, "test_ms_per_example"), 3), f(mean_of(b, "test_ms_per_example"), 3),
            f(mean_of(a, "peak_mem_mb")), f(mean_of(b, "peak_mem_mb")), f(mean_of(a, "params")),
            f(mean_of(b, "params"))]
