"""Experiment 3: interpretability (seed 001's RQ3, Table 4). On the grouping task, whose tokens come from latent groups
that are known, cluster each example's tokens by k-means (k = the number of groups in it) on the rows of each head's
attention matrix A and on ASCender's latent z; NMI and ARI of the clusters against the true groups, their silhouette and
Calinski-Harabasz (train --cluster-metrics). ASCender vs dense vs ASCender without each term; Fig. 1: decomposition maps
of test examples 0 and 1 (the rule: the first two of the test split, not chosen for their look).

    python3 experiments/queue.py run e3_interpretability && python3 experiments/queue.py report e3_interpretability
"""
import budget
import lib
import report_util as ru

SEEDS = {"full": 3, "quick": 2, "tiny": 1}
STEPS = {"full": 1500, "quick": 200, "tiny": 3}
EXAMPLES = {"full": 300, "quick": 100, "tiny": 8}
DATA = {"full": ["--train-size", "8000", "--val-size", "1000", "--test-size", "1000"],
        "quick": ["--train-size", "4000", "--val-size", "500", "--test-size", "500"],
        "tiny": ["--train-size", "64", "--val-size", "16", "--test-size", "16"]}
ARMS = {
    "ascender": ["--model", "ascender"],
    "dense": ["--model", "dense"],
    "ascender-no-align": ["--model", "ascender", "--use-align", "0"],
    "ascender-no-sep": ["--model", "ascender", "--use-sep", "0"],
    "ascender-no-coh": ["--model", "ascender", "--use-coh", "0"],
}
TINY = ["ascender", "dense"]


