"""Experiment 5: ASAM (seed 004) on LRA-style tasks — ListOps, Text, Image, Pathfinder — against dense attention, the
local window alone and window + global tokens (Longformer-style), equal size; and the seed's ablation from its full
model (window + global + random + clustered + hierarchical patterns with the adaptive gate): without the adaptive gate
(a fixed gate of 0.5), without the clustered pattern, without the hierarchical one.

Seed 004's claims (LRA, full scale): ListOps 37.2 vs 36.4 (standard Transformer), Text 65.1 vs 64.3, Image 43.1 vs
42.2, Pathfinder 74.2 vs 73.8; speed-ups 2.1–4.8×; ablation on ListOps: − adaptive gate 35.8, − clustered 34.1,
− hierarchical 33.5.

    python3 experiments/queue.py run e5_asam && python3 experiments/queue.py report e5_asam
"""
import budget
import lib
import report_util as ru

TASKS = {"full": ["listops", "text", "image", "pathfinder"], "quick": ["listops"], "tiny": ["listops"]}
SEEDS = {"full": 5, "quick": 2, "tiny": 1}
STEPS = {"full": 400, "quick": 100, "tiny": 3}
# The ablation's variants and the robustness evaluations use fewer seeds than the main table: ASAM's training step costs
# 4-6x dense attention's on this machine (its dense branch and five sparse patterns all run), and a 600-step, 5-seed
# plan measured 8 hours for this experiment alone.
SIDE_SEEDS = {"full": 3, "quick": 2, "tiny": 1}


# Pathfinder's own budget at full scale: the scene the pilot chose is learnt by dense attention in 4500 steps (the
# steps ASAM, the slowest arm, takes in 12 minutes there; experiments/pathfinder_pilot.py), not in 400.
TASK_STEPS = {("pathfinder", "full"): 4500}


def steps_of(task, scale):
    return TASK_STEPS.get((task, scale), STEPS[scale])


