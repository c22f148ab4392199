#!/usr/bin/env python3
"""The figures README.md and docs/ quote from the experiments' reports, checked against the reports themselves, so
that text cannot drift from what was measured.

Each report of `experiments/queue.py report` writes `bench/results/experiments/<name>.json` beside `<name>.md`: the
figures other pages may quote, formatted as the report prints them (report_util / lib.comparison_facts). Every quote
below is a template whose {e5|verdicts|listops|verdict} fields are filled from those files; the filled sentence must
appear in the page (white space, line breaks included, counted as one space). docs/results.md must be exactly what
the reports give (queue.results_page_text). And a paragraph of a checked page that names a verdict and a figure must
hold a checked quote: a new sentence quoting the study without a template here fails.

    python3 tests/doc_quotes_test.py          (ctest: doc_quotes; standard library only, no build needed)
"""
import importlib.util
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "experiments"))
# experiments/queue.py by its path (the name `queue` is the standard library's)
_spec = importlib.util.spec_from_file_location("workbench_queue", REPO / "experiments" / "queue.py")
workbench_queue = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workbench_queue)

RESULTS = REPO / "bench" / "results" / "experiments"
SOURCES = {  # alias -> the facts file
    "e1": RESULTS / "e1_ascender_dense.json", "e2": RESULTS / "e2_ablations.json",
    "e3": RESULTS / "e3_interpretability.json", "e4": RESULTS / "e4_pareto_length.json",
    "e5": RESULTS / "e5_asam.json", "e6": RESULTS / "e6_firing.json", "e7": RESULTS / "e7_rule_b_rates.json",
    # README command (1)'s committed run
    "quick": REPO / "bench" / "results" / "2026-11-29_quick_experiment" / "e1_ascender_dense.json",
}

