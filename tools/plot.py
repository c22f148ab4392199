#!/usr/bin/env python3
"""Figures from a training run directory (tools/train --out DIR) and from bench_asam --csv. What each figure shows
and the exact commands: docs/figures.md.

    python3 tools/plot.py curves RUN [RUN ...] --out loss.png [--metric loss] [--split train,val] [--label-by model]
    python3 tools/plot.py decomposition RUN/dumps/decomposition_0.safetensors --out dec.png [--layer 0 --head 0]
    python3 tools/plot.py omega RUN --out omega.png        # ω_align / ω_sep / ω_coh per layer and head over steps
    python3 tools/plot.py heads RUN --out heads.png        # head specialisation: the three ω per head, last step
    python3 tools/plot.py gate RUN --out gate.png          # ASAM gate over training (+ histogram of the gate dump)
    python3 tools/plot.py bench-asam bench.csv --out b.png # time and peak memory vs sequence length, log-log
    python3 tools/plot.py firing RUN --out firing.png      # firing-rate histogram per layer + threshold trajectories
    python3 tools/plot.py xy points.csv --out p.png [--lines] [--logx] # x, y[, yerr, group] columns: Pareto fronts
    python3 tools/plot.py all RUN --out-dir figs/          # every figure the run's files allow

Each writes a PNG (a PDF when --out ends in .pdf) of a fixed pixel size (docs/figures.md), whole or not at all
(write_whole), and prints its path. Exit status: 0 written; 1 a missing or malformed input file (a one-line message
naming it) or data the figure needs is absent; 2 bad arguments (argparse); 77 matplotlib is not installed (nothing
else is needed: numpy and the standard library; the run's files are read, never written).
"""
import argparse
import csv
import glob
import json
import math
import os
import re
import struct
import sys

try:
    import numpy as np
except ImportError:  # reported by main() after the arguments are parsed, like a missing matplotlib
    np = None

NO_MATPLOTLIB = ("plot.py: matplotlib is not installed (apt-get install python3-matplotlib); the run's data files "
                 "are unaffected")
SPLITS = ("train", "val", "test")
# metrics.csv columns that are not mechanism measurements (the rest are "L<l>.<name>" or "L<l>.<name>.h<i>").
BASE_COLUMNS = ("step", "epoch", "split", "loss", "accuracy", "lr", "tokens_per_s", "time_s", "bits_per_byte")
# Config keys that differ between the seeds of one experiment (or say only how it ran) and so do not separate curve
# groups.
NOT_GROUPING = ("seed", "git_commit", "out", "command", "threads", "progress", "progress_every", "prefetch")
OMEGAS = (("omega_align", "ω_align"), ("omega_sep", "ω_sep"), ("omega_coh", "ω_coh"))


class PlotError(Exception):
    """A malformed or unreadable input: one line, exit status 1."""


class MissingData(PlotError):
    """The inputs are fine but lack what this figure needs (`all` skips the figure with a note)."""