def eval_every(scale, task=None):
    """Validation 4 times per run, on at most 16 batches (512 examples), for the best checkpoint; the test split is
    always whole."""
    return max(1, (steps_of(task, scale) if task else STEPS[scale]) // 4)
FULL_PATTERNS = "window,global,random,clustered,hierarchical"
ARMS = ["asam", "dense", "window", "window-global"]
ABLATIONS = {  # on ListOps, from the full model: (options, table row, seed 004's accuracy without it, what is removed)
    "no-adaptive-gate": (["--fixed-gate", "0.5"], "− adaptive gate (fixed at 0.5)", 35.8, "the adaptive gate"),
    "no-clustered": (["--asam-patterns", "window,global,random,hierarchical"], "− clustered", 34.1,
                     "the clustered pattern"),
    "no-hierarchical": (["--asam-patterns", "window,global,random,clustered"], "− hierarchical", 33.5,
                        "the hierarchical pattern"),
}
ROBUST_ARMS = ["asam", "dense", "window"]
ROBUST_MAX_LEN = {"full": {"asam": 16384, "dense": 4096, "window": 16384},
                  "quick": {"asam": 2048, "dense": 1024, "window": 2048},
                  "tiny": {"asam": 64, "dense": 64, "window": 64}}
ROBUST_EXAMPLES = {"full": "500", "quick": "200", "tiny": "8"}
# The seed's robustness rows: NaN rate 0 %, float32 vs float64 < 1e-6, lengths to 16384, output correlation 0.94 at
# 10 % input noise, relative change 0.12 under an eps = 0.01 adversarial perturbation.
CLAIMS = {"listops": (37.2, 36.4), "text": (65.1, 64.3), "image": (43.1, 42.2), "pathfinder": (74.2, 73.8)}
SPEED_CLAIM = (2.1, 4.8)  # seed 004's speed-ups over the standard Transformer (LRA lengths)


def flags(task, model, scale, extra=()):
    f = budget.train_flags(task, model, scale, ["--positional", "learned", "--asam-patterns", FULL_PATTERNS,
                                                "--asam-window", "32", "--on-nonfinite", "skip"])
    for name, value in zip(extra[::2], extra[1::2]):  # the ablation's options replace the full model's
        f = budget.set_flag(f, name, value)
    f = budget.set_flag(f, "--steps", steps_of(task, scale))
    f = budget.set_flag(f, "--eval-every", eval_every(scale, task))
    f = budget.set_flag(f, "--eval-batches", 16)
    return budget.set_flag(f, "--warmup", max(1, steps_of(task, scale) // 10))


def runs(scale):
    """ListOps first, whole (its four arms, then the robustness evaluations of its models and the ablation), then the
    other tasks' arms: a study stopped early still answers every question on one task."""
    first = TASKS[scale][0]
    out = arms(first, scale)
    # The robustness table: each trained ListOps model re-evaluated under noise and FGSM, its first attention layer
    # in float32 vs float64 and at every power of two up to 16384 tokens (dense: 4096, its n² memory).
    for model in ROBUST_ARMS:
        for seed in range(SIDE_SEEDS[scale]):
            src = f"e5_asam/{first}/{model}/s{seed}"
            out.append(lib.Run(id=f"{first}/robust-{model}/s{seed}", arm=f"{first}/robust-{model}", seed=seed,
                               args=["--eval-only", f"{{root}}/{src}/best.safetensors", "--robustness", "1",
                                     "--robustness-max-len", str(ROBUST_MAX_LEN[scale][model]),
                                     "--robustness-examples", ROBUST_EXAMPLES[scale], "--progress", "none"],
                               steps=0, needs=[f"{src}/best.safetensors", f"{src}/summary.json"]))
    for name, (extra, *_) in (ABLATIONS.items() if scale != "tiny" else list(ABLATIONS.items())[:1]):
        for seed in range(SIDE_SEEDS[scale]):
            out.append(lib.Run(id=f"{first}/{name}/s{seed}", arm=f"{first}/{name}", seed=seed,
                               args=flags(first, "asam", scale, extra), steps=STEPS[scale],
                               cost=budget.cost(first, "asam", scale)))
    for task in TASKS[scale][1:]:
        out += arms(task, scale)
    return out


def arm_flags(task, scale) -> dict[str, list]:
    """The main table's models on one task: ASAM, dense attention widened to ASAM's parameter count, the window alone
    and window + global (also what experiments/gpu_e5.sh runs on a GPU)."""
    asam = flags(task, "asam", scale)
    return {"asam": asam, "dense": budget.match_params(flags(task, "dense", scale), budget.params_of(asam)),
            "window": flags(task, "window", scale), "window-global": flags(task, "window-global", scale)}


def write_arm_flags(directory, task="listops", scale="full", names=("asam", "dense")):
    """flags_<arm>.txt in `directory`: each arm's train flags on one line, for the prepared GPU runs
    (experiments/gpu_e5.sh, tools/gpu_bench.sh)."""
    arms_ = arm_flags(task, scale)
    for name in names:
        lib.write_atomic(f"{directory}/flags_{name}.txt", " ".join(map(str, arms_[name])) + "\n")


def arms(task, scale):
    """The main table's runs on one task (arm_flags), SEEDS[scale] seeds each."""
    arm_flags_ = arm_flags(task, scale)
    # The robustness runs evaluate the first task's models: git keeps each as a file, with the config.json that
    # train --eval-only builds the model from.
    keep = task == TASKS[scale][0]
    return [lib.Run(id=f"{task}/{model}/s{seed}", arm=f"{task}/{model}", seed=seed, args=arm_flags_[model],
                    steps=steps_of(task, scale), cost=budget.cost(task, model, scale),
                    keep=["best.safetensors", "config.json"]
                    if keep and model in ROBUST_ARMS and seed < SIDE_SEEDS[scale] else [])
            for model in ARMS for seed in range(SEEDS[scale])]


def report(rep: lib.Report) -> str:
    scale = rep.scale
    parts = [ru.header(rep, "Experiment 5 — ASAM on LRA-style tasks (seed 004)",
                       f"{STEPS[scale]} steps of batch 32 per run"
                       + "".join(f" ({t}: {n})" for (t, s), n in TASK_STEPS.items() if s == scale and t in TASKS[scale])
                       + f", {SEEDS[scale]} seeds per arm of the main table and "
                       f"{SIDE_SEEDS[scale]} per ablation variant and robustness evaluation (seeds 0 to "
                       f"{SIDE_SEEDS[scale] - 1}), validation 4 times per run on at most 512 "
                       f"examples (the best checkpoint), the test split whole; learned positions "
                       f"(ASAM's sparse kernels take no RoPE); ASAM = {FULL_PATTERNS} (window 32) with the adaptive "
                       f"gate; dense widened to ASAM's parameter count; {' '.join(budget.MODEL)}")]
    rows, verdicts = [], []
    family = ru.Family(rep)  # ASAM against dense on every task: Holm-adjusted together
    for task in TASKS[scale]:
        cells = [budget.TASKS[task]["what"]]
        for model in ARMS:
            acc = [rep.summary(d).get("test_accuracy") for d in rep.done(f"{task}/{model}")]
            cells.append(lib.fmt_mean_std([a for a in acc if a is not None]))
        for model in ("dense", "window"):
            tps = [rep.summary(d).get("tokens_per_s") for d in rep.done(f"{task}/{model}")]
            tps_asam = [rep.summary(d).get("tokens_per_s") for d in rep.done(f"{task}/asam")]
            cells.append(f"{(sum(tps_asam) / len(tps_asam)) / (sum(tps) / len(tps)):.2f}×" if tps and tps_asam
                         else "—")
        rows.append(cells)
        cmp = rep.compare_seeds(f"{task}/asam", f"{task}/dense")
        claimed = CLAIMS[task][0] - CLAIMS[task][1]
        label = f"{task}: ASAM {CLAIMS[task][0]} vs Transformer {CLAIMS[task][1]} (+{claimed:.1f})"
        parts.append(f"### {task}: ASAM vs dense\n\n{ru.rerun_note(task, scale)}"
                     + (f"{ru.comparison_table(cmp, 'asam', 'dense')}\n" if cmp else "_no finished runs yet_\n"))
        family.add(cmp, claimed, label, key=task)
    table = lib.md_table(["task", "ASAM", "dense", "window", "window + global", "ASAM speed / dense",
                          "ASAM speed / window"], rows)
    parts.insert(1, "## Test accuracy % (mean ± std over seeds) and training speed (tokens/s ratio)\n\n" + table + "\n")
    verdicts += family.lines()
    task = TASKS[scale][0]
    ab_rows, ablation = [], ru.Family(rep)  # the three parts of the ablation: a family of their own
    for name, (_, what, claimed, removed) in ABLATIONS.items():
        cmp = rep.compare_seeds(f"{task}/asam", f"{task}/{name}")  # full − variant: the claim is a gain of full
        if cmp is None:
            continue
        variant = cmp["group_b"]
        ab_rows.append([what, f"{ru.pct(variant['mean'])} ± {ru.pct(variant.get('std'))}",
                        f"{-100 * cmp['difference']:+.2f}", lib.fmt_p((cmp.get('paired_bootstrap') or {}).get('p')),
                        f"{claimed - CLAIMS['listops'][0]:+.1f}"])
        gain = CLAIMS["listops"][0] - claimed
        label = (f"{task}: {removed} adds {gain:.1f} points to the full model (seed 004: {CLAIMS['listops'][0]} "
                 f"with it, {claimed} without)")
        ablation.add(cmp, gain, label, key=name)
    verdicts += ablation.lines()
    if ab_rows:
        parts.append(f"## Ablation on {task}, from the full model\n\n"
                     + lib.md_table(["variant", "test accuracy %", "Δ vs full (points)", "paired p",
                                     "seed's Δ (LRA ListOps)"], ab_rows) + "\n")
    verdicts += [v for v in (speed_verdict(rep, t) for t in TASKS[scale]) if v]
    speeds = rep.facts.get("speed", {}).values()
    if speeds:
        rep.fact("speed", "range", f"{min((s['low'] for s in speeds), key=float)}–"
                                    f"{max((s['high'] for s in speeds), key=float)}")
    section, robust_verdicts = robustness_section(rep, task)
    parts.append(section)
    verdicts += robust_verdicts
    parts.append("## Verdicts\n\n" + ("\n".join(verdicts) if verdicts else "_none yet_") + "\n")
    parts.append("A speed ratio below 1 means ASAM trains slower than dense attention at the task's length (its dense "
                 "branch always runs while the gate is learned); the seed's speed-ups are at LRA lengths (1K-16K "
                 "tokens), longer than these tasks: `bench_asam` measures the layers alone at those lengths.\n")
    if (lib.REPO / "bench" / "results" / "experiments" / "e5_gpu.md").exists():
        parts.append("On a GPU, at 1K–16K tokens and with more steps (outside the study's queue): "
                     "[e5_gpu.md](e5_gpu.md).\n")
    parts.append(ru.footer(rep))
    return "\n".join(parts)


def speed_verdict(rep, task) -> str | None:
    """Seed 004's speed claim on one task: each seed's ASAM run's training tokens/s over the same seed's dense run.
    Holds when every seed's ratio reaches the claim's low end (2.1×), does not hold when none does, else mixed."""
    asam, dense = rep.by_seed(f"{task}/asam", "tokens_per_s"), rep.by_seed(f"{task}/dense", "tokens_per_s")
    ratios = [asam[s] / dense[s] for s in asam if s in dense and asam[s] and dense[s]]
    if not ratios:
        return None
    lo, hi = min(ratios), max(ratios)
    rep.fact("speed", task, {"low": f"{lo:.2f}", "high": f"{hi:.2f}"})
    measured = f"{lo:.2f}×" + ("" if len(ratios) == 1 else f" to {hi:.2f}× over {len(ratios)} seeds")
    v = "holds" if lo >= SPEED_CLAIM[0] else "does not hold" if hi < SPEED_CLAIM[0] else "mixed"
    return (f"- **{task}: ASAM trains {SPEED_CLAIM[0]}–{SPEED_CLAIM[1]}× faster than the standard Transformer** "
            f"(seed 004; claim) — {v}: ASAM's training speed (tokens/s) over dense attention's is {measured}, on "
            f"{budget.TASKS[task]['what']}.")


def robustness_section(rep, task) -> tuple[str, list[str]]:
    """Seed 004's robustness table, each row measured as defined in docs/train.md (--robustness, nonfinite_steps), and
    the verdicts on its three thresholds for ASAM (NaN rate 0 %, float32 vs float64 < 1e-6, lengths to 16384). Its
    correlation and FGSM figures come from the seed's own models and inputs: shown beside dense attention's, not
    judged."""
    rows, verdicts = [], []
    for model in ROBUST_ARMS:
        nan_rates = [rep.summary(d).get("nonfinite_steps", 0) / max(1, rep.summary(d).get("steps", 1))
                     for d in rep.done(f"{task}/{model}")]
        robust = [lib.run_json(d, "robustness.json") or {} for d in rep.done(f"{task}/robust-{model}")]
        if not robust:
            continue
        def col(key):
            return [r[key] for r in robust if r.get(key) is not None]
        longest = [max([row["length"] for row in r.get("lengths", []) if row.get("ok")] or [0]) for r in robust]
        if model == "asam":
            nan, rel = max(nan_rates or [0]), col("float32_vs_float64_max_relative")
            tried = ROBUST_MAX_LEN[rep.scale]["asam"]
            claims = [("never produces a non-finite step (NaN rate 0 %)", nan == 0 if nan_rates else None,
                       f"worst seed {100 * nan:.2f} %" if nan_rates else "no training run finished"),
                      ("float32 agrees with float64 to < 1e-6", max(rel) < 1e-6 if rel else None,
                       f"largest relative difference {max(rel):.1e}" if rel else "not measured"),
                      ("runs forward + backward at lengths up to 16384",
                       min(longest) >= 16384 if tried >= 16384 else None,
                       f"every seed's layer ran up to {min(longest)} tokens"
                       + ("" if tried >= 16384 else f" (this scale tries up to {tried})"))]
            verdicts += [f"- **ASAM {what}** (seed 004, robustness; claim) — "
                         f"{'not tested' if ok is None else 'holds' if ok else 'does not hold'}: "
                         f"{measured}." for what, ok, measured in claims]
        rows.append([model, f"{100 * max(nan_rates or [0]):.2f} %",
                     f"{max(col('float32_vs_float64_max_relative') or [float('nan')]):.1e}",
                     f"{min(longest)}", lib.fmt_mean_std(col("noise_correlation"), 4, 1),
                     lib.fmt_mean_std(col("fgsm_relative_change"), 3, 1)])
    if not rows:
        return "", []
    return ("## Robustness (seed 004's table), " + task + "\n\n"
            + lib.md_table(["model", "NaN rate (worst seed)", "float32 vs float64 (max relative)",
                            "longest length, forward + backward", "output correlation at 10 % noise",
                            "relative change, FGSM eps 0.01"], rows)
            + "\n\nThe seed's rows: NaN rate 0 %, float32 vs float64 < 1e-6, lengths to 16384, correlation 0.94, "
              "relative change 0.12. Lengths are of the first attention layer alone (forward + backward on N(0, 1) "
              "inputs); the noise and FGSM rows perturb the trained model's input embeddings over the first test "
              "examples.\n"), verdicts


EXPERIMENT = lib.Experiment(name="e5_asam", title="ASAM vs dense / window / window+global; ablation", runs=runs,
                            report=report)