QUOTES = {
    "README.md": [
        "ASCender's claimed gain of up to {e1|verdicts|listops|claim} points over dense attention is "
        "**{e1|verdicts|listops|verdict}** on ListOps, images and text (measured {e1|verdicts|listops|difference}, "
        "{e1|verdicts|image|difference} and {e1|verdicts|text|difference} points), at {e1|flops_ratio|range}× the "
        "attention FLOPs",
        "({e6|arms|ste|mean_1} %; an MLP {e6|arms|mlp|mean_1} %)",
        "({e6|arms|rule-b|mean_1} % at the rates of then), and rule A stays at chance ({e6|arms|rule-a|mean_1} %)",
        "ASAM's claimed gain over dense attention is **{e5|verdicts|listops|verdict}** on ListOps "
        "({e5|verdicts|listops|difference} points) and text ({e5|verdicts|text|difference} points) and "
        "**{e5|verdicts|image|verdict}** on images, but **{e5|verdicts|pathfinder|verdict}** on Pathfinder, rerun at a "
        "difficulty the baseline learns ({e5|verdicts|pathfinder|difference} points: {e5|verdicts|pathfinder|a_mean} % "
        "against {e5|verdicts|pathfinder|b_mean} %, where the claim is {e5|verdicts|pathfinder|claim};",
        "ASAM trains at {e5|speed|range}× dense attention's speed",
        "(here **{quick|verdicts|image|verdict}**: {quick|verdicts|image|difference} points, paired p "
        "{quick|verdicts|image|paired_p}, with intervals too wide at two seeds to exclude the claimed "
        "{quick|verdicts|image|claim} — the MDE is {quick|verdicts|image|mde} points;",
        "ASCender {quick|verdicts|image|a_mean} ± {quick|verdicts|image|a_std} %, dense {quick|verdicts|image|b_mean} ± "
        "{quick|verdicts|image|b_std} %",
    ],
    "docs/status.md": [
        "ASCender's claimed gain of up to {e1|verdicts|listops|claim} points over dense attention is "
        "**{e1|verdicts|listops|verdict}** on every task — ListOps {e1|verdicts|listops|a_mean} % against "
        "{e1|verdicts|listops|b_mean} % ({e1|verdicts|listops|difference}; significant over the test examples, paired p "
        "{e1|verdicts|listops|paired_p}, but not over seeds once Holm's correction is applied, adjusted Welch p "
        "{e1|verdicts|listops|p_seeds_holm}), images {e1|verdicts|image|difference}, text {e1|verdicts|text|difference} "
        "(rerun on the fortunes task: {e1|verdicts|text|test_examples} test texts, where the man pages had 123) — at "
        "{e1|flops_ratio|range}× the attention FLOPs",
        "removing a term does not lower accuracy detectably (all four **{e2|verdicts|no-align|verdict}**;",
        "ALiBi instead of RoPE {e2|comparisons|pos-alibi vs full|difference}, learned absolute positions "
        "{e2|comparisons|pos-learned vs full|difference}",
        "NMI {e3|nmi|ascender vs dense|a} against {e3|nmi|ascender vs dense|b} (Welch p "
        "{e3|nmi|ascender vs dense|welch_p}: {e3|nmi|ascender vs dense|verdict})",
        "({e4|length|ascender|train} → {e4|length|ascender|longest} % at {e4|length|ascender|longest_bucket} tokens; "
        "dense {e4|length|dense|train} → {e4|length|dense|longest} %)",
        "ListOps {e5|verdicts|listops|a_mean} % against dense {e5|verdicts|listops|b_mean} %, the claimed "
        "{e5|verdicts|listops|claim} **{e5|verdicts|listops|verdict}**; text (rerun on the fortunes) "
        "{e5|verdicts|text|a_mean} % against {e5|verdicts|text|b_mean} %, **{e5|verdicts|text|verdict}** too; images "
        "({e5|verdicts|image|difference}) **{e5|verdicts|image|verdict}**;",
        "{e5|verdicts|pathfinder|a_mean} % against {e5|verdicts|pathfinder|b_mean} %: the claimed "
        "{e5|verdicts|pathfinder|claim} **{e5|verdicts|pathfinder|verdict}**, and ASAM's gain there is larger "
        "({e5|verdicts|pathfinder|difference} points, intervals {e5|verdicts|pathfinder|seeds_interval} over seeds and "
        "{e5|verdicts|pathfinder|examples_interval} over the test examples);",
        "each part of the seed's ablation **{e5|verdicts|no-clustered|verdict}**; ASAM trains at {e5|speed|range}× dense "
        "attention's speed",
        "backprop through the gate {e6|arms|ste|mean_1} %, an MLP {e6|arms|mlp|mean_1} %, rule B "
        "{e6|arms|rule-b|mean_1} %",
        "rule A {e6|arms|rule-a|mean_1} % (chance)",
        "moved rule B's default Oja rate to {e7|choice|chosen|eta}:",
        "its paired test alone measures {e7|choice|chosen|difference} points (paired p {e7|choice|chosen|paired_p})",
        "experiments 1, 2, 4, 5 and 6 at {e1|runs|code_versions|0} (the reruns of text at {e1|runs|code_versions|1}, of "
        "Pathfinder at {e5|runs|code_versions|1}), experiment 3 at {e3|runs|code_versions|0}, experiment 7 at "
        "{e7|runs|code_versions|0}",
    ],
    "docs/asam.md": [
        "ListOps {e5|verdicts|listops|a_mean} ± {e5|verdicts|listops|a_std} % vs {e5|verdicts|listops|b_mean} ± "
        "{e5|verdicts|listops|b_std} % ({e5|verdicts|listops|difference} points): the claimed "
        "{e5|verdicts|listops|claim} is **{e5|verdicts|listops|verdict}** (both 95 % intervals, "
        "{e5|verdicts|listops|seeds_interval} over seeds and {e5|verdicts|listops|examples_interval} over the test "
        "examples, end below it). Text (Debian's fortunes by topic, {e5|verdicts|text|test_examples} test texts) "
        "{e5|verdicts|text|a_mean} % vs {e5|verdicts|text|b_mean} % ({e5|verdicts|text|difference} points): "
        "**{e5|verdicts|text|verdict}** as well. Images {e5|verdicts|image|difference} are **{e5|verdicts|image|verdict}** (paired p "
        "{e5|verdicts|image|paired_p} over the test examples, Welch p {e5|verdicts|image|welch_p} over seeds; MDE "
        "{e5|verdicts|image|mde} points)",
        "Pathfinder (drawn at 12 × 12, solid 3-step paths and one distractor, 4500 steps: the difficulty and budget at "
        "which a pilot with rules fixed before its runs found dense attention learning it) "
        "{e5|verdicts|pathfinder|a_mean} ± {e5|verdicts|pathfinder|a_std} % vs {e5|verdicts|pathfinder|b_mean} ± "
        "{e5|verdicts|pathfinder|b_std} % ({e5|verdicts|pathfinder|difference} points): the claimed "
        "{e5|verdicts|pathfinder|claim} **{e5|verdicts|pathfinder|verdict}**, the gain larger than claimed (95 % "
        "intervals {e5|verdicts|pathfinder|seeds_interval} over seeds and {e5|verdicts|pathfinder|examples_interval} "
        "over the test examples; Welch p {e5|verdicts|pathfinder|welch_p}, paired p {e5|verdicts|pathfinder|paired_p}, "
        "both significant after Holm's correction across the four tasks).",
        "On images the window alone ({e5|arms|image/window|mean} %) beats both.",
        "On Pathfinder the window alone reaches {e5|arms|pathfinder/window|mean} %, most of the way from dense "
        "attention's {e5|verdicts|pathfinder|b_mean} % to ASAM's {e5|verdicts|pathfinder|a_mean} %: most of the gain "
        "there is the local pattern's.",
        "each claimed gain (1.4–3.7 points) is **{e5|verdicts|no-hierarchical|verdict}**",
        "ASAM trains at {e5|speed|range}× dense attention's speed at 128–256 tokens",
    ],
    "docs/ascender.md": [
        "the claimed gain of up to {e1|verdicts|listops|claim} points is **{e1|verdicts|listops|verdict}** on every "
        "task. ListOps at 128–256 tokens {e1|verdicts|listops|a_mean} ± {e1|verdicts|listops|a_std} % against "
        "{e1|verdicts|listops|b_mean} ± {e1|verdicts|listops|b_std} % ({e1|verdicts|listops|difference} points: "
        "significant over the test examples, paired p {e1|verdicts|listops|paired_p}, but not over seeds once Holm's "
        "correction across the three tasks is applied, adjusted Welch p {e1|verdicts|listops|p_seeds_holm}; both 95 % "
        "intervals, {e1|verdicts|listops|seeds_interval} and {e1|verdicts|listops|examples_interval}, end far below "
        "{e1|verdicts|listops|claim}); Fashion-MNIST as pixel sequences {e1|verdicts|image|difference}; text (Debian's "
        "fortunes by topic, {e1|verdicts|text|test_examples} test texts) {e1|verdicts|text|a_mean} % against "
        "{e1|verdicts|text|b_mean} % ({e1|verdicts|text|difference} points; intervals "
        "{e1|verdicts|text|seeds_interval} over seeds and {e1|verdicts|text|examples_interval} over the test examples)",
        "Its attention costs {e1|flops_ratio|range}× dense attention's FLOPs",
        "no term's contribution is detected (the four claims **{e2|verdicts|no-sep|verdict}**)",
        "512–1024 ({e4|length|ascender|train} → {e4|length|ascender|longest} %; dense {e4|length|dense|train} → "
        "{e4|length|dense|longest} %); beyond the training lengths it is below dense attention (256-512: "
        "{e4|verdicts|256-512|difference} points, **{e4|verdicts|256-512|verdict}** over seeds; at 512-1024 dense "
        "attention itself is at the majority-class rate, so that comparison is **{e4|verdicts|512-1024|verdict}**)",
        "(ListOps: paired p {e4|comparisons|listops/ascender vs listops/dense|paired_p}, Welch p "
        "{e4|comparisons|listops/ascender vs listops/dense|welch_p}, adjusted {e4|pareto|listops|welch_holm})",
    ],
    "docs/firing.md": [
        "{e6|arms|rule-b|mean_1} ± 9.5 % test accuracy against {e6|arms|ste|mean_1} ± 1.0 %",
        "reaches {e7|arms|oja0|mean} / {e7|arms|oja1e-6|mean} / {e7|arms|oja1e-5|mean} / {e7|arms|oja1e-4|mean} / "
        "{e7|arms|oja1e-3|mean} % (backprop alone {e7|arms|ste|mean} %)",
        "1e-6, which became the default in place of 1e-3. That is not \"no harm\": its paired test alone measures "
        "{e7|choice|chosen|difference} points (paired p {e7|choice|chosen|paired_p}, Welch p "
        "{e7|choice|chosen|welch_p}).",
    ],
}
# Words that mark a sentence as quoting a verdict; a paragraph of a checked page with one of them and a figure must
# hold a checked quote.
VERDICT_WORDS = re.compile(r"\*\*(rejected|inconclusive|not testable|smaller than claimed|holds)\*\*")