# ---- reading ----------------------------------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F64": "f8", "F32": "f4", "F16": "f2", "I64": "i8", "I32": "i4", "I16": "i2", "I8": "i1",
                      "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    """({name: array}, metadata). Layout: 8-byte little-endian header length N, N bytes of JSON {name: {"dtype",
    "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the tensors' raw little-endian data."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise PlotError(f"{path}: cannot read ({e.strerror})")
    try:
        (n,) = struct.unpack("<Q", blob[:8])
        if n > len(blob) - 8:
            raise ValueError(f"header length {n} exceeds the file")
        header = json.loads(blob[8:8 + n].decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        data = blob[8 + n:]
        out = {}
        for name, info in header.items():
            tag, shape, (b, e) = info["dtype"], [int(s) for s in info["shape"]], info["data_offsets"]
            if tag not in SAFETENSORS_DTYPES:
                raise ValueError(f"'{name}' has unsupported dtype {tag}")
            dt = np.dtype(SAFETENSORS_DTYPES[tag]).newbyteorder("<")
            if not (0 <= b <= e <= len(data)) or e - b != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
                raise ValueError(f"'{name}': data offsets [{b}, {e}] do not fit shape {shape} {tag}")
            out[name] = np.frombuffer(data, dtype=dt, count=(e - b) // dt.itemsize, offset=b).reshape(shape)
    except (struct.error, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise PlotError(f"{path}: not a valid safetensors file ({e})")
    return out, meta


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise MissingData(f"{path}: no such file")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PlotError(f"{path}: malformed JSON ({e})")


def number(v, where):
    if v is None or v == "":
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        raise PlotError(f"{where}: expected a number, got {v!r}")


def normalise_row(raw, where):
    """A metrics row with numbers as floats (None = not measured) and "mech" as {name: float or [float per head]}."""
    if not isinstance(raw, dict) or "step" not in raw or "split" not in raw:
        raise PlotError(f"{where}: expected an object with at least \"step\" and \"split\"")
    row = {k: (raw[k] if k == "split" else number(raw.get(k), f"{where} \"{k}\"")) for k in BASE_COLUMNS if k in raw}
    row = {k: v for k, v in row.items() if v is not None}  # null (JSONL) and an empty cell (CSV): not measured
    mech = raw.get("mech") or {}
    if not isinstance(mech, dict):
        raise PlotError(f"{where}: \"mech\" is not an object")
    row["mech"] = {}
    for name, v in mech.items():
        row["mech"][name] = [number(x, f"{where} mech {name}") for x in v] if isinstance(v, list) else \
            number(v, f"{where} mech {name}")
    return row


def read_metrics(run):
    """The run's metrics rows, from metrics.jsonl, else from metrics.csv (the same rows flattened)."""
    jsonl, csv_path = os.path.join(run, "metrics.jsonl"), os.path.join(run, "metrics.csv")
    if not os.path.isdir(run):
        raise PlotError(f"{run}: no such run directory")
    rows = []
    if os.path.exists(jsonl):
        try:
            with open(jsonl) as f:
                for i, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            raw = json.loads(line)
                        except json.JSONDecodeError as e:
                            if not line.endswith("\n"):  # the last line, cut short: train killed mid-write
                                break                   # (train drops it too when it resumes)
                            raise PlotError(f"{jsonl}:{i}: malformed JSON ({e.msg})")
                        rows.append(normalise_row(raw, f"{jsonl}:{i}"))
        except (OSError, UnicodeDecodeError) as e:
            raise PlotError(f"{jsonl}: cannot read ({e})")
    elif os.path.exists(csv_path):
        try:
            with open(csv_path, newline="") as f:
                for i, rec in enumerate(csv.DictReader(f), 2):
                    if None in rec or any(v is None for v in rec.values()):
                        raise PlotError(f"{csv_path}:{i}: the row does not have one cell per column")
                    raw = {k: v for k, v in rec.items() if k in BASE_COLUMNS and v != ""}
                    mech = {}
                    for col, v in rec.items():
                        if col in BASE_COLUMNS or v == "":
                            continue
                        m = re.fullmatch(r"(.+)\.h(\d+)", col)
                        if m:  # one head of a per-head list
                            lst = mech.setdefault(m.group(1), [])
                            lst.extend([None] * (int(m.group(2)) + 1 - len(lst)))
                            lst[int(m.group(2))] = v
                        else:
                            mech[col] = v
                    raw["mech"] = mech
                    rows.append(normalise_row(raw, f"{csv_path}:{i}"))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise PlotError(f"{csv_path}: cannot read ({e})")
    else:
        raise PlotError(f"{run}: neither metrics.jsonl nor metrics.csv exists")
    if not rows:
        raise MissingData(f"{run}: the metrics file has no rows")
    return rows


def metric_series(rows, metric, split):
    """(steps, values) of one metric on one split, by step (a repeated step keeps its last value)."""
    by_step = {int(r["step"]): r[metric] for r in rows if r["split"] == split and r.get(metric) is not None}
    steps = sorted(by_step)
    return np.array(steps, dtype=np.int64), np.array([by_step[s] for s in steps], dtype=np.float64)


def mech_series(rows, name):
    """(steps, values (n,) or (n, heads)) of a mechanism measurement, from the first split that logs it."""
    for split in SPLITS:
        by_step = {int(r["step"]): r["mech"][name] for r in rows if r["split"] == split and name in r["mech"]}
        if by_step:
            steps = sorted(by_step)
            vals = [by_step[s] for s in steps]
            vals = [[np.nan if x is None else x for x in (v if isinstance(v, list) else [v])] for v in vals]
            width = max(len(v) for v in vals)
            arr = np.array([v + [np.nan] * (width - len(v)) for v in vals], dtype=np.float64)
            return np.array(steps), (arr[:, 0] if all(not isinstance(by_step[s], list) for s in steps) else arr)
    return None, None


def layers_with(rows, suffix):
    """The layer indices l that have a mechanism measurement "L<l>.<suffix>", ascending."""
    found = set()
    for r in rows:
        for name in r["mech"]:
            m = re.fullmatch(r"L(\d+)\." + re.escape(suffix), name)
            if m:
                found.add(int(m.group(1)))
    return sorted(found)


# ---- matplotlib ---------------------------------------------------------------------------------------------------

plt = None


def load_matplotlib():
    """Agg (no display needed). Returns False when matplotlib cannot be imported."""
    global plt
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        return False
    plt = pyplot
    return True


def inches(x):
    """Rounded up to a quarter inch: exact in binary, so width x dpi is a whole number of pixels whatever the dpi."""
    return math.ceil(x * 4 - 1e-9) / 4


def new_figure(args, w, h, **kw):
    return plt.subplots(figsize=(inches(w), inches(h)), dpi=args.dpi, layout="constrained", **kw)


def write_whole(path, write):
    """write(f) into a temporary file beside path (<name>.tmp.<pid>), flushed and fsync'd, then renamed over path
    (os.replace): a reader, or a report run killed with kill -9, finds the old figure or the whole new one, never
    half a file; on an error the temporary file is removed. plot.py runs on its own (standard library, numpy,
    matplotlib), so this is a small copy of experiments/lib.py's atomic_open rather than an import of it."""
    parent = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(parent, f"{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    try:  # the rename made durable too (best effort)
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def save(fig, path):
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
        # the format said, not guessed from the temporary file's name
        write_whole(path, lambda f: fig.savefig(f, format="pdf" if path.lower().endswith(".pdf") else "png"))
    except OSError as e:
        raise PlotError(f"{path}: cannot write ({e.strerror})")
    finally:
        plt.close(fig)
    print(path)
    return path


# ---- figures --------------------------------------------------------------------------------------------------

def group_runs(runs, label_by):
    """[(label, [run, ...])]: runs with equal configs apart from NOT_GROUPING keys form one group (their seeds), or,
    with label_by, runs with the same value of that config key."""
    configs = []
    for run in runs:
        if not os.path.isdir(run):
            raise PlotError(f"{run}: no such run directory")
        path = os.path.join(run, "config.json")
        # Without a config.json a run is a group of its own, named by its directory.
        cfg = read_json(path) if os.path.exists(path) or label_by else {"run": os.path.normpath(run)}
        if not isinstance(cfg, dict):
            raise PlotError(f"{path}: expected a JSON object")
        configs.append(cfg)
    groups = {}
    if label_by:
        for run, cfg in zip(runs, configs):
            if label_by not in cfg:
                raise MissingData(f"{os.path.join(run, 'config.json')}: no key '{label_by}' (--label-by)")
            groups.setdefault(f"{label_by}={cfg[label_by]}", []).append(run)
        return list(groups.items())
    keyed = [(json.dumps({k: v for k, v in cfg.items() if k not in NOT_GROUPING}, sort_keys=True), run, cfg)
             for run, cfg in zip(runs, configs)]
    for key, run, cfg in keyed:
        groups.setdefault(key, []).append((run, cfg))
    # A group is labelled by the config values that differ between groups (or its model / task when only one): the
    # fewest keys, taken in order (the telling ones first), that tell every group apart — a key is added only when it
    # separates groups the keys before it did not.
    cfgs = [members[0][1] for members in groups.values()]
    differing = {k for c in cfgs for k in c if k not in NOT_GROUPING and any(c.get(k) != d.get(k) for d in cfgs)}
    chosen, distinct = [], 1
    for k in sorted(differing, key=lambda k: (k not in ("model", "task", "run"), k)):
        n = len({json.dumps([c.get(key) for key in chosen + [k]]) for c in cfgs})
        if n > distinct:
            chosen.append(k)
            distinct = n
        if distinct == len(cfgs):
            break
    out = []
    for members in groups.values():
        cfg = members[0][1]
        keys = [k for k in chosen if k in cfg] or [k for k in ("model", "task") if k in cfg]
        label = ", ".join(f"{k}={cfg[k]}" for k in keys) or os.path.basename(os.path.normpath(members[0][0]))
        out.append((label, [run for run, _ in members]))
    return out


def aggregate(series):
    """Mean and sample standard deviation (ddof 1; 0 for a single run) over runs, at every step any run logged.
    series: [(steps, values)] -> (steps, mean, std, count)."""
    steps = np.unique(np.concatenate([s for s, _ in series])) if series else np.array([], dtype=np.int64)
    mean, std, count = [], [], []
    for st in steps:
        vals = np.array([v[s == st][0] for s, v in series if np.any(s == st)])
        mean.append(vals.mean())
        std.append(vals.std(ddof=1) if len(vals) > 1 else 0.0)
        count.append(len(vals))
    return steps, np.array(mean), np.array(std), np.array(count)


def fig_curves(args):
    splits = [s.strip() for s in args.split.split(",") if s.strip()]
    for s in splits:
        if s not in SPLITS:
            raise PlotError(f"--split: unknown split '{s}' (train, val, test)")
    groups = group_runs(args.runs, args.label_by)
    fig, ax = new_figure(args, 8, 5)
    styles = {"train": "-", "val": "--", "test": ":"}
    drawn = 0
    for gi, (label, runs) in enumerate(groups):
        metrics = [read_metrics(r) for r in runs]
        for split in splits:
            series = [metric_series(rows, args.metric, split) for rows in metrics]
            series = [(s, v) for s, v in series if len(s)]
            if not series:
                continue
            steps, mean, std, _ = aggregate(series)
            colour = f"C{gi % 10}"
            ax.plot(steps, mean, styles[split], color=colour, label=f"{label} · {split} (n = {len(series)})")
            if len(series) > 1:
                ax.fill_between(steps, mean - std, mean + std, color=colour, alpha=0.2, linewidth=0)
            drawn += 1
    if not drawn:
        plt.close(fig)
        raise MissingData(f"no run has '{args.metric}' on split(s) {', '.join(splits)}")
    ax.set_xlabel("step")
    ax.set_ylabel(args.metric.replace("_", " "))
    ax.set_title(f"{args.metric.replace('_', ' ')} over training: mean ± std over seeds (band)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save(fig, args.out)


def fig_decomposition(args):
    tensors, meta = read_safetensors(args.file)
    l, h = args.layer, args.head
    names = [("S_base", r"$S_{\mathrm{base}}$: $q \cdot k / \sqrt{d}$"), ("align", r"$\tilde\beta_{\mathrm{align}}$"),
             ("sep", r"$\tilde\beta_{\mathrm{sep}}$"), ("coh", r"$\tilde\beta_{\mathrm{coh}}$"),
             ("S", "S: total scores"), ("A", "A: attention probabilities")]
    layers = sorted({int(m.group(1)) for m in (re.match(r"L(\d+)\.", n) for n in tensors) if m})
    missing = [f"L{l}.{n}" for n, _ in names if f"L{l}.{n}" not in tensors]
    if missing:
        raise MissingData(f"{args.file}: no {', '.join(missing)} (layers in the file: {layers or 'none'})")
    mats = {}
    for n, _ in names:
        t = tensors[f"L{l}.{n}"]
        if t.ndim != 3 or t.shape[1] != t.shape[2] or t.shape != tensors[f"L{l}.S"].shape:
            raise PlotError(f"{args.file}: L{l}.{n} has shape {list(t.shape)}; expected (H, T, T) like L{l}.S")
        if not 0 <= h < t.shape[0]:
            raise MissingData(f"{args.file}: --head {h} out of range (layer {l} has {t.shape[0]} heads)")
        mats[n] = np.ma.masked_invalid(t[h].astype(np.float64))  # -inf (masked) entries are drawn blank
    mats["A"] = np.ma.masked_where(np.ma.getmaskarray(mats["S"]), mats["A"])  # masked keys: blank, not 0
    T = mats["S"].shape[0]
    tokens = tensors.get("tokens")
    fig, axes = new_figure(args, 24, 4.5, ncols=6)
    bias_max = max([float(np.abs(mats[n]).max()) for n in ("align", "sep", "coh") if mats[n].count()] + [1e-12])
    images = {}
    for ax, (n, title) in zip(axes, names):
        if n in ("align", "sep", "coh"):
            kw = dict(cmap="RdBu_r", vmin=-bias_max, vmax=bias_max)
        elif n == "A":
            kw = dict(cmap="magma", vmin=0.0, vmax=max(float(mats["A"].max()) if mats["A"].count() else 1.0, 1e-12))
        else:
            kw = dict(cmap="viridis")
        cmap = plt.get_cmap(kw.pop("cmap")).copy()
        cmap.set_bad("white")
        images[n] = ax.imshow(mats[n], cmap=cmap, interpolation="nearest", **kw)
        ax.set_title(title)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        if tokens is not None and tokens.shape == (T,) and T <= 32:
            ax.set_xticks(range(T), [str(int(t)) for t in tokens], fontsize="x-small")
            ax.set_yticks(range(T), [str(int(t)) for t in tokens], fontsize="x-small")
            ax.set_xlabel("key (token id)")
            ax.set_ylabel("query (token id)")
    fig.colorbar(images["S_base"], ax=axes[0], shrink=0.8, label="score")
    fig.colorbar(images["coh"], ax=list(axes[1:4]), shrink=0.8, label="bias (shared scale)")
    fig.colorbar(images["S"], ax=axes[4], shrink=0.8, label="score")
    fig.colorbar(images["A"], ax=axes[5], shrink=0.8, label="probability")
    what = f"example {meta.get('example', '?')}, label {meta.get('label', '?')}"
    fig.suptitle(f"ASCender attention decomposition — {what}, layer {l}, head {h} (blank = masked)")
    return save(fig, args.out)


def fig_omega(args):
    rows = read_metrics(args.run)
    layers = sorted(set().union(*[layers_with(rows, k) for k, _ in OMEGAS]))
    if not layers:
        raise MissingData(f"{args.run}: the metrics have no ASCender ω (mech L<l>.omega_align / _sep / _coh)")
    fig, axes = new_figure(args, 13, 2.75 * len(layers) + 0.75, nrows=len(layers), ncols=3, squeeze=False,
                           sharex=True)
    for li, l in enumerate(layers):
        for ci, (key, label) in enumerate(OMEGAS):
            ax = axes[li][ci]
            steps, vals = mech_series(rows, f"L{l}.{key}")
            if steps is not None:
                vals = vals.reshape(len(steps), -1)
                for hd in range(vals.shape[1]):
                    ax.plot(steps, vals[:, hd], label=f"head {hd}", color=f"C{hd % 10}")
                ax.legend(fontsize="x-small", ncol=2)
            else:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(f"layer {l}: {label}")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if li == len(layers) - 1:
                ax.set_xlabel("step")
    fig.suptitle("ASCender ω per layer and head over training")
    return save(fig, args.out)


def fig_heads(args):
    rows = read_metrics(args.run)
    layers = sorted(set().union(*[layers_with(rows, k) for k, _ in OMEGAS]))
    if not layers:
        raise MissingData(f"{args.run}: the metrics have no ASCender ω (mech L<l>.omega_align / _sep / _coh)")
    # The last step at which any ω was logged; each layer's ω from its last entry at or before it.
    labels, table, last = [], [], 0
    series = {(l, k): mech_series(rows, f"L{l}.{k}") for l in layers for k, _ in OMEGAS}
    last = max(int(s[-1]) for s, _ in series.values() if s is not None)
    for l in layers:
        cols = []
        for k, _ in OMEGAS:
            steps, vals = series[(l, k)]
            cols.append(np.full(1, np.nan) if steps is None else vals.reshape(len(steps), -1)[-1])
        heads = max(len(c) for c in cols)
        cols = [np.concatenate([c, np.full(heads - len(c), np.nan)]) for c in cols]
        for hd in range(heads):
            labels.append(f"L{l} h{hd}")
            table.append([c[hd] for c in cols])
    table = np.ma.masked_invalid(np.array(table))
    fig, ax = new_figure(args, 6, max(4.0, 0.375 * len(labels) + 1.5))
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("lightgrey")
    im = ax.imshow(table, cmap=cmap, aspect="auto", interpolation="nearest")
    for i in range(table.shape[0]):
        for j in range(3):
            if not np.ma.is_masked(table[i, j]):
                v = float(table[i, j])
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize="small",
                        color="white" if im.norm(v) < 0.5 else "black")
    ax.set_xticks(range(3), [label for _, label in OMEGAS])
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("bias term weight")
    ax.set_ylabel("layer, head")
    fig.colorbar(im, ax=ax, label="ω")
    ax.set_title(f"Head specialisation: ω per head at step {last}")
    return save(fig, args.out)


def fig_gate(args):
    rows = read_metrics(args.run)
    dump = os.path.join(args.run, "dumps", "asam_gate.safetensors")
    layers = layers_with(rows, "asam_gate")
    has_dump = os.path.exists(dump)
    if not layers and not has_dump:
        raise MissingData(f"{args.run}: no ASAM gate (mech L<l>.asam_gate) in the metrics and no {dump}")
    fig, axes = new_figure(args, 12 if has_dump else 6.5, 4.5, ncols=2 if has_dump else 1, squeeze=False)
    ax = axes[0][0]
    for l in layers:
        steps, vals = mech_series(rows, f"L{l}.asam_gate")
        ax.plot(steps, vals.reshape(len(steps), -1).mean(axis=1), label=f"layer {l}")
    if layers:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no gate in the metrics", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("mean gate")
    ax.set_title("ASAM gate over training (mean over samples and heads)")
    ax.grid(alpha=0.3)
    if has_dump:
        tensors, _ = read_safetensors(dump)
        gates = sorted(((int(m.group(1)), t) for n, t in tensors.items() if (m := re.fullmatch(r"L(\d+)\.gate", n))),
                       key=lambda p: p[0])
        if not gates:
            raise PlotError(f"{dump}: no L<l>.gate tensors")
        ax = axes[0][1]
        lo = min(0.0, min(float(t.min()) for _, t in gates))
        hi = max(1.0, max(float(t.max()) for _, t in gates))
        bins = np.linspace(lo, hi, 26)
        for l, t in gates:
            if t.ndim != 2:
                raise PlotError(f"{dump}: L{l}.gate has shape {list(t.shape)}; expected (samples, heads)")
            ax.hist(t.ravel().astype(np.float64), bins=bins, histtype="step", linewidth=1.5,
                    label=f"layer {l} ({t.shape[0]} samples × {t.shape[1]} heads)")
        ax.set_xlabel("gate value")
        ax.set_ylabel("count (sample, head)")
        ax.set_title("ASAM gate per test sample and head")
        ax.legend(fontsize="small")
    return save(fig, args.out)


def fig_bench_asam(args):
    path = args.csv
    try:
        with open(path, newline="") as f:
            records = list(csv.DictReader(f))
    except FileNotFoundError:
        raise PlotError(f"{path}: no such file")
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise PlotError(f"{path}: cannot read ({e})")
    need = ("impl", "n", "forward_ms", "fwd_bwd_ms", "peak_mb")
    if not records or any(c not in records[0] for c in need):
        raise PlotError(f"{path}: not a bench_asam --csv file (expected columns {', '.join(need)})")
    data = {}
    for i, r in enumerate(records, 2):
        vals = [number(r[c], f"{path}:{i} {c}") for c in need[1:]]
        if any(v is None for v in vals):
            raise PlotError(f"{path}:{i}: empty cell")
        data.setdefault(r["impl"], []).append(vals)
    fig, (ax_t, ax_m) = new_figure(args, 12, 4.75, ncols=2)
    palette = plt.get_cmap("tab10" if len(data) <= 10 else "tab20")
    legend = []  # one entry per implementation, the same colour in both panels
    for k, (impl, vals) in enumerate(data.items()):
        arr = np.array(sorted(vals))  # n, forward_ms, fwd_bwd_ms, peak_mb; negative = not measured (skipped)
        colour = palette(k % palette.N)
        for col, style in ((2, "-o"), (1, "--")):
            keep = arr[:, col] > 0
            if keep.any():
                ax_t.plot(arr[keep, 0], arr[keep, col], style, color=colour, markersize=4)
        keep = arr[:, 3] > 0
        if keep.any():
            ax_m.plot(arr[keep, 0], arr[keep, 3], "-o", color=colour, markersize=4)
        legend.append(plt.Line2D([], [], color=colour, marker="o", markersize=4, label=impl))
    for ax, ylabel, title in ((ax_t, "time (ms)", "Time vs sequence length (solid fwd+bwd, dashed fwd)"),
                              (ax_m, "peak memory (MB)", "Peak memory vs sequence length")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
    ax_m.legend(handles=legend, title="implementation", fontsize="x-small", ncol=2, loc="upper left")
    fig.suptitle(f"bench_asam: {os.path.basename(path)}")
    return save(fig, args.out)


def fig_firing(args):
    rows = read_metrics(args.run)
    dump = os.path.join(args.run, "dumps", "firing_rates.safetensors")
    layers = layers_with(rows, "firing_threshold")
    has_dump = os.path.exists(dump)
    if not layers and not has_dump:
        raise MissingData(f"{args.run}: no firing threshold (mech L<l>.firing_threshold) in the metrics and no {dump}")
    panels = int(has_dump) + int(bool(layers))
    fig, axes = new_figure(args, 12 if panels == 2 else 6.5, 4.5, ncols=panels, squeeze=False)
    axes = list(axes[0])
    if has_dump:
        tensors, _ = read_safetensors(dump)
        rates = sorted(((int(m.group(1)), t) for n, t in tensors.items() if (m := re.fullmatch(r"L(\d+)\.rate", n))),
                       key=lambda p: p[0])
        if not rates:
            raise PlotError(f"{dump}: no L<l>.rate tensors")
        ax = axes.pop(0)
        bins = np.linspace(0.0, 1.0, 21)
        for l, t in rates:
            ax.hist(np.clip(t.ravel().astype(np.float64), 0, 1), bins=bins, histtype="step", linewidth=1.5,
                    label=f"layer {l} ({t.size} neurons)")
        ax.set_xlabel("firing rate over the test set")
        ax.set_ylabel("neurons")
        ax.set_title("Firing-rate distribution per layer")
        ax.legend(fontsize="small")
    if layers:
        ax = axes.pop(0)
        for l in layers:
            steps, vals = mech_series(rows, f"L{l}.firing_threshold")
            ax.plot(steps, vals.reshape(len(steps), -1).mean(axis=1), color=f"C{l % 10}", label=f"layer {l} threshold")
        ax.set_xlabel("step")
        ax.set_ylabel("mean firing threshold (solid)")
        ax.set_title("Firing threshold (and rate) over training")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        rate_ax = None
        for l in layers:  # the rate has its own scale: a second y axis
            fs, fv = mech_series(rows, f"L{l}.firing_rate")
            if fs is not None:
                rate_ax = rate_ax or ax.twinx()
                line, = rate_ax.plot(fs, fv.reshape(len(fs), -1).mean(axis=1), ":", color=f"C{l % 10}",
                                     label=f"layer {l} firing rate")
                handles.append(line)
                labels.append(line.get_label())
        if rate_ax is not None:
            rate_ax.set_ylabel("mean firing rate (dotted)")
        (rate_ax or ax).legend(handles, labels, fontsize="small")  # on the top axes, above both sets of lines
    return save(fig, args.out)


def fig_all(args):
    run, out_dir = args.run, args.out_dir
    if not os.path.isdir(run):
        raise PlotError(f"{run}: no such run directory")
    read_metrics(run)  # a run without readable metrics has nothing to draw: say so once
    jobs = []

    def job(name, fn, **kw):
        jobs.append((name, fn, argparse.Namespace(dpi=args.dpi, out=os.path.join(out_dir, name + ".png"), **kw)))

    for metric in ("loss", "accuracy", "bits_per_byte"):
        job(f"curves_{metric}", fig_curves, runs=[run], metric=metric, split="train,val,test", label_by=None)
    job("omega", fig_omega, run=run)
    job("heads", fig_heads, run=run)
    job("gate", fig_gate, run=run)
    job("firing", fig_firing, run=run)
    dumps = sorted(glob.glob(os.path.join(run, "dumps", "decomposition_*.safetensors")))
    for d in dumps:
        name = os.path.basename(d)[:-len(".safetensors")]
        job(name, fig_decomposition, file=d, layer=0, head=0)
    if not dumps:
        print("plot.py all: skipped decomposition: no dumps/decomposition_*.safetensors")
    bench = os.path.join(run, "bench_asam.csv")
    if os.path.exists(bench):
        job("bench_asam", fig_bench_asam, csv=bench)
    written, failed = 0, 0
    for name, fn, a in jobs:
        try:
            fn(a)
            written += 1
        except MissingData as e:
            print(f"plot.py all: skipped {name}: {e}")
        except PlotError as e:
            print(f"plot.py: {e}", file=sys.stderr)
            failed += 1
    print(f"plot.py all: {written} figure(s) in {out_dir}")
    return 1 if failed else 0


# ---- command line -----------------------------------------------------------------------------------------------

def fig_xy(args):
    """Points (or lines, --lines) from a CSV with columns x, y and optionally yerr (an error bar) and group (one colour
    and legend entry per group): the experiments' Pareto fronts and accuracy-per-length curves."""
    try:
        with open(args.csv, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise PlotError(f"{args.csv}: {e.strerror}")
    if not rows or "x" not in rows[0] or "y" not in rows[0]:
        raise PlotError(f"{args.csv}: expected a header with columns x and y (and optionally yerr, group)")
    groups = {}
    for i, r in enumerate(rows):
        where = f"{args.csv} row {i + 2}"
        x, y = number(r["x"], where), number(r["y"], where)
        if x is None or y is None:
            raise PlotError(f"{where}: x and y must be numbers")
        e = number(r["yerr"], where) if r.get("yerr") not in (None, "") else 0.0
        groups.setdefault(r.get("group") or "", []).append((x, y, e))
    fig, ax = new_figure(args, 7, 5)
    for gi, (name, pts) in enumerate(groups.items()):
        pts.sort()
        xs, ys, es = (np.array(v, dtype=float) for v in zip(*pts))
        style = "-o" if args.lines else "o"
        ax.errorbar(xs, ys, yerr=es if es.any() else None, fmt=style, color=f"C{gi % 10}", capsize=3,
                    label=name or None)
    if args.logx:
        ax.set_xscale("log")
    ax.set_xlabel(args.xlabel)
    ax.set_ylabel(args.ylabel)
    if args.title:
        ax.set_title(args.title)
    ax.grid(alpha=0.3)
    if any(groups):
        ax.legend(fontsize="small")
    return save(fig, args.out)


def build_parser():
    p = argparse.ArgumentParser(prog="plot.py", description="Figures from ascender training runs and benchmarks "
                                "(docs/figures.md). PNG output, PDF when --out ends in .pdf.")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name, helptext, fn):
        s = sub.add_parser(name, help=helptext, description=helptext)
        s.set_defaults(fn=fn)
        s.add_argument("--dpi", type=int, default=100, help="pixels per inch (default 100)")
        return s

    s = add("curves", "loss / accuracy / bits per byte over steps, mean ± std over seeds per group and split",
            fig_curves)
    s.add_argument("runs", nargs="+", metavar="RUN")
    s.add_argument("--out", required=True, metavar="F")
    s.add_argument("--metric", default="loss", choices=("loss", "accuracy", "bits_per_byte"))
    s.add_argument("--split", default="train,val", help="comma-separated splits (train, val, test)")
    s.add_argument("--label-by", metavar="KEY", help="group runs by this config.json key instead of by their "
                   "whole config minus seed and git_commit")
    s = add("decomposition", "ASCender attention decomposition heatmaps of one dumped example", fig_decomposition)
    s.add_argument("file", metavar="FILE")
    s.add_argument("--out", required=True, metavar="F")
    s.add_argument("--layer", type=int, default=0)
    s.add_argument("--head", type=int, default=0)
    for name, helptext, fn in (("omega", "ω_align / ω_sep / ω_coh per layer and head over steps", fig_omega),
                               ("heads", "head specialisation: the three ω per layer and head at the last step",
                                fig_heads),
                               ("gate", "ASAM gate over training, and its per-(sample, head) histogram", fig_gate),
                               ("firing", "firing-rate histogram per layer and threshold trajectories", fig_firing)):
        s = add(name, helptext, fn)
        s.add_argument("run", metavar="RUN")
        s.add_argument("--out", required=True, metavar="F")
    s = add("bench-asam", "time and peak memory vs sequence length from bench_asam --csv", fig_bench_asam)
    s.add_argument("csv", metavar="CSV")
    s.add_argument("--out", required=True, metavar="F")
    s = add("xy", "points or lines from a CSV (columns x, y, optional yerr and group)", fig_xy)
    s.add_argument("csv", metavar="CSV")
    s.add_argument("--out", required=True, metavar="F")
    s.add_argument("--xlabel", default="x")
    s.add_argument("--ylabel", default="y")
    s.add_argument("--title", default="")
    s.add_argument("--lines", action="store_true", help="join each group's points (sorted by x)")
    s.add_argument("--logx", action="store_true", help="logarithmic x axis")
    s = add("all", "every figure the run's files allow (the others skipped with a note)", fig_all)
    s.add_argument("run", metavar="RUN")
    s.add_argument("--out-dir", required=True, metavar="D")
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if not 10 <= args.dpi <= 1000:
        p.error(f"--dpi must be in [10, 1000], got {args.dpi}")
    if getattr(args, "layer", 0) < 0 or getattr(args, "head", 0) < 0:
        p.error("--layer and --head must be >= 0")
    if np is None or not load_matplotlib():
        print(NO_MATPLOTLIB, file=sys.stderr)
        return 77
    try:
        status = args.fn(args)
    except PlotError as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 1
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
