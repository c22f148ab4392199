"""The scaled-down tasks, the shared model and optimiser settings, and the measured cost of a training step: what every
experiment's budget is made of. Full Long Range Arena scale does not fit this machine (2 cores: one ListOps epoch of
96k examples at 2000 tokens would take hours per seed), so every task here is smaller, and every table says so.

Scales: "full" is the study (its runs take about 12 hours of this machine in all, spread over sessions by the queue);
"quick" is a few minutes; "tiny" is seconds (CI checks that every experiment script still runs end to end).
"""
from __future__ import annotations

import json
import subprocess

import lib

# The model every attention experiment trains, unless the experiment varies it: a 2-block pre-norm Transformer of
# width 64 with 4 heads, mean-pooled, AdamW with warmup and cosine decay. Attention dropout is 0 for every arm (ASAM has
# none, and ASCender's fused kernels have none); residual dropout 0.1 for all.
MODEL = ["--d-model", "64", "--heads", "4", "--layers", "2", "--ffn", "128", "--dropout", "0.1", "--attn-dropout", "0"]
OPTIM = ["--optimizer", "adamw", "--lr", "1e-3", "--weight-decay", "0.01", "--schedule", "cosine", "--clip", "1",
         "--batch", "32"]

# Task flags per scale. The data seed is fixed (0) so that seeds compare models on the same data.
TASKS = {
    "listops": {
        "full": ["--task", "listops", "--min-len", "128", "--max-len", "256", "--train-size", "20000",
                 "--val-size", "1000", "--test-size", "2000"],
        "quick": ["--task", "listops", "--min-len", "32", "--max-len", "96", "--train-size", "4000",
                  "--val-size", "200", "--test-size", "500"],
        "tiny": ["--task", "listops", "--min-len", "16", "--max-len", "40", "--train-size", "64",
                 "--val-size", "16", "--test-size", "16"],
        "what": "ListOps, 128–256 tokens (LRA: 500–2000), 20k train / 1k val / 2k test",
    },
    "image": {
        "full": ["--task", "fashion-mnist-seq", "--image-size", "14", "--train-size", "20000", "--val-size", "2000",
                 "--test-size", "5000"],
        "quick": ["--task", "fashion-mnist-seq", "--image-size", "7", "--train-size", "4000", "--val-size", "500",
                  "--test-size", "1000"],
        "tiny": ["--task", "fashion-mnist-seq", "--image-size", "7", "--train-size", "64", "--val-size", "16",
                 "--test-size", "16"],
        "what": "Fashion-MNIST as 196-pixel sequences (14 × 14 pooled; LRA's Image: CIFAR-10, 1024 pixels), 20k / 2k / 5k",
    },
    # Until 2026-11-29 the text task was the man pages by section (`--task text --max-len 256`): 123 test examples,
    # too few to resolve a few points; the fortunes give 1049 (docs/data.md).
    "text": {
        "full": ["--task", "fortunes", "--max-len", "256"],
        "quick": ["--task", "fortunes", "--max-len", "128"],
        "tiny": ["--task", "fortunes", "--max-len", "32", "--train-size", "64", "--val-size", "16",
                 "--test-size", "16"],
        "what": "Debian's fortunes by topic as bytes, first 256 bytes (LRA's Text: IMDb, 4096 bytes); 2950 / 209 / "
                "1049 texts",
    },
    # Until 2026-11-29 Pathfinder-32 pooled to 16 x 16 (`--task pathfinder --image-size 16`, 400 steps in experiment
    # 5), which no arm learnt; experiments/pathfinder_pilot.py chose this scene (and experiment 5 its 4500 steps) by
    # rules written before its runs.
    "pathfinder": {
        "full": ["--task", "pathfinder", "--pathfinder-size", "12", "--path-steps", "3", "--distractors", "1",
                 "--pathfinder-solid", "true", "--train-size", "20000", "--val-size", "1000", "--test-size", "2000"],
        "quick": ["--task", "pathfinder", "--image-size", "16", "--train-size", "4000", "--val-size", "200",
                  "--test-size", "500"],
        "tiny": ["--task", "pathfinder", "--image-size", "8", "--train-size", "64", "--val-size", "16",
                 "--test-size", "16"],
        "what": "Pathfinder drawn at 12 × 12 (144 tokens; LRA: 32 × 32, 1024), solid 3-step paths and 1 distractor "
                "(the pilot's choice), 20k / 1k / 2k",
    },
}

