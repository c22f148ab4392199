"""Which Pathfinder can the study's dense baseline learn? The pilot that chose experiment 5's Pathfinder task.

At the study's first difficulty (Pathfinder-32, 12-step paths, 3 distractors, pooled to 16 x 16) no arm learnt the
task in 400 steps, so the comparison there said nothing (its verdict: not testable). This pilot picks a difficulty by
a rule written here before any of its runs:

  Candidates, all 256 pixel tokens, from the easiest (D3) to the hardest (D0, the study's first):
    D3  drawn at 16 x 16, two 4-step paths, no distractor
    D2  drawn at 16 x 16, two 5-step paths, 1 distractor
    D1  drawn at 16 x 16, two 6-step paths, 2 distractors
    D0  drawn at 32 x 32 and pooled to 16 x 16, two 12-step paths, 3 distractors
  (16 x 16 holds no more: 7- or 8-step paths with 2-3 distractors cannot be placed without touching.)
  Budget: experiment 5's dense arm (its model, optimiser and learned positions; seed 0, data seed 0) for 2000 steps of
  batch 32, at most 15 minutes of this 2-core machine for every arm of experiment 5 (ASAM, the slowest, measured
  0.34 s per step here at 256 tokens: 11-12 minutes); 20k / 1k / 2k examples.
  Rule: run the candidates from D3 towards D0 and stop at the first whose best validation accuracy (the whole
  validation split, 4 evaluations) is below 75 %; the task is the last one at or above it — the hardest difficulty
  the baseline learns. Validation, not test: the test split stays unseen until experiment 5 runs. 75 % leaves room
  for the ≥ 70 % test accuracy asked of the baseline. If D3 itself stays below, Pathfinder is not learnable at this
  budget and experiment 5 keeps it as not testable.

Round 1 found D3 itself unlearnt (best validation accuracy 60.10 %: the dashed paths' gaps leave connectivity to be
inferred across them). Round 2, written after round 1 and before any of its runs, draws the paths solid (the scene's
geometry unchanged; the dashed image is a subset of the solid one) and adds a smaller scene at the easy end:
    S4  drawn at 12 x 12 (144 tokens), solid, two 3-step paths, no distractor
    S3  drawn at 16 x 16, solid, two 4-step paths, no distractor
    S2  drawn at 16 x 16, solid, two 5-step paths, 1 distractor
    S1  drawn at 16 x 16, solid, two 6-step paths, 2 distractors
  with the same budget and rule (from S4 towards S1, stop at the first below 75 %, take the last at or above it). The
  choice reads the dense baseline's validation accuracy only, never another arm's, so it cannot favour the
  mechanism under test. If S4 stays below, Pathfinder is not learnable by the study's model at this budget.

Round 2 found S4 at 71.00 % (test 70.60 %), still rising at its last step: the budget, not the scene, stopped it.
Round 3, written after round 2 and before any of its runs, gives each candidate the budget the 15 minutes allow: the
steps ASAM (experiment 5's slowest arm, its flags) takes in 12 minutes at the candidate's size, measured by a 30-step
timing run of ASAM on that scene (a timing, not a result), rounded down to a multiple of 500 and capped at 6000. A
smaller scene costs less per step, so it gets more steps. Candidates, in this order:
    S4  12 x 12, solid, two 3-step paths, no distractor
    R1  12 x 12, solid, two 4-step paths, no distractor
    R2  12 x 12, solid, two 3-step paths, 1 distractor
    S3  16 x 16, solid, two 4-step paths, no distractor
    S2  16 x 16, solid, two 5-step paths, 1 distractor
    S1  16 x 16, solid, two 6-step paths, 2 distractors
  The same rule: stop at the first below 75 % best validation accuracy, take the last at or above it (with its
  budget). If S4 stays below, Pathfinder is not learnable by the study's model within 15 minutes a run.

    python3 experiments/pathfinder_pilot.py run       # resumable: each candidate's run in experiments/results/pilot/
    python3 experiments/pathfinder_pilot.py report    # bench/results/experiments/pathfinder_pilot.md and .json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import budget
import lib

CANDIDATES = {  # name -> the task flags (what replaces experiment 5's Pathfinder flags)
    "D3": ["--task", "pathfinder", "--pathfinder-size", "16", "--path-steps", "4", "--distractors", "0"],
    "D2": ["--task", "pathfinder", "--pathfinder-size", "16", "--path-steps", "5", "--distractors", "1"],
    "D1": ["--task", "pathfinder", "--pathfinder-size", "16", "--path-steps", "6", "--distractors", "2"],
    "D0": ["--task", "pathfinder", "--pathfinder-size", "32", "--image-size", "16"],
}
ORDER = ["D3", "D2", "D1", "D0"]  # easiest first
SOLID = ["--pathfinder-solid", "true"]
CANDIDATES_2 = {  # round 2
    "S4": ["--task", "pathfinder", "--pathfinder-size", "12", "--path-steps", "3", "--distractors", "0", *SOLID],
    "S3": ["--task", "pathfinder", "--pathfinder-size", "16", "--path-steps", "4", "--distractors", "0", *SOLID],
    "S2": ["--task", "pathfinder", "--pathfinder-size", "16", "--path-steps", "5", "--distractors", "1", *SOLID],
    "S1": ["--task", "pathfinder", "--pathfinder-size", "16", "--path-steps", "6", "--distractors", "2", *SOLID],
}
ORDER_2 = ["S4", "S3", "S2", "S1"]
CANDIDATES.update(CANDIDATES_2)
CANDIDATES.update({  # round 3's new scenes
    "R1": ["--task", "pathfinder", "--pathfinder-size", "12", "--path-steps", "4", "--distractors", "0", *SOLID],
    "R2": ["--task", "pathfinder", "--pathfinder-size", "12", "--path-steps", "3", "--distractors", "1", *SOLID],
})
ORDER_3 = ["r3-S4", "r3-R1", "r3-R2", "r3-S3", "r3-S2", "r3-S1"]  # round 3 runs: its own folders (other budgets)
ROUNDS = [ORDER, ORDER_2, ORDER_3]
TIME_BUDGET_S = 720  # round 3: what ASAM may take, of the 15 minutes a run
MAX_STEPS = 6000
SIZES = ["--train-size", "20000", "--val-size", "1000", "--test-size", "2000"]
STEPS = 2000
THRESHOLD = 0.75  # best validation accuracy
ROOT = lib.REPO / "experiments" / "results" / "pilot" / "pathfinder"
OUT = lib.REPO / "bench" / "results" / "experiments" / "pathfinder_pilot"


def scene(name: str) -> str:
    return name.removeprefix("r3-")


def flags(candidate: str, model: str = "dense", steps: int | None = None) -> list[str]:
    """Experiment 5's arm (dense by default) on Pathfinder, its task flags replaced by the candidate's and its budget
    the pilot's (round 3: the candidate's own, budget_steps)."""
    import e5_asam as e5
    if steps is None:
        steps = budget_steps(candidate) if candidate.startswith("r3-") else STEPS
    dense = e5.arm_flags("pathfinder", "full")[model]
    out, skip = [], False
    for i, f in enumerate(dense):  # drop the task's own flags
        if skip:
            skip = False
            continue
        if f in ("--task", "--image-size", "--train-size", "--val-size", "--test-size", "--pathfinder-size",
                 "--path-steps", "--distractors", "--pathfinder-solid"):
            skip = True
            continue
        out.append(f)
    out = [*CANDIDATES[scene(candidate)], *SIZES, *out]
    for name, value in (("--steps", steps), ("--warmup", steps // 10), ("--eval-every", steps // 4),
                        ("--eval-batches", 0), ("--seed", 0), ("--data-seed", 0)):
        out = budget.set_flag(out, name, value)
    return out


def budget_steps(candidate: str) -> int:
    """Round 3: the steps ASAM takes in TIME_BUDGET_S at this scene, from a 30-step timing run (kept in its folder),
    rounded down to a multiple of 500, at most MAX_STEPS."""
    d = ROOT / "timing" / scene(candidate)
    if not (d / "summary.json").exists():
        f = flags(candidate, "asam", 30)
        f = budget.set_flag(budget.set_flag(f, "--eval-every", 1000), "--train-size", 2000)
        subprocess.run([str(lib.tool("train")), *f, "--out", str(d), "--progress", "none"], check=True,
                       capture_output=True)
    s = lib.read_json(d / "summary.json")
    tokens = 32 * int(CANDIDATES[scene(candidate)][3]) ** 2  # a batch of the scene's pixel tokens
    seconds_per_step = tokens / s["tokens_per_s"]
    return int(min(MAX_STEPS, (TIME_BUDGET_S / seconds_per_step) // 500 * 500))


def best_val(d) -> float | None:
    s = lib.read_json(d / "summary.json")
    return None if not s else s.get("val_accuracy")


def run_round(order: list[str]) -> int:
    """Runs a round's candidates from the easiest until one stays below the threshold; 0, or train's exit code."""
    for name in order:
        d = ROOT / name
        if best_val(d) is None:
            cmd = [str(lib.tool("train")), *flags(name), "--out", str(d)]
            if (d / "metrics.csv").exists():
                cmd.append("--resume")
            print(f"pilot: {name}: {' '.join(cmd[1:])}", flush=True)
            r = subprocess.run(cmd)
            if r.returncode != 0:
                print(f"pilot: {name} stopped (exit {r.returncode}); run again to resume")
                return r.returncode
        acc = best_val(d)
        print(f"pilot: {name}: best validation accuracy {100 * acc:.2f} %", flush=True)
        if acc < THRESHOLD:
            break
    return 0


def chosen_of(order: list[str]):
    """(the round's choice or None, its table rows)."""
    rows, chosen, stopped = [], None, False
    for name in order:
        s = lib.read_json(ROOT / name / "summary.json") or {}
        acc = s.get("val_accuracy")
        reading = "—" if acc is None or stopped else ("learnt" if acc >= THRESHOLD else "not learnt: stop")
        steps = s.get("steps")
        rows.append([name, f"`{' '.join(CANDIDATES[scene(name)][2:])}`", steps or "—",
                     "—" if acc is None else f"{100 * acc:.2f}",
                     "—" if s.get("test_accuracy") is None else f"{100 * s['test_accuracy']:.2f}",
                     f"{s['wall_s'] / 60:.1f}" if s.get("wall_s") else "—", reading])
        if acc is not None and not stopped:
            if acc >= THRESHOLD:
                chosen = name
            else:
                stopped = True
    return chosen, rows


def cmd_run() -> int:
    for order in ROUNDS:
        rc = run_round(order)
        if rc:
            return rc
        if chosen_of(order)[0]:
            break
    return cmd_report()


def cmd_report() -> int:
    parts, chosen = [], None
    for i, order in enumerate(ROUNDS):
        c, rows = chosen_of(order)
        parts.append(f"## Round {i + 1}\n\n" + lib.md_table(["candidate", "task flags", "steps",
                                                              "best validation accuracy %",
                                                              "test accuracy % (not read by the rule)", "minutes",
                                                              "reading"], rows) + "\n")
        if c:
            chosen = c
            break
    text = (f"# Pathfinder pilot: the difficulty experiment 5 runs on\n\n"
            f"CPU of the runs: {lib.cpu_model()}. The rules (each written before its round's runs, "
            f"experiments/pathfinder_pilot.py): run the candidates from the easiest towards the hardest, stop at the "
            f"first whose best validation accuracy is below {100 * THRESHOLD:.0f} %; the task is the last at or "
            f"above it. Experiment 5's dense arm, seed 0, batch 32, {STEPS} steps in rounds 1 and 2 and in round 3 each "
            f"candidate's own budget (the steps column), the whole validation split (1000 "
            f"examples) evaluated 4 times; the test split's accuracy is shown, the rule does not read it.\n\n"
            + "\n".join(parts)
            + f"\nChosen: **{chosen or 'none: Pathfinder is not learnt at this budget'}**"
            + (f" (`{' '.join(CANDIDATES[scene(chosen)])}`, "
               f"{(lib.read_json(ROOT / chosen / 'summary.json') or {}).get('steps')} steps)" if chosen else "")
            + ".\n\n"
            f"```sh\npython3 experiments/pathfinder_pilot.py run      # resumable\n"
            f"# candidate D3 (the others: its task flags replaced):\n"
            f"{' '.join(['train', *flags('D3'), '--out', 'DIR'])}\n```\n")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    lib.write_atomic(OUT.with_suffix(".md"), text)
    lib.write_atomic(OUT.with_suffix(".json"), json.dumps(
        {"chosen": chosen, "flags": CANDIDATES.get(scene(chosen)) if chosen else None,
         "steps": (lib.read_json(ROOT / chosen / "summary.json") or {}).get("steps") if chosen else None},
        indent=1) + "\n")
    print(f"pilot: chosen {chosen}; {OUT.with_suffix('.md')}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="pathfinder_pilot.py", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["run", "report"])
    args = p.parse_args()
    return cmd_run() if args.command == "run" else cmd_report()


if __name__ == "__main__":
    sys.exit(main())
