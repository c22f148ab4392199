"""Pieces of the experiments' markdown reports: the header every table carries (date, CPU, code version, budget),
comparison tables from `stats compare`, the verdict rule against a claim, efficiency cells, the footer of commands."""
from __future__ import annotations

import datetime
import re

import lib


# The study's runs made before the queue recorded the CPU (2026-11-29) all ran on this machine, as every report of
# then named it.
UNRECORDED_CPU = "AMD EPYC, 2 cores"


def done_records(rep: lib.Report) -> list[tuple[str, dict]]:
    """(group, queue.json record) of each finished run; the group is the run id's first part (a task, an arm), within
    which the reports compare runs."""
    return [(r.id.split("/")[0], lib.run_json(rep.dir(r), "queue.json") or {}) for r in rep.runs
            if lib.state_of(rep.dir(r)) == "done"]


def cpu_text(records: list[tuple[str, dict]]) -> str:
    """The CPUs the finished runs ran on (the queue records one per run part), each with the groups of runs made on it
    when there are several."""
    by_cpu: dict[str, set] = {}
    for group, record in records:
        cpus = {p["cpu"] for p in record.get("parts", []) if p.get("cpu")} or {UNRECORDED_CPU}
        for c in cpus:
            by_cpu.setdefault(c, set()).add(group)
    if not by_cpu:
        return lib.cpu_model()
    if len(by_cpu) == 1:
        return next(iter(by_cpu))
    return "; ".join(f"{c} ({', '.join(sorted(g))})" for c, g in sorted(by_cpu.items()))


def version_text(records: list[tuple[str, dict]]) -> tuple[str, list[str]]:
    """The code versions of the finished runs, as text: one version, or each version with the groups of runs made
    with it — comparisons are made within a group, so a group of one version compares like with like; a group of
    several gets a warning. And the versions, sorted."""
    by_group: dict[str, set] = {}
    for group, record in records:
        by_group.setdefault(group, set()).add(record.get("code_version", "?"))
    versions = sorted(set().union(*by_group.values())) if by_group else []
    if len(versions) <= 1:
        return ", ".join(versions) or "—", versions
    mixed = [g for g, vs in by_group.items() if len(vs) > 1]
    parts = [f"{v} ({', '.join(g for g, vs in by_group.items() if v in vs)})" for v in versions]
    return ("; ".join(parts) + (f" — **runs of {', '.join(mixed)} from several code versions: rerun before drawing "
                                "conclusions**" if mixed else " (each group compared within itself)")), versions


def header(rep: lib.Report, title: str, budget_text: str) -> str:
    records = done_records(rep)
    text, versions = version_text(records)
    done = len(records)
    rep.fact("runs", "done", done)
    rep.fact("runs", "total", len(rep.runs))
    rep.fact("runs", "code_versions", [v[:7] for v in versions])
    cpu = cpu_text(records)
    return (f"# {title}\n\n"
            f"Scale **{rep.scale}**{' (a smoke test of the script: the numbers mean nothing)' if rep.scale == 'tiny' else ''}; "
            f"report written {datetime.date.today().isoformat()} from {done} of {len(rep.runs)} runs; "
            f"CPU of the runs: {cpu}; code version (last commit of the library and tools): {text}.\n\n"
            f"**Budget**: {budget_text}. Tasks are scaled down from the Long Range Arena to fit this machine; each "
            f"section names its task's size. Equal budget = the same number of training examples seen; wall time is "
            f"reported beside, not equalised.\n")


def repo_relative(command: str) -> str:
    """A recorded command with the absolute checkout prefix of its run's paths dropped (runs recorded before the
    queue wrote them relative named the checkout they ran in, which differs from this one)."""
    return re.sub(r"(?<!\S)/\S*?/(?=experiments/results/)", "", command.replace(str(lib.REPO) + "/", ""))


def footer(rep: lib.Report) -> str:
    example = next((lib.run_json(rep.dir(r), "queue.json") for r in rep.runs
                    if lib.state_of(rep.dir(r)) == "done"), None) or {}
    scale = "" if rep.scale == "full" else f" --scale {rep.scale}"
    return ("\n## How this was made\n\n```sh\n"
            f"python3 experiments/queue.py run {rep.exp.name}{scale}      # resumable; --budget-min N to stop in time\n"
            f"python3 experiments/queue.py report {rep.exp.name}{scale}\n"
            + (f"# one of its runs:\n{repo_relative(example['command'])}\n"
               if example.get("command") else "")
            + "```\n\nStatistics (docs/stats.md): mean ± sample std over seeds; 95 % percentile-bootstrap intervals "
            "(10 000 resamples, seed 0); paired bootstrap and approximate randomisation over test examples (each "
            "example's correctness averaged over a model's seeds); Cohen's d and Cliff's δ over seeds; MDE = the "
            "smallest difference detectable at α = 0.05 with power 0.8.\n")