def load_facts() -> dict:
    facts = {}
    for alias, path in SOURCES.items():
        if not path.exists():
            raise SystemExit(f"doc_quotes: {path.relative_to(REPO)} is missing: run python3 experiments/queue.py "
                             "report (or README command (1) for the quick run) and commit it")
        facts[alias] = json.loads(path.read_text())
    return facts


def lookup(facts: dict, field: str):
    alias, *keys = field.split("|")
    value = facts[alias]
    for k in keys:
        value = value[int(k)] if isinstance(value, list) else value[k]
    return value


def fill(template: str, facts: dict) -> str:
    def one(m):
        try:
            return str(lookup(facts, m.group(1)))
        except (KeyError, IndexError, ValueError) as e:
            raise SystemExit(f"doc_quotes: no figure {m.group(1)} in the reports ({e!r})")
    return re.sub(r"\{([a-z0-9]+\|[^{}]+)\}", one, template)


def norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def main() -> int:
    facts = load_facts()
    failures = []
    for page, templates in QUOTES.items():
        text = norm((REPO / page).read_text())
        covered = []
        for template in templates:
            quote = norm(fill(template, facts))
            at = text.find(quote)
            if at < 0:
                failures.append(f"{page}: does not say what the reports say:\n    expected: {quote}")
            else:
                covered.append((at, at + len(quote)))
        # every paragraph that quotes a verdict with a figure holds a checked quote
        offset = 0
        for para in re.split(r"\n\s*\n", (REPO / page).read_text()):
            p = norm(para)
            start = text.find(p, offset)
            if start >= 0:
                offset = start + len(p)
            if VERDICT_WORDS.search(p) and re.search(r"\d", p) and not any(
                    a < start + len(p) and b > start for a, b in covered):
                failures.append(f"{page}: a paragraph quotes a verdict but no quote of this test checks it: "
                                f"{p[:160]}...")
    out_dir = RESULTS
    exps = workbench_queue.load([])
    expected = workbench_queue.results_page_text(exps, out_dir)
    if (REPO / "docs" / "results.md").read_text() != expected:
        failures.append("docs/results.md differs from the reports' verdicts: run python3 experiments/queue.py report")
    for f in failures:
        print("FAIL", f)
    n = sum(len(t) for t in QUOTES.values())
    if failures:
        print(f"doc_quotes: {len(failures)} failure(s)")
        return 1
    print(f"doc_quotes: {n} quotes in {len(QUOTES)} pages match the reports; docs/results.md is the reports' verdicts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
