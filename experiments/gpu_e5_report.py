"""The report of experiments/gpu_e5.sh (experiment 5 on a GPU), beside the study's CPU results.

    python3 experiments/gpu_e5_report.py REPORT.md "COMMAND" OUT [OUT ...]   # OUT: what gpu_e5.sh run wrote

Reads each OUT's facts.txt, log.txt, bench_asam.json and runs.tar.gz (several OUTs: the parts of one study run with
PHASES); the CPU side comes from experiments/results/full (the study's ListOps runs of ASAM and dense attention,
400 steps, 5 seeds). A run stopped by the script's time limit is shown with the step it reached.
"""
import json
import pathlib
import statistics
import sys
import tarfile

import lib

HERE = pathlib.Path(__file__).resolve().parent


def mean_sd(xs):
    return lib.fmt_mean_std(xs) + (f" (n={len(xs)})" if len(xs) > 1 else "")


def main(report, command, *outs):
    outs = [pathlib.Path(o) for o in outs]
    facts = (outs[0] / "facts.txt").read_text().strip().splitlines()
    runs = {}  # run name -> summary.json
    unfinished = {}  # run name -> (last training step, last validation accuracy) of a run without a summary
    for out in (o for o in outs if (o / "runs.tar.gz").exists()):
        with tarfile.open(out / "runs.tar.gz") as tar:
            for m in tar.getmembers():
                if m.name.endswith("/summary.json"):
                    runs[m.name.split("/")[-2]] = json.load(tar.extractfile(m))
                elif m.name.endswith("/metrics.jsonl"):
                    # a run stopped by the time limit may end on a line cut short: dropped
                    rows = lib.jsonl_rows(tar.extractfile(m).read().decode())
                    val = [r["accuracy"] for r in rows if r.get("split") == "val"]
                    unfinished[m.name.split("/")[-2]] = (max((r["step"] for r in rows), default=0),
                                                         val[-1] if val else None)
    unfinished = {k: v for k, v in unfinished.items() if k not in runs}
    parts = ["# Experiment 5 on a GPU: ASAM against dense attention at larger lengths and budgets\n",
             f"Command: `{command}` (then `python3 experiments/gpu_e5_report.py`). The library is the study's version; "
             "the runs below are extra to the study's CPU runs (bench/results/experiments/e5_asam.md), which they "
             "do not replace.\n",
             "Machine: " + "; ".join(line for line in facts if not line.startswith(("asam:", "dense:"))) + "\n",
             "Flags of the two ListOps models (experiment 5's, equal size):\n",
             "```\n" + "\n".join(line for line in facts if line.startswith(("asam:", "dense:"))) + "\n```\n"]

    bench_path = next((o / "bench_asam.json" for o in outs if (o / "bench_asam.json").exists()), None)
    if bench_path:
        bench = json.loads(bench_path.read_text())
        rows = {(r["impl"], r["n"]): r for r in bench["rows"]}
        ns = sorted({r["n"] for r in bench["rows"]})
        impls = [i for i in ("chunked", "mha", "window", "w+g+r", "asam") if any((i, n) in rows for n in ns)]
        sp = {n: rows[("mha", n)]["fwd_bwd_ms"] / rows[("asam", n)]["fwd_bwd_ms"] for n in ns
              if ("mha", n) in rows and ("asam", n) in rows}  # the standard layer's time over ASAM's, per length
        table = []
        for n in ns:
            cell = lambda i: f"{rows[(i, n)]['fwd_bwd_ms']:.2f}" if (i, n) in rows else "—"
            table.append([str(n)] + [cell(i) for i in impls] + [f"{sp[n]:.2f}×" if n in sp else "—"])
        parts.append(f"## 1. One attention layer, forward + backward (ms; {bench.get('dtype', '?')}, batch 1, 4 heads of "
                     "64; best of 3, 1 above 4096 tokens)\n")
        parts.append("`chunked` is the attention core alone; `mha` and `asam` are whole layers (projections included). "
                     "The last column is seed 004's speed-up (standard attention layer time / ASAM layer time; "
                     "claimed 2.1–4.8×).\n")
        parts.append(lib.md_table(["tokens"] + impls + ["mha / asam"], table) + "\n")
        if sp:
            faster = [n for n in sp if sp[n] >= 2.1]
            parts.append(f"ASAM's layer against the standard one: {min(sp.values()):.2f}–{max(sp.values()):.2f}× over "
                         f"{min(sp)}–{max(sp)} tokens; the claimed 2.1× or more is reached at "
                         + (", ".join(map(str, faster)) + " tokens only" if faster else "no length") +
                         " (one repetition above 4096 tokens: the jump of the dense rows' backward at 8192 is measured, "
                         "not explained here).\n")

    table = []
    for lens, batch in (("128-256", 32), ("1024-2048", 32), ("4096-8192", 8)):
        a, d = runs.get(f"probe-asam-{lens}", {}), runs.get(f"probe-dense-{lens}", {})
        ta, td = a.get("tokens_per_s"), d.get("tokens_per_s")
        table.append([lens, str(batch), f"{ta:.0f}" if ta else "did not finish", f"{td:.0f}" if td else "did not finish",
                      f"{ta / td:.2f}×" if ta and td else "—"])
    parts.append("## 2. Training speed (tokens/s, 50-step ListOps runs, float32, each run alone on the GPU)\n")
    parts.append(lib.md_table(["lengths", "batch", "ASAM", "dense", "ASAM / dense"], table) + "\n")

    gpu = {arm: [runs[f"{arm}-s{s}"]["test_accuracy"] for s in range(3) if f"{arm}-s{s}" in runs]
           for arm in ("asam", "dense")}
    steps = {runs[k]["steps"] for k in runs if not k.startswith("probe")}
    cpu_dir = HERE / "results" / "full" / "e5_asam"  # its tables, or its run folders here
    cpu = {arm: [s["test_accuracy"] for s in (lib.run_json(d, "summary.json") for d in
                                              lib.run_dirs(cpu_dir, f"listops/{arm}/s*")) if s]
           for arm in ("asam", "dense")}
    parts.append("## 3. ListOps test accuracy % (mean ± std over seeds)\n")
    if gpu["asam"] or gpu["dense"]:
        parts.append(lib.md_table(["budget", "ASAM", "dense", "ASAM − dense"], [
            ["CPU, 400 steps (the study)", mean_sd(cpu["asam"]), mean_sd(cpu["dense"]),
             f"{100 * (statistics.mean(cpu['asam']) - statistics.mean(cpu['dense'])):+.2f}"
             if cpu["asam"] and cpu["dense"] else "—"],
            [f"GPU, {'/'.join(map(str, sorted(steps)))} steps", mean_sd(gpu["asam"]), mean_sd(gpu["dense"]),
             f"{100 * (statistics.mean(gpu['asam']) - statistics.mean(gpu['dense'])):+.2f}"
             if gpu["asam"] and gpu["dense"] else "—"]]) + "\n")
        for name, (step, val) in sorted(unfinished.items()):
            if not name.startswith("probe"):
                parts.append(f"- `{name}` did not finish in the time: step {step} reached"
                             + (f", last validation accuracy {100 * val:.1f} %" if val is not None else "") + ".")
        parts.append("\nSeed 004 claims 37.2 (ASAM) against 36.4 (standard Transformer) at full LRA scale. The GPU runs "
                     "used the same flags, data and seeds 0–2 as the study, only more steps"
                     + ("" if not any("(fixed:" in (o / "log.txt").read_text() for o in outs
                                      if (o / "log.txt").exists())
                        else " (fixed with STEPS after the speed probes, before any accuracy was seen)")
                     + "; all six shared the GPU, "
                     "so their speed is not reported. Three seeds test nothing about a 0.8-point claim: this row is "
                     "shown, not judged.\n")
    else:
        parts.append("Not run (see the log).\n")
    profile = next((o / "profile_128.txt" for o in outs if (o / "profile_128.txt").exists()), None)
    if profile:
        lines = profile.read_text().splitlines()
        step = next((l.split() for l in lines if l.startswith("train_step")), None)
        parts.append("## Where ASAM's training step spends its time on the GPU (128-256 tokens)\n")
        parts.append("`train --profile 4` on experiment 5's ASAM flags (4 steps after a warm-up step; the top rows, "
                     "then the totals):\n")
        if step:
            parts.append(f"{step[4]} % of the step's time is the step's own host work, outside every GPU kernel and "
                         "every named op: on the GPU ASAM's step is bound by the host, not by attention arithmetic. That "
                         "host work includes building the clustered pattern on the CPU from the cluster assignments "
                         "at every call (nn/asam_attention.cpp); which part of it dominates is not measured here.\n")
        parts.append("```\n" + "\n".join(lines[:6] + [l for l in lines if l.startswith(("wall", "peak"))]) + "\n```\n")
    parts.append("## Log\n\n```\n" + "\n".join((o / "log.txt").read_text().strip() for o in outs
                                                    if (o / "log.txt").exists()) + "\n```\n")
    lib.write_atomic(report, "\n".join(parts))


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