# The tasks rerun after the study (2026-11-29), each with the reason: the first runs are in the repository's history.
RERUNS = {
    "text": "The study's first text task, the man pages by section, had 123 test examples, too few to resolve a few "
            "points; this task was rerun on Debian's fortunes by topic (1049 test texts). The man-page runs and their "
            "report are in the repository's history (commit 862a178).",
    "pathfinder": "At the study's first Pathfinder (Pathfinder-32 pooled to 16 × 16, 400 steps) no arm learnt the "
                  "task, so the comparison said nothing; this task was rerun at the difficulty and budget that "
                  "experiments/pathfinder_pilot.py chose by a rule fixed before its runs (pathfinder_pilot.md). The "
                  "first runs and their report are in the repository's history (commit 862a178).",
}


def rerun_note(task: str, scale: str) -> str:
    return f"{RERUNS[task]}\n\n" if scale == "full" and task in RERUNS else ""


pct, signed = lib.pct, lib.signed  # the reports' number formats, one definition (lib: the facts use them too)


def comparison_table(cmp: dict, a_name: str, b_name: str) -> str:
    def row(name, g):
        ci = g.get("ci") or {}
        return [name, g["n"], f"{pct(g['mean'])} ± {pct(g['std'])}" if g.get("std") is not None else pct(g["mean"]),
                pct(g.get("iqm")), f"[{pct(ci.get('low'))}, {pct(ci.get('high'))}]"]
    t = lib.md_table(["model", "seeds", "test accuracy % (mean ± std)", "IQM", "95 % CI of the mean"],
                     [row(a_name, cmp["group_a"]), row(b_name, cmp["group_b"])])
    lines = [t, ""]
    diff = f"{a_name} − {b_name}: **{pct(cmp['difference'])} points**"
    if "welch_t_test" in cmp:
        w, ci = cmp["welch_t_test"], cmp["difference_ci"]
        paired = cmp.get("seed_paired_t_test")
        diff += (f" (over seeds: Welch's t-test p {lib.fmt_p(w.get('p'))}, its 95 % interval "
                 f"[{pct(w.get('low'))}, {pct(w.get('high'))}], bootstrap interval [{pct(ci['low'])}, "
                 f"{pct(ci['high'])}]"
                 + (f"; the same seeds in both arms: seed-paired t-test p {lib.fmt_p(paired.get('p'))}" if paired
                    else "")
                 + f"; Cohen's d {_num(cmp.get('cohens_d'))}, Cliff's δ {_num(cmp.get('cliffs_delta'))}; MDE over "
                 f"seeds {pct(cmp.get('mde_seeds'))} points)")
    lines.append(diff + ".")
    if "paired_bootstrap" in cmp:
        pb, ar = cmp["paired_bootstrap"], cmp["approximate_randomization"]
        lines.append(f"Over the {cmp['test_examples']} test examples: paired bootstrap p = {lib.fmt_p(pb['p'])} "
                     f"(95 % CI [{pct(pb['low'])}, {pct(pb['high'])}]), approximate randomisation p = "
                     f"{lib.fmt_p(ar['p'])}; MDE at this test-set size {pct(cmp.get('mde_examples'))} points.")
    bl = cmp.get("baseline_learns")
    if bl:
        learns = bl.get("p") is not None and bl["p"] < 0.01
        lines.append(f"{b_name} {'learns' if learns else 'does **not** learn'} the task: "
                     f"{pct(bl['correct'] / bl['examples'])} % of the test examples against a majority-class rate of "
                     f"{pct(bl['majority_rate'])} % (one-sided binomial p {lib.fmt_p(bl.get('p'))}).")
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