# Optimizer steps per run (batch 32: steps × 32 examples seen, the same for every arm of a comparison); experiments
# that need another budget set their own.
STEPS = {"full": 1000, "quick": 300, "tiny": 3}

# Seconds per training step on this machine (AMD EPYC, 2 cores, 2 threads, batch 32, the MODEL above at the
# full-scale lengths, measured from train's tokens/s over 12-step runs): the queue's time estimates. Dense and
# ASCender measured 2026-11-26; ASAM, window and window + global 2026-11-27 with experiment 5's flags (ASAM with all
# five patterns and the adaptive gate: the first measure, of its default patterns, was 2-3x too low).
COST = {
    ("listops", "dense"): 0.16, ("listops", "ascender"): 0.71, ("listops", "asam"): 0.57,
    ("listops", "window"): 0.09, ("listops", "window-global"): 0.09,
    ("image", "dense"): 0.18, ("image", "ascender"): 0.40, ("image", "asam"): 0.52,
    ("image", "window"): 0.07, ("image", "window-global"): 0.12,
    ("text", "dense"): 0.25, ("text", "ascender"): 1.0, ("text", "asam"): 0.70,
    ("text", "window"): 0.10, ("text", "window-global"): 0.10,
    # Pathfinder at the pilot's 12 x 12 scene, measured 2026-11-29 on an Intel Xeon (2 cores) by the pilot's timings
    ("pathfinder", "dense"): 0.06, ("pathfinder", "ascender"): 0.3, ("pathfinder", "asam"): 0.15,
    ("pathfinder", "window"): 0.03, ("pathfinder", "window-global"): 0.04,
}


def task_flags(task: str, scale: str) -> list[str]:
    return TASKS[task][scale]


def steps(scale: str) -> int:
    return STEPS[scale]


def cost(task: str, model: str, scale: str) -> float:
    c = COST.get((task, model), 0.5)
    return c if scale == "full" else c / 4  # the smaller scales use shorter sequences


def train_flags(task: str, model: str, scale: str, extra: list[str] | None = None) -> list[str]:
    """The flags of one run: task, model, the shared settings, the step budget, warmup 10 %, 10 validations."""
    n = steps(scale)
    return [*task_flags(task, scale), "--model", model, *MODEL, *OPTIM, "--steps", str(n),
            "--warmup", str(max(1, n // 10)), *(extra or [])]


# ---- equal parameter count -----------------------------------------------------------------------------------------
_CACHE = None


def params_of(flags: list[str]) -> int:
    """The parameter count of the model these train flags build (train --params-only), cached on disk by flags and
    code version."""
    global _CACHE
    path = lib.REPO / "experiments" / ".params_cache.json"
    if _CACHE is None:
        _CACHE = lib.read_json(path) or {}
    key = f"{lib.code_version()} {' '.join(flags)}"  # a new version of the code may change the count
    if key not in _CACHE:
        out = subprocess.run([str(lib.tool("train")), *flags, "--params-only"], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"budget: train --params-only failed for {key}: {out.stderr.strip()}")
        _CACHE[key] = json.loads(out.stdout)["params"]
        lib.write_json(path, _CACHE)
    return _CACHE[key]


def set_flag(flags: list[str], name: str, value) -> list[str]:
    """flags with option `name` set to value (replaced where it is, appended where it is not)."""
    out = list(flags)
    if name in out:
        out[out.index(name) + 1] = str(value)
    else:
        out += [name, str(value)]
    return out


def with_ffn(flags: list[str], ffn: int) -> list[str]:
    return set_flag(flags, "--ffn", ffn)


def match_params(flags: list[str], target: int) -> list[str]:
    """flags with the feed-forward width changed so the model has target parameters (within 5 %; the count is linear
    in the width, so two probes find it). The mechanism under test keeps the shared width; baselines are widened."""
    base = int(flags[flags.index("--ffn") + 1])
    p0, p1 = params_of(flags), params_of(with_ffn(flags, base + 64))
    per_unit = (p1 - p0) / 64
    ffn = max(1, round(base + (target - p0) / per_unit))
    matched = with_ffn(flags, ffn)
    got = params_of(matched)
    if abs(got - target) > 0.05 * target:
        raise SystemExit(f"budget: cannot match {target} parameters by the feed-forward width ({got} at ffn {ffn})")
    return matched