def flags(name, scale):
    n = STEPS[scale]
    extra = ["--cluster-metrics", str(EXAMPLES[scale])]
    if name == "ascender":
        extra += ["--dump-decomposition", "0,1"]
    return ["--task", "grouping", *DATA[scale], *ARMS[name], *budget.MODEL, *budget.OPTIM, "--positional", "rope",
            "--steps", str(n), "--warmup", str(max(1, n // 10)), *extra]


def runs(scale):
    names = TINY if scale == "tiny" else list(ARMS)
    asc = flags("ascender", scale)
    out = []
    for name in names:
        f = flags(name, scale)
        if name == "dense":  # widened to ASCender's parameter count
            f = budget.match_params(f, budget.params_of([a for a in asc if a not in ("--dump-decomposition", "0,1")]))
        # Fig. 1 draws ASCender's dumps: git keeps them as files beside the tables
        keep = [f"dumps/decomposition_{i}.safetensors" for i in (0, 1)] if name == "ascender" else []
        for seed in range(SEEDS[scale]):
            out.append(lib.Run(id=f"{name}/s{seed}", arm=name, seed=seed, args=f, steps=STEPS[scale],
                               cost=0.05 if name == "dense" else 0.12, keep=keep))
    return out


def report(rep: lib.Report) -> str:
    scale = rep.scale
    parts = [ru.header(rep, "Experiment 3 — do attention clusters match the true groups? (seed 001, RQ3)",
                       f"grouping task (4 latent groups, 64 tokens per sequence mixing 2–3 groups, vocab 64; "
                       f"{' '.join(DATA[scale])}), {STEPS[scale]} steps of batch 32, {SEEDS[scale]} seeds per arm, "
                       f"RoPE; clusters scored on the first {EXAMPLES[scale]} test examples")]
    rows = []
    for name in rep.arms():
        per_seed = {"A": {}, "z": {}}
        acc = []
        for d in rep.done(name):
            acc.append(rep.summary(d).get("test_accuracy"))
            cm = lib.run_json(d, "cluster_metrics.json") or {}
            for space, v in (cm.get("spaces") or {}).items():
                mean = v["mean_over_heads"]
                best = max((h for layer in v["layers"] for h in layer), key=lambda h: h.get("nmi") or -1)
                for key, val in (("nmi", mean["nmi"]), ("ari", mean["ari"]), ("best_nmi", best["nmi"]),
                                 ("silhouette", mean["silhouette"]), ("ch", mean["calinski_harabasz"])):
                    if val is not None:
                        per_seed[space].setdefault(key, []).append(val)
        for space in ("A", "z"):
            m = per_seed[space]
            if not m:
                continue
            rows.append([name, "attention rows" if space == "A" else "latent z", len(rep.done(name)),
                         lib.fmt_mean_std([a for a in acc if a is not None]) if space == "A" else "",
                         lib.fmt_mean_std(m.get("nmi", []), 3, 1), lib.fmt_mean_std(m.get("best_nmi", []), 3, 1),
                         lib.fmt_mean_std(m.get("ari", []), 3, 1), lib.fmt_mean_std(m.get("silhouette", []), 3, 1),
                         lib.fmt_mean_std(m.get("ch", []), 1, 1)])
    parts.append(lib.md_table(["arm", "space", "seeds", "test accuracy %", "NMI (mean over heads)", "NMI (best head)",
                               "ARI", "silhouette", "Calinski–Harabasz"], rows) + "\n")
    parts.append("NMI / ARI: 0 = no relation to the true groups, 1 = the true partition. Means over heads and layers "
                 "per seed, then mean ± std over seeds; \"best head\" takes each seed's head with the highest NMI.\n")
    verdicts = []
    for a, b in (("ascender", "dense"),):
        vals = {arm: [] for arm in (a, b)}
        for arm in (a, b):
            for d in rep.done(arm):
                cm = lib.run_json(d, "cluster_metrics.json") or {}
                nmi = ((cm.get("spaces") or {}).get("A") or {}).get("mean_over_heads", {}).get("nmi")
                if nmi is not None:
                    vals[arm].append(nmi)
        if len(vals[a]) >= 2 and len(vals[b]) >= 2:
            ci, d, delta = rep.stats([{"op": "bootstrap_difference_ci", "a": vals[a], "b": vals[b]},
                                      {"op": "cohens_d", "a": vals[a], "b": vals[b]},
                                      {"op": "cliffs_delta", "a": vals[a], "b": vals[b]}])
            welch = rep.stats([{"op": "welch_t_test", "a": vals[a], "b": vals[b]}])[0]
            parts.append(f"NMI of the attention rows, {a} − {b}: {ci['estimate']:+.3f} (95 % CI over seeds "
                         f"[{ci['low']:+.3f}, {ci['high']:+.3f}]; Welch's t-test p {lib.fmt_p(welch['p'])}; "
                         f"Cohen's d {d:.2f}, Cliff's δ {delta:.2f}).\n")
            holds = ci["low"] > 0 and welch["p"] is not None and welch["p"] < 0.05
            mean = {arm: sum(v) / len(v) for arm, v in vals.items()}
            rep.fact("nmi", f"{a} vs {b}", {"a": f"{mean[a]:.3f}", "b": f"{mean[b]:.3f}", "difference":
                                            f"{ci['estimate']:+.3f}", "welch_p": lib.fmt_p(welch["p"]),
                                            "verdict": "holds" if holds else "not shown"})
            verdicts.append(f"- **ASCender's attention clusters match the true groups better than dense attention's** "
                            f"(seed 001, RQ3) — {'holds' if holds else 'not shown'}: NMI {ci['estimate']:+.3f} "
                            f"(95 % CI [{ci['low']:+.3f}, {ci['high']:+.3f}], Welch p {lib.fmt_p(welch['p'])}).")
    parts.append("## Verdicts\n\n" + ("\n".join(verdicts) if verdicts else "_none yet_") + "\n")
    first = rep.done("ascender")[:1]
    for i in (0, 1):
        dump = first[0] / "dumps" / f"decomposition_{i}.safetensors" if first else None
        fig, note = None, ""
        if dump and dump.exists():
            fig = rep.plot("decomposition", [dump], f"decomposition_{i}")
        elif first:  # the study's runs predate kept dumps: the figure their machine drew
            fig, note = rep.kept_figure(f"decomposition_{i}"), " (drawn on the machine that ran the study)"
        if fig:
            parts.append(f"Fig. 1, test example {i}, ASCender seed 0, layer 0, head 0{note}: "
                         f"![decomposition]({fig})\n")
    parts.append(ru.footer(rep))
    return "\n".join(parts)


EXPERIMENT = lib.Experiment(name="e3_interpretability", title="attention clusters vs true groups (grouping task)",
                            runs=runs, report=report)