class Family:
    """The comparisons of one experiment that test claims of one kind (one claim on several tasks, or each term of an
    ablation), judged together by the rules of docs/stats.md ("Verdicts on a claim"): the Welch p-values over seeds
    and the paired p-values over examples are each Holm-adjusted across the family, then `stats json`'s
    claim_verdict reads the intervals and the adjusted p-values.

        fam = Family(rep)
        fam.add(cmp, claim_points=0.8, label="listops: ASAM 37.2 vs Transformer 36.4 (+0.8)")
        lines = fam.lines()  # one markdown bullet per comparison, in the order added
    """

    def __init__(self, rep: lib.Report):
        self.rep = rep
        self.items = []  # (cmp or None, claim in points, direction, label, note, key)

    def add(self, cmp: dict | None, claim_points: float, label: str, direction: int = 0, note: str = "",
            key: str = ""):
        """key: the name other pages quote its figures by (default: the label). cmp None: a planned comparison whose
        runs are not finished — it counts in the family with p = 1 (Holm's adjustment of the others does not wait
        for it to shrink the family) and gets a line saying so."""
        self.items.append((cmp, claim_points, direction, label, note, key or label))

    def judge(self) -> list[dict]:
        """Per comparison: claim_verdict's answer and the adjusted p-values (None for a comparison without runs)."""
        if not self.items:
            return []
        welch = [(c.get("welch_t_test") or {}).get("p") if c else 1.0 for c, *_ in self.items]
        paired = [(c.get("paired_bootstrap") or {}).get("p") if c else 1.0 for c, *_ in self.items]
        adj_w, adj_p = self.rep.stats([{"op": "holm_adjust", "p": welch}, {"op": "holm_adjust", "p": paired}])
        requests = []
        for (c, claim, direction, *_), pw, pp in zip(self.items, adj_w, adj_p):
            if c is None:
                continue
            w, pb = c.get("welch_t_test") or {}, c.get("paired_bootstrap") or {}
            requests.append({"op": "claim_verdict", "claim": claim / 100, "direction": direction,
                             "difference": c.get("difference"),
                             "seeds": {"low": w.get("low"), "high": w.get("high")},
                             "examples": {"low": pb.get("low"), "high": pb.get("high")} if pb else None,
                             "p_seeds": pw, "p_examples": pp,
                             "baseline_learns_p": (c.get("baseline_learns") or {}).get("p")})
        answers = iter(self.rep.stats(requests) if requests else [])
        return [{**next(answers), "p_seeds_holm": pw, "p_examples_holm": pp} if c is not None else None
                for (c, *_), pw, pp in zip(self.items, adj_w, adj_p)]

    def lines(self) -> list[str]:
        m = len(self.items)
        out = []
        for (c, claim, direction, label, note, key), v in zip(self.items, self.judge()):
            if c is None:
                out.append(f"- **{label}** (claim) — no verdict yet: its runs are not finished (counted in Holm's "
                           f"family with p = 1).")
                continue
            self.rep.fact("verdicts", key, {"verdict": v["verdict"], "claim": f"{claim:+.1f}",
                                            **lib.comparison_facts(c),
                                            "p_seeds_holm": lib.fmt_p(v["p_seeds_holm"]),
                                            "p_examples_holm": lib.fmt_p(v["p_examples_holm"])})
            smaller = (" The difference is significant in the claimed direction, but smaller than claimed."
                       if v["verdict"] == "rejected" and v["significant_in_direction"] else "")
            out.append(f"- **{label}** (claim) — **{v['verdict']}**: {evidence_text(c, claim, direction, v, m)}."
                       + smaller + (f" {note}" if note else ""))
        return out


def evidence_text(c: dict, claim: float, direction: int, v: dict, family: int) -> str:
    """The numbers behind one verdict, in points."""
    w, pb, bl = c.get("welch_t_test") or {}, c.get("paired_bootstrap") or {}, c.get("baseline_learns") or {}
    if v["verdict"] == "not testable" and bl and bl.get("p") is not None and bl["p"] >= 0.01:
        return (f"the baseline does not learn the task ({pct(bl['correct'] / bl['examples'])} % of the test examples "
                f"against a majority-class rate of {pct(bl['majority_rate'])} %, binomial p "
                f"{lib.fmt_p(bl.get('p'))}); measured {signed(c.get('difference'))} points")
    if w.get("p") is None:
        return "needs at least 2 finished seeds per arm"
    claim_text = f"the claimed {claim:+.1f}" if claim else f"the claim ({'a loss' if direction < 0 else 'a gain'})"
    holm = f", Holm over {family}" if family > 1 else ""
    seeds = (f"seeds [{pct(w.get('low'))}, {pct(w.get('high'))}], Welch p {lib.fmt_p(w.get('p'))}"
             + (f" (adjusted {lib.fmt_p(v['p_seeds_holm'])})" if family > 1 else ""))
    examples = (f"examples [{pct(pb.get('low'))}, {pct(pb.get('high'))}], paired p {lib.fmt_p(pb.get('p'))}"
                + (f" (adjusted {lib.fmt_p(v['p_examples_holm'])})" if family > 1 else "")) if pb else ""
    paired = c.get("seed_paired_t_test")
    extra = f"; seed-paired t-test p {lib.fmt_p(paired.get('p'))}" if paired else ""
    mdes = [m for m in (c.get("mde_seeds"), c.get("mde_examples")) if m is not None]
    mde = f"; MDE {pct(max(mdes), 1)} points" if mdes else ""
    return (f"measured {signed(c.get('difference'))} points against {claim_text} (95 % intervals: "
            f"{seeds}{'; ' + examples if examples else ''}{holm}{extra}{mde})")


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
