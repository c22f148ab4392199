"""What the experiments share: a run (train flags + seed), an experiment (its runs at each scale and its report), the
results as data (each experiment's runs packed into two tables, and the readers of a run that take it from its folder
or from those tables), the resumable run queue, and the report helpers (the stats tool, plot.py, markdown tables).

Standard library only, so Debian's /usr/bin/python3 runs it as is; figures go through tools/plot.py (matplotlib).
experiments/README.md explains how to use the queue.
"""
from __future__ import annotations

import array
import atexit
import contextlib
import csv
import dataclasses
import fnmatch
import functools
import datetime
import gzip
import io
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
SCALES = ("tiny", "quick", "full")
# The directories whose last commit is "the version of the code" a result was produced with (results and docs
# commits do not change it). The queue refuses to mix versions inside one experiment unless told to.
# tools/plot.py is left out: it draws the results and cannot change them.
CODE_DIRS = ["core", "autograd", "ops", "cuda", "nn", "optim", "models", "data", "stats", "train", "tools",
             "CMakeLists.txt", ":(exclude)tools/plot.py"]


@dataclasses.dataclass
class Run:
    """One training run: `train` with these flags and this seed, in its own directory."""
    id: str                # unique inside the experiment and a relative path, e.g. "listops/ascender/s0"
    arm: str               # what is compared: runs of one arm differ only in the seed, e.g. "listops/ascender"
    seed: int
    args: list[str]        # train flags, without --seed and --out
    steps: int             # optimizer steps (for the time estimate)
    cost: float = 0.0      # estimated seconds per step on this machine (0: unknown)
    needs: list[str] = dataclasses.field(default_factory=list)  # files (relative to the root) it reads, made by
                                                                # other runs: it waits until they exist
    keep: list[str] = dataclasses.field(default_factory=list)  # files of the run that git keeps as files beside
                                                                # the tables: a model other runs evaluate, a dump a
                                                                # figure draws
    after: Callable[[Path], None] | None = None  # called on the run's directory when it is done, before it is packed:
                                                 # writes what the report needs of its model (which git does not keep)


@dataclasses.dataclass
class Experiment:
    name: str                                  # e.g. "e1_ascender_dense"
    title: str
    runs: Callable[[str], list[Run]]           # scale -> runs, in the order the queue runs them
    report: Callable[["Report"], str]          # -> markdown; figures through report.figure / report.plot


def tool(name: str) -> Path:
    """A built tool: $ASC_BUILD_DIR/tools/NAME, else the Release build, else the CPU-only build of README command (1)."""
    dirs = [Path(os.environ["ASC_BUILD_DIR"])] if os.environ.get("ASC_BUILD_DIR") else []
    dirs += [REPO / "build" / "release", REPO / "build" / "cpu"]
    for d in dirs:
        if (d / "tools" / name).exists():
            return d / "tools" / name
    raise SystemExit(f"experiments: no built {name} in {', '.join(map(str, dirs))}: build first "
                     "(cmake --preset release && cmake --build --preset release)")


@functools.lru_cache(maxsize=None)
def code_version() -> str:
    """The last commit of the code, with "+uncommitted" when the code's files differ from it: a run made from an
    edited tree is not recorded as the commit's, and the queue will not mix it with that commit's runs."""
    out = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%H", "--", *CODE_DIRS],
                         capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", *CODE_DIRS],
                           capture_output=True, text=True)
    return (out.stdout.strip() or "unknown") + ("+uncommitted" if dirty.stdout.strip() else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


# ---- files written whole -----------------------------------------------------------------------------------------
# Every file the workbench writes goes through write_atomic / atomic_open (write_json, the tables, the run folders
# written back, the queue's records and lock, the reports): the bytes go to <name>.tmp.<pid> in the file's own folder,
# are flushed and fsync'd, and that file is renamed over the name (os.replace: atomic on POSIX), then the folder is
# fsync'd. A reader, or a queue resumed after kill -9 or a power cut, finds the old file or the whole new one, never
# part of one. A write that fails (an exception, KeyboardInterrupt) removes its temporary file; one that kill -9
# leaves behind is removed by sweep_tmp (the queue sweeps a run's folder before running it). tools/plot.py, which
# runs without this module, has its own copy for its figures.

TMP_NAME = re.compile(r"\.tmp\.(\d+)$")  # <name>.tmp.<pid>


def tmp_path(path: Path) -> Path:
    """The temporary file that path is written to before it is renamed into place: same folder, this process's."""
    path = Path(path)
    return path.with_name(f"{path.name}.tmp.{os.getpid()}")


def _fsync_dir(folder: Path) -> None:
    """The rename itself made durable (best effort: not every file system syncs a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", *, gzip_level: int | None = None, mtime: int | None = None, **kw):
    """open(path, mode, **kw) for writing a whole file ("w", "wt" or "wb": appending cannot be atomic): the file
    appears under path, complete, only when the with-block ends without an exception; until then path keeps what it
    held. gzip_level: the file is gzip-compressed as gzip.open(path, mode, compresslevel=gzip_level, **kw) writes it
    (the header names path, not the temporary file; mtime None: now, as gzip.open; 0: no time, deterministic)."""
    if mode not in ("w", "wt", "wb"):
        raise ValueError(f"atomic_open: mode {mode!r} (only a whole file is written atomically: w, wt or wb)")
    path = Path(path)
    tmp = tmp_path(path)
    try:
        with open(tmp, "wb" if gzip_level is not None else mode, **({} if gzip_level is not None else kw)) as raw:
            if gzip_level is None:
                yield raw
            else:
                with gzip.GzipFile(filename=str(path), mode="wb", compresslevel=gzip_level, fileobj=raw,
                                   mtime=mtime) as gz:
                    if mode == "wb":
                        yield gz
                    else:
                        with io.TextIOWrapper(gz, encoding=io.text_encoding(kw.get("encoding")),
                                              errors=kw.get("errors"), newline=kw.get("newline")) as text:
                            yield text
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_atomic(path, data: bytes | str, encoding: str | None = None) -> None:
    """path's content replaced by data, whole or not at all (atomic_open); text in `encoding` (None: the locale's,
    as Path.write_text)."""
    if isinstance(data, str):
        with atomic_open(path, "w", encoding=encoding) as f:
            f.write(data)
    else:
        with atomic_open(path, "wb") as f:
            f.write(data)


def sweep_tmp(folder: Path) -> list[Path]:
    """Removes the temporary files (<name>.tmp.<pid>) that processes killed mid-write left in folder (not
    recursive); those of live processes stay. Returns what it removed."""
    removed = []
    for f in Path(folder).glob("*.tmp.*"):
        m = TMP_NAME.search(f.name)
        if not m or not f.is_file() or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # its writer is alive (or another user's process: left alone)
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        f.unlink(missing_ok=True)
        removed.append(f)
    return removed


def jsonl_rows(text: str) -> list:
    """The objects of a JSON-lines text (metrics.jsonl, which train appends to and a resumed run continues), one per
    non-blank line. A last line cut short (no line end and not valid JSON: its writer was killed mid-write) is
    dropped, as train drops it when it resumes; a malformed line elsewhere raises json.JSONDecodeError."""
    lines = text.splitlines(keepends=True)
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1 and not line.endswith(("\n", "\r")):
                break
            raise
    return rows


# ---- results as data ---------------------------------------------------------------------------------------------
# A study's results (experiments/README.md, "What is kept") are two tables per experiment, written by pack() from the
# run folders and read back here:
#   runs.jsonl.gz       one JSON object per finished run, sorted by run id: "run" (the id: its folder under the
#                       experiment's), one key per JSON file of the folder, named by its stem ("config", "summary",
#                       "queue", "weights", "cluster_metrics", "robustness": the file's object), "metrics"
#                       (metrics.csv's columns and rows as {"columns": [...], "rows": [[...], ...]}: numbers as numbers,
#                       an empty cell null; from metrics.jsonl where the folder has it, at full precision) and "log"
#                       (train.log without its progress bars)
#   predictions.csv.gz  every run's test predictions: "run", "seed", then predictions.csv's own columns (index, label,
#                       prediction, correct, loss), sorted by run and example
# Both are deterministic (sorted, gzip without a timestamp): packing the same runs again gives the same bytes. What
# a run keeps as files (Run.keep: models other runs evaluate, dumps a figure draws) stays at its place in the run's
# folder. Readers go through holds_run / run_json / run_metrics / run_dirs / state_of: a run's folder when it holds
# the run (it has the queue's queue.json: the run is under way, or finished on this machine), its experiment's
# tables otherwise. The tools that read run folders (stats compare, tools/plot.py) get one written from the tables
# (materialise).

RUNS_TABLE, PREDICTIONS_TABLE = "runs.jsonl.gz", "predictions.csv.gz"
PROGRESS_BAR = re.compile(r"\s\[[#-]+\]\s")  # train's progress lines: the log keeps the rest
LOG_LINES = 40                                # at most this many (the last) of them


def holds_run(d: Path) -> bool:
    """Whether the run's folder holds the run itself (the queue's record), not only the files it keeps."""
    return (d / "queue.json").exists()


def _cell(text: str):
    """A metrics.csv cell as data: an int, a finite float, None for an empty cell, else the text (the split)."""
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text  # nan / inf stay text: the table is strict JSON


def _cell_text(value) -> str:
    """_cell's inverse for a metrics.csv written back: the same number (repr round-trips a float exactly)."""
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)


def read_metrics(d: Path) -> dict | None:
    """A run folder's metrics as {"columns": [...], "rows": [[...], ...]}, metrics.csv's columns and rows: from
    metrics.jsonl where the folder has it (the same rows at full precision, which tools/plot.py reads first; a
    per-head list becomes the columns "<name>.h<i>", as in the CSV), else from metrics.csv (ten significant digits)."""
    if (d / "metrics.jsonl").exists():
        columns, rows = {}, []
        with open(d / "metrics.jsonl") as f:
            records = jsonl_rows(f.read())  # without a last line cut short (train killed mid-write)
        for raw in records:
            row = {k: v for k, v in raw.items() if k != "mech"}
            for name, v in (raw.get("mech") or {}).items():
                row.update({f"{name}.h{i}": x for i, x in enumerate(v)} if isinstance(v, list) else {name: v})
            row = {k: repr(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
            columns.update(dict.fromkeys(row))
            rows.append(row)
        return {"columns": list(columns), "rows": [[row.get(c) for c in columns] for row in rows]} if rows else None
    try:
        with open(d / "metrics.csv", newline="") as f:
            rows = list(csv.reader(f))
    except OSError:
        return None
    return {"columns": rows[0], "rows": [[_cell(c) for c in row] for row in rows[1:]]} if rows else None


def _read_predictions(d: Path) -> tuple[list[str], list[list[str]]] | None:
    """(columns, rows as text) of a run folder's predictions.csv(.gz); None without one (an LM run)."""
    for name, opener in (("predictions.csv.gz", gzip.open), ("predictions.csv", open)):
        if (d / name).exists():
            with opener(d / name, "rt", newline="") as f:
                rows = [row for row in csv.reader(f) if row]
            return (rows[0], rows[1:]) if rows else None
    return None


class Tables:
    """An experiment's two tables, read: records (run id -> its runs.jsonl record) and, parsed on first use,
    predictions() (run id -> (columns, rows as text), the run's part of predictions.csv.gz)."""

    def __init__(self, exp_dir: Path):
        self.exp_dir = exp_dir
        self.records: dict[str, dict] = {}
        if (exp_dir / RUNS_TABLE).exists():
            with gzip.open(exp_dir / RUNS_TABLE, "rt", encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        record = json.loads(line)
                        self.records[record["run"]] = record
        self._predictions = None

    def predictions(self) -> dict[str, tuple[list[str], list[list[str]]]]:
        if self._predictions is None:
            self._predictions = {}
            if (self.exp_dir / PREDICTIONS_TABLE).exists():
                with gzip.open(self.exp_dir / PREDICTIONS_TABLE, "rt", encoding="utf-8", newline="") as f:
                    reader = csv.reader(f)
                    header = next(reader, ["run", "seed"])
                    columns = header[2:]
                    for row in reader:
                        if row:
                            self._predictions.setdefault(row[0], (columns, []))[1].append(row[2:])
        return self._predictions


_TABLES: dict[Path, tuple[tuple, Tables]] = {}


def tables(exp_dir: Path) -> Tables:
    """The experiment's tables, read once per version of their files (the queue rewrites them as runs finish)."""
    key = tuple((p.stat().st_mtime_ns, p.stat().st_size) if p.exists() else None
                for p in (exp_dir / RUNS_TABLE, exp_dir / PREDICTIONS_TABLE))
    cached = _TABLES.get(exp_dir)
    if cached is None or cached[0] != key:
        cached = _TABLES[exp_dir] = (key, Tables(exp_dir))
    return cached[1]


def _table_of(d: Path) -> tuple[Path, str] | None:
    """(experiment folder, run id) of the tables that record the run whose folder is d: the nearest folder above d
    that has a runs table, when that table has the run."""
    for exp_dir in d.parents:
        if (exp_dir / RUNS_TABLE).exists():
            run_id = d.relative_to(exp_dir).as_posix()
            return (exp_dir, run_id) if run_id in tables(exp_dir).records else None
    return None


def table_record(d: Path) -> dict | None:
    """The runs-table record of the run whose folder is d (None when no table records it)."""
    found = _table_of(d)
    return tables(found[0]).records[found[1]] if found else None


def run_json(d: Path, name: str):
    """One of a run's JSON files by its name (summary.json, config.json, queue.json, weights.json,
    cluster_metrics.json, robustness.json): from the run's folder when that holds the run, else from its experiment's
    runs table; None when the run has no such file."""
    if holds_run(d):
        return read_json(d / name)
    record = table_record(d)
    return None if record is None or not name.endswith(".json") else record.get(name[:-len(".json")])


def run_metrics(d: Path) -> list[dict]:
    """The run's metrics.csv rows as {column: value}: numbers as numbers, an empty cell None (from its folder or
    its experiment's runs table, as run_json)."""
    metrics = read_metrics(d) if holds_run(d) else (table_record(d) or {}).get("metrics")
    return [dict(zip(metrics["columns"], row)) for row in metrics["rows"]] if metrics else []


def has_run_file(path: Path) -> bool:
    """A file that exists, or one of a run's JSON files that its experiment's runs table holds (a run's `needs`)."""
    return path.exists() or (path.suffix == ".json" and run_json(path.parent, path.name) is not None)


def run_dirs(exp_dir: Path, pattern: str) -> list[Path]:
    """The folders (whether or not they are on this machine) of the experiment's runs whose ids match a glob pattern
    segment by segment ("listops/dense/s*"): the run folders here and the runs its tables record, sorted."""
    parts = pattern.split("/")

    def match(run_id):
        ids = run_id.split("/")
        return len(ids) == len(parts) and all(fnmatch.fnmatchcase(i, p) for i, p in zip(ids, parts))
    found = {d.relative_to(exp_dir).as_posix() for d in exp_dir.glob(pattern) if holds_run(d)}
    found |= {run_id for run_id in tables(exp_dir).records if match(run_id)}
    return sorted(exp_dir / run_id for run_id in found)


def code_versions(exp_dir: Path) -> set:
    """The code versions the experiment's runs were made with (their queue records: folders and tables)."""
    records = [read_json(p) for p in exp_dir.glob("**/queue.json")]
    records += [r.get("queue") for r in tables(exp_dir).records.values()]
    return {r.get("code_version") for r in records if r}


def pack_run(d: Path, run_id: str) -> tuple[dict, tuple[list[str], list[list[str]]] | None]:
    """A finished run folder as its runs-table record and its predictions (columns, rows)."""
    record = {"run": run_id}
    first = ("config", "summary", "queue", "weights", "cluster_metrics", "robustness")  # a fixed order, the rest after
    for f in sorted(d.glob("*.json"), key=lambda f: (first.index(f.stem) if f.stem in first else len(first), f.stem)):
        record[f.stem] = read_json(f)
    metrics = read_metrics(d)
    if metrics:
        record["metrics"] = metrics
    if (d / "train.log").exists():
        # the progress bars are the bulk of a log and say nothing the metrics do not; the paths are made relative to
        # the repository, so that the record does not depend on where the clone lies
        lines = [line.replace(f"{REPO}/", "") for line in (d / "train.log").read_text(errors="replace").splitlines()
                 if line.strip() and not PROGRESS_BAR.search(line)]
        record["log"] = lines[-LOG_LINES:]
    return record, _read_predictions(d)


def _gzip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as f:  # no name, no time
        f.write(data)
    return buf.getvalue()


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    write_atomic(path, data)
    return True


def pack(exp_dir: Path, drop: tuple[str, ...] = ()) -> bool:
    """(Re)writes an experiment's two tables from the runs they record and the finished run folders under exp_dir (a
    folder replaces the table's record of its run: it is what the queue just ran), less the runs `drop` names (ids).
    Returns whether a table changed. Deterministic: the same runs give the same bytes, whether packed at once or one
    finished run at a time."""
    sweep_tmp(exp_dir)  # a table half-written by a pack that kill -9 stopped
    old = tables(exp_dir)
    records = {run_id: r for run_id, r in old.records.items() if run_id not in drop}
    predictions = {run_id: old.predictions().get(run_id) for run_id in records}
    for queue_file in exp_dir.glob("**/queue.json"):
        d = queue_file.parent
        run_id = d.relative_to(exp_dir).as_posix()
        if state_of(d) == "done" and run_id not in drop:
            records[run_id], predictions[run_id] = pack_run(d, run_id)
    if not records:
        changed = False
        for name in (RUNS_TABLE, PREDICTIONS_TABLE):
            if (exp_dir / name).exists() and old.records:  # every run dropped
                (exp_dir / name).unlink()
                changed = True
        _TABLES.pop(exp_dir, None)
        return changed
    lines = "".join(json.dumps(records[run_id], ensure_ascii=False, separators=(",", ":")) + "\n"
                    for run_id in sorted(records))
    changed = _write_if_changed(exp_dir / RUNS_TABLE, _gzip(lines.encode()))
    columns = []  # every run's columns, in the order they first appear (the runs of one experiment share them)
    for run_id in sorted(records):
        for c in (predictions.get(run_id) or ([], []))[0]:
            if c not in columns:
                columns.append(c)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["run", "seed", *columns])
    for run_id in sorted(records):
        if not predictions.get(run_id):
            continue
        cols, rows = predictions[run_id]
        at = {c: i for i, c in enumerate(cols)}
        seed = (records[run_id].get("summary") or {}).get("seed", "")
        if "index" in at:
            rows = sorted(rows, key=lambda r: int(r[at["index"]]))
        if cols != columns:  # a run without a column the others have: an empty cell
            rows = [[row[at[c]] if c in at and at[c] < len(row) else "" for c in columns] for row in rows]
        w.writerows([run_id, seed, *row] for row in rows)
    changed |= _write_if_changed(exp_dir / PREDICTIONS_TABLE, _gzip(out.getvalue().encode()))
    _TABLES.pop(exp_dir, None)  # read again on next use, whatever the file system's time resolution
    return changed


def unpack_run(record: dict, predictions: tuple[list[str], list[list[str]]] | None, out: Path) -> Path:
    """A runs-table record (and its predictions) written back as a run folder: the JSON files, metrics.csv,
    predictions.csv.gz and the log's short form; what stats compare and tools/plot.py read of a run."""
    out.mkdir(parents=True, exist_ok=True)
    for key, value in record.items():
        if key == "metrics":
            with atomic_open(out / "metrics.csv", "w", newline="") as f:
                w = csv.writer(f, lineterminator="\n")
                w.writerow(value["columns"])
                w.writerows([[_cell_text(v) for v in row] for row in value["rows"]])
        elif key == "log":
            write_atomic(out / "train.log", "".join(line + "\n" for line in value))
        elif key != "run":
            write_json(out / f"{key}.json", value)
    if predictions:
        with atomic_open(out / "predictions.csv.gz", "wt", gzip_level=9, newline="") as f:  # as gzip.open
            csv.writer(f, lineterminator="\n").writerows([predictions[0], *predictions[1]])
    return out


_SCRATCH: list[Path] = []
_MATERIALISED: dict[tuple, Path] = {}


def materialise(path: Path) -> Path:
    """A run folder for the tools that read folders (stats compare, tools/plot.py): the folder itself when it holds
    the run's files (or a plain file: plot.py's other inputs), else one written from its experiment's tables into a
    temporary directory (removed at exit), under the run's own id, so its folder name is the original's, with links
    to the files the run keeps."""
    if path.is_file() or (path / "summary.json").exists():
        return path
    found = _table_of(path)
    if not found:
        return path
    exp_dir, run_id = found
    t = tables(exp_dir)
    key = (exp_dir, run_id, _TABLES[exp_dir][0])
    if key not in _MATERIALISED:
        if not _SCRATCH:
            _SCRATCH.append(Path(tempfile.mkdtemp(prefix="experiments-runs-")))
            atexit.register(shutil.rmtree, _SCRATCH[0], True)
        out = unpack_run(t.records[run_id], t.predictions().get(run_id),
                         _SCRATCH[0] / str(len(_MATERIALISED)) / run_id)
        for f in path.rglob("*") if path.is_dir() else []:  # the files the run keeps (plot.py firing reads its dump)
            if f.is_file() and not (out / f.relative_to(path)).exists():
                (out / f.relative_to(path)).parent.mkdir(parents=True, exist_ok=True)
                (out / f.relative_to(path)).symlink_to(f.resolve())
        _MATERIALISED[key] = out
    return _MATERIALISED[key]


# ---- the run queue ---------------------------------------------------------------------------------------------

def run_dir(root: Path, exp: Experiment, run: Run) -> Path:
    return root / exp.name / run.id


def state_of(d: Path) -> str:
    """done (summary.json and the queue's record), partial (a checkpoint to resume), failed, or pending. A run its
    folder does not hold is as its experiment's runs table records it (done, or not there: pending)."""
    if not holds_run(d) and table_record(d) is not None:
        return "done"  # the tables hold finished runs only (pack)
    record = read_json(d / "queue.json") or {}
    if (d / "summary.json").exists() and record.get("state") == "done":
        return "done"
    if record.get("state") == "failed":
        return "failed"
    if (d / "ckpt" / "last.safetensors").exists():
        return "partial"
    return "pending"


def estimate(root: Path, exp: Experiment, run: Run, all_runs: list[Run]) -> float:
    """Seconds the run will take: the mean wall time of its arm's finished runs on this machine (per step, times its
    steps: evaluation included), else its steps times the cost per step measured beforehand, scaled by how far the
    experiment's finished runs took longer than that cost said (the cost comes from short runs without evaluation:
    experiment 2's first arms took 2× their cost)."""
    per_step, wall, predicted = [], 0.0, 0.0
    for other in all_runs:  # the experiment's runs at the scale being run
        if not other.steps:
            continue
        rec = run_json(run_dir(root, exp, other), "queue.json") or {}
        if rec.get("state") != "done" or not rec.get("wall_s"):
            continue
        if other.arm == run.arm:
            per_step.append(rec["wall_s"] / other.steps)
        if other.cost:
            wall, predicted = wall + rec["wall_s"], predicted + other.steps * other.cost
    if per_step:
        return run.steps * sum(per_step) / len(per_step)
    return run.steps * run.cost * (wall / predicted if predicted else 1.0)


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_safetensors(path: Path) -> dict[str, tuple[list[int], array.array]]:
    """A safetensors file's float32 / float64 tensors: name -> (shape, flat values). Standard library only (the
    format: an 8-byte little-endian header length, a JSON header of dtype / shape / byte offsets, the raw data)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        code = {"F32": "f", "F64": "d"}.get(t.get("dtype")) if name != "__metadata__" else None
        if code:
            start, end = t["data_offsets"]
            values = array.array(code)
            values.frombytes(raw[8 + n + start:8 + n + end])
            if sys.byteorder != "little":
                values.byteswap()
            out[name] = (t["shape"], values)
    return out


def write_json(path: Path, value) -> None:
    write_atomic(path, json.dumps(value, indent=1) + "\n")


def _end_torn_line(path: Path) -> None:
    """A log that a resumed run appends to, ended with a line end first when a killed run left its last line cut
    short (train was killed mid-write): the resumed run's first line is not glued to the fragment."""
    try:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) not in (b"\n", b"\r")
    except OSError:  # no log yet, or an empty one
        return
    if torn:
        with open(path, "ab") as f:
            f.write(b"\n")


def fmt_duration(s: float) -> str:
    if s == float("inf"):
        return "no limit"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Queue:
    """Runs the pending and partial runs of some experiments in order, each resumable, until a deadline.

    At the deadline the running `train` gets SIGINT: it finishes its step, writes its checkpoint and exits 130; the
    next `run` resumes it bit-identically. A finished run is packed into its experiment's tables (pack), which can be
    committed at once with the files the run keeps (commit=True), so a session that ends loses nothing finished."""

    def __init__(self, root: Path, scale: str, threads: int = 0, commit: bool = False, allow_mixed: bool = False,
                 log=print, progress_every: float = 0, launcher: list[str] | None = None):
        self.root, self.scale, self.threads, self.commit = root, scale, threads, commit
        self.progress_every = progress_every  # > 0: show train's progress lines (every that many seconds) too
        # e.g. ["mpirun", "-np", "2"]: each run a job of several processes (docs/train.md), the same run as one process
        self.launcher = launcher or []
        self.allow_mixed, self.log = allow_mixed, log
        self.version = code_version()
        self.interrupted = False
        self._runs_of: dict[str, list[Run]] = {}

    def runs(self, exps: list[Experiment]):
        for exp in exps:
            for run in self.runs_of(exp):
                yield exp, run

    def runs_of(self, exp: Experiment) -> list[Run]:
        """The experiment's runs at this scale (made once: they are read for every run's time estimate)."""
        if exp.name not in self._runs_of:
            self._runs_of[exp.name] = exp.runs(self.scale)
        return self._runs_of[exp.name]

    def check_version(self, exp: Experiment) -> None:
        other = code_versions(self.root / exp.name) - {self.version, None}
        if other and not self.allow_mixed:
            raise SystemExit(f"queue: {exp.name} has runs made with code version {', '.join(sorted(other))} and the "
                             f"code is now at {self.version}; one experiment runs on one version of the code. Rerun "
                             f"them (delete {self.root / exp.name}) or pass --allow-mixed-versions.")

    def run(self, exps: list[Experiment], deadline: float) -> bool:
        """Returns True when every run is done (or failed); False when the deadline or a signal stopped the queue, or
        when runs are left waiting for inputs that other runs have not made (yet, or ever: a failed run's)."""
        for exp in exps:
            self.check_version(exp)
        # SIGINT, SIGTERM and SIGHUP (a closed terminal, the end of a session) all stop the running train the same
        # way: it writes its checkpoint and exits; nothing is left running without the queue.
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        waiting = []
        try:
            for exp, run in self.runs(exps):
                d = run_dir(self.root, exp, run)
                if state_of(d) in ("done", "failed"):
                    continue
                if not all(has_run_file(self.root / n) for n in run.needs):
                    waiting.append(f"{exp.name}/{run.id}")
                    continue
                if self.interrupted or time.time() >= deadline:
                    return False
                # A new run that its estimate (with a quarter to spare) says cannot finish before the deadline is not
                # started: the budget usually ends with the session, and a run cut short costs its checkpoint's
                # commit and a resume on the next machine. A partial run resumes whatever is left.
                need = estimate(self.root, exp, run, self.runs_of(exp))
                if state_of(d) == "pending" and need and time.time() + 1.25 * need > deadline:
                    self.log(f"queue: {exp.name}/{run.id}: needs ~{fmt_duration(need)}, more than "
                             f"the budget left ({fmt_duration(deadline - time.time())}); stopping here")
                    return False
                if not self._one(exp, run, d, deadline, need):
                    return False
            if waiting:
                self.log(f"queue: {len(waiting)} run(s) wait for the outputs of others, e.g. {waiting[0]} "
                         f"(their model files; a fresh clone has none: rerun those runs first)")
            return not waiting
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)

    def _on_signal(self, *_):
        self.interrupted = True

    def _one(self, exp: Experiment, run: Run, d: Path, deadline: float, need: float) -> bool:
        train = tool("train")
        record = read_json(d / "queue.json") or {"code_version": self.version, "parts": []}
        args = [a.replace("{root}", str(self.root)) for a in run.args]
        if state_of(d) == "partial":
            cmd = [str(train), "--out", str(d), "--resume"]
        else:
            if d.exists():
                shutil.rmtree(d)  # a run that died before its first checkpoint starts again
            d.parent.mkdir(parents=True, exist_ok=True)
            cmd = [str(train), *args, "--seed", str(run.seed), "--out", str(d)]
        cmd += ["--progress-every", str(self.progress_every or 60)]
        if self.threads:
            cmd += ["--threads", str(self.threads)]
        cmd = [*self.launcher, *cmd]
        out = d.relative_to(REPO) if d.is_relative_to(REPO) else d
        # the record names paths inside the repository relative to it, so that a report reads the same in any checkout
        shown = [a.replace("{root}/", "") for a in run.args]
        record["command"] = " ".join([*self.launcher, "train", *shown, "--seed", str(run.seed), "--out", str(out)])
        left = deadline - time.time()
        self.log(f"queue: {exp.name}/{run.id}: {'resuming' if '--resume' in cmd else 'starting'} "
                 f"({run.steps} steps, ~{fmt_duration(need) if need else '?'}; "
                 f"budget left: {fmt_duration(left)})")
        start = time.time()
        d.mkdir(parents=True, exist_ok=True)
        lock = d / "queue.lock"  # another queue (another terminal) running this very run: leave it alone
        if lock.exists():
            try:
                os.kill(int(lock.read_text().split()[0]), 0)
                self.log(f"queue: {exp.name}/{run.id}: being run by process {lock.read_text().split()[0]}; skipped")
                return True
            except (ValueError, IndexError, ProcessLookupError, PermissionError):
                pass  # a stale lock: its queue is gone
        write_atomic(lock, f"{os.getpid()}\n")  # never an empty lock: the pid or no file
        sweep_tmp(d)  # what a queue killed mid-write left (a partial run's folder is committed whole)
        _end_torn_line(d / "train.log")
        stopping = False
        try:
            with open(d / "train.log", "a") as log:  # train's output, continued by a resumed run
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                shown = log.tell()
                try:
                    while proc.poll() is None:
                        time.sleep(0.5)
                        if not stopping and (self.interrupted or time.time() >= deadline):
                            proc.send_signal(signal.SIGINT)  # train saves its checkpoint and exits 130
                            stopping = True
                        if self.progress_every:  # train's plain progress lines, as they come
                            log.flush()
                            with open(d / "train.log") as f:
                                f.seek(shown)
                                new = f.read()
                                shown = f.tell()
                            for line in new.splitlines():
                                if line.strip():
                                    self.log(f"  {run.id}: {line.strip()}")
                finally:
                    if proc.poll() is None:  # the queue itself failed: never leave train running unsupervised
                        proc.send_signal(signal.SIGINT)
                        try:
                            proc.wait(timeout=120)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                            proc.wait()
        finally:
            lock.unlink(missing_ok=True)
        rc = proc.returncode
        elapsed = time.time() - start
        record["parts"].append({"start": datetime.datetime.fromtimestamp(start).isoformat(timespec="seconds"),
                                "seconds": round(elapsed, 1), "exit": rc, "cpu": cpu_model()})
        record["code_version"] = record.get("code_version", self.version)
        if rc == 0 and (d / "summary.json").exists():
            record["state"] = "done"
            record["wall_s"] = round(sum(p["seconds"] for p in record["parts"]), 1)
            self._finish(d)
            if run.after:
                run.after(d)
            write_json(d / "queue.json", record)
            pack(self.root / exp.name)
            self.log(f"queue: {exp.name}/{run.id}: done in {fmt_duration(elapsed)}")
            if self.commit:
                self._commit(exp, run, d)
            return True
        if rc == 130 or stopping:  # stopped by us: resumable, whatever the exit code (a signal during its set-up)
            has_ckpt = (d / "ckpt" / "last.safetensors").exists()
            record["state"] = "partial" if has_ckpt else "pending"
            write_json(d / "queue.json", record)
            self.log(f"queue: {exp.name}/{run.id}: stopped at the deadline"
                     + (", checkpoint saved" if has_ckpt else ", before its first checkpoint") +
                     f" ({fmt_duration(elapsed)})")
            if self.commit and has_ckpt:
                self._commit(exp, run, d, partial=True)
            return False
        record["state"] = "failed"
        write_json(d / "queue.json", record)
        tail = (d / "train.log").read_text(errors="replace").splitlines()[-5:]
        self.log(f"queue: {exp.name}/{run.id}: FAILED (exit {rc}):\n  " + "\n  ".join(tail))
        return True  # go on with the next run

    @staticmethod
    def _finish(d: Path) -> None:
        """predictions.csv -> predictions.csv.gz (the folder's form of it; pack reads either)."""
        p = d / "predictions.csv"
        if p.exists():
            with open(p, "rb") as src, atomic_open(str(p) + ".gz", "wb", gzip_level=9) as dst:  # as gzip.open
                shutil.copyfileobj(src, dst)
            p.unlink()

    def _commit(self, exp: Experiment, run: Run, d: Path, partial: bool = False) -> None:
        # In the repository that holds the results, one commit of just this run's changes, whatever else is staged.
        # A done run: its experiment's tables and the files it keeps (run.keep: a model that other runs evaluate, a
        # dump a figure draws; .gitignore leaves them out, so they are added with -f); what an earlier partial commit
        # brought of its folder leaves the tree (it stays on the disk: the folder is the full form of the tables).
        # A run stopped at the deadline (partial) is committed whole, checkpoint and models included (about 1.5 MB for
        # the study's models): the next session may be another machine, which resumes it from the clone.
        # The commit is built in a temporary index (git commit --only cannot record a file that leaves the index but
        # stays on the disk); the real index then takes these paths as committed and keeps the rest as it was. Runs
        # whose tables git ignores (the tiny and quick scales) or that lie outside a repository are not committed.
        exp_dir = self.root / exp.name

        def git(*a, env=None):
            return subprocess.run(["git", "-C", str(exp_dir), *a], capture_output=True, text=True, env=env)
        top = git("rev-parse", "--show-toplevel").stdout.strip()
        if not top or git("check-ignore", "-q", str(exp_dir / RUNS_TABLE)).returncode == 0:
            self.log(f"queue: {exp.name}/{run.id}: not committed: {exp_dir} is "
                     + ("ignored by git" if top else "outside a git repository"))
            return
        rel = lambda p: os.path.relpath(Path(p).resolve(), Path(top).resolve())  # noqa: E731
        if partial:
            add, remove = [rel(d)], []
        else:
            add = [rel(exp_dir / name) for name in (RUNS_TABLE, PREDICTIONS_TABLE) if (exp_dir / name).exists()]
            add += [rel(d / f) for f in run.keep if (d / f).exists()]
            kept = {rel(d / f) for f in run.keep}
            remove = [f for f in git("-C", top, "ls-files", "--", rel(d)).stdout.splitlines() if f not in kept]
        what = "partial: its checkpoint, to resume" if partial else "done"
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
            steps = [("read-tree", "HEAD"), ("add", "-f", "--", *add)]
            if remove:
                steps.append(("rm", "-q", "--cached", "--ignore-unmatch", "--", *remove))
            for step in steps:
                r = git("-C", top, *step, env=env)
                if r.returncode != 0:
                    self.log(f"queue: {exp.name}/{run.id}: not committed: git {step[0]}: {r.stderr.strip()}")
                    return
            if git("-C", top, "diff", "--cached", "--quiet", "HEAD", env=env).returncode == 0:
                return  # nothing of this run's changed
            r = git("-C", top, "commit", "-q", "-m", f"experiments: {exp.name}/{run.id} ({self.scale}) {what}",
                    env=env)
            if r.returncode != 0:
                self.log(f"queue: {exp.name}/{run.id}: not committed: git commit: {r.stderr.strip()}")
                return
        git("-C", top, "reset", "-q", "HEAD", "--", *add, *remove)


# ---- reports -----------------------------------------------------------------------------------------------------

class Report:
    """What an experiment's report function gets: its runs and their directories, the stats tool, figure paths."""

    def __init__(self, exp: Experiment, root: Path, scale: str, out_dir: Path):
        self.exp, self.root, self.scale, self.out_dir = exp, root, scale, out_dir
        self.runs = exp.runs(scale)
        self.fig_dir = out_dir / exp.name
        self.figures: list[str] = []
        # The figures other pages quote, keyed (e.g. facts["verdicts"]["listops"]["verdict"]), each as the report
        # prints it: written beside the report as <name>.json, where tests/doc_quotes_test.py reads them.
        self.facts: dict = {}
        self.draw = True  # False: figures are not redrawn (those already in FIG_DIR are referenced)

    def fact(self, section: str, key: str, value) -> None:
        self.facts.setdefault(section, {})[key] = value

    def arm_facts(self) -> None:
        """Every arm's test accuracy over its finished runs, under facts["arms"]: mean and sample std in % as the
        reports print them (2 and 1 decimals), and the number of runs."""
        for arm in self.arms():
            acc = [v for v in (self.summary(d).get("test_accuracy") for d in self.done(arm)) if v is not None]
            if not acc:
                continue
            mean = sum(acc) / len(acc)
            std = (sum((v - mean) ** 2 for v in acc) / (len(acc) - 1)) ** 0.5 if len(acc) > 1 else None
            self.fact("arms", arm, {"n": len(acc), "mean": pct(mean), "mean_1": pct(mean, 1), "std": pct(std),
                                    "min": pct(min(acc)), "max": pct(max(acc))})

    def dir(self, run: Run) -> Path:
        return run_dir(self.root, self.exp, run)

    def report_path(self) -> Path:
        """Where the report is written (and the one it replaces lies)."""
        return self.out_dir / f"{self.exp.name}.md"

    def done(self, arm: str) -> list[Path]:
        """The finished runs of an arm."""
        return [self.dir(r) for r in self.runs if r.arm == arm and state_of(self.dir(r)) == "done"]

    def arms(self) -> list[str]:
        return list(dict.fromkeys(r.arm for r in self.runs))

    def summary(self, d: Path) -> dict:
        return run_json(d, "summary.json") or {}

    def by_seed(self, arm: str, key: str) -> dict:
        """{seed directory ("s0", …): its summary's key} over the arm's finished runs, in seed order: the view to set
        two arms side by side seed by seed (one seed's runs share initialisation and data order)."""
        return {d.name: self.summary(d).get(key) for d in self.done(arm)}

    def compare(self, a: str, b: str, metric: str = "test_accuracy") -> dict | None:
        """stats compare between two arms' finished runs (None when either has none)."""
        return self.compare_dirs(self.done(a), self.done(b), a, b, metric)

    def compare_seeds(self, a: str, b: str, metric: str = "test_accuracy") -> dict | None:
        """stats compare on the seeds both arms have finished: while an experiment is part-run, an arm that lacks a
        seed is not set against the other arm's mean over more seeds (one seed's runs share initialisation and data
        order, and the seeds differ by more than the arms do). The same as compare once both arms are complete."""
        da, db = self.done(a), self.done(b)
        both = {d.name for d in da} & {d.name for d in db}
        return self.compare_dirs([d for d in da if d.name in both], [d for d in db if d.name in both], a, b, metric)

    def compare_dirs(self, da: list[Path], db: list[Path], a: str, b: str, metric: str = "test_accuracy",
                     strict: bool = True) -> dict | None:
        """stats compare between two lists of finished run directories (of any experiment). strict=False: None when
        stats refuses them (runs of another experiment evaluated on other test examples) instead of stopping."""
        if not da or not db:
            return None
        out = self.fig_dir / f"compare_{a}_vs_{b}.json".replace("/", "-")
        self.fig_dir.mkdir(parents=True, exist_ok=True)
        da, db = [materialise(d) for d in da], [materialise(d) for d in db]  # stats reads run folders
        cmd = [str(tool("stats")), "compare", "--a", *map(str, da), "--b", *map(str, db), "--metric", metric,
               "--a-name", a, "--b-name", b, "--json", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            if not strict:
                return None
            raise SystemExit(f"report: stats compare {a} vs {b} failed: {r.stderr.strip()}")
        result = json.loads(out.read_text())
        out.unlink()  # the report keeps the figures it prints; the JSON is regenerated on demand
        self.fact("comparisons", f"{a} vs {b}", comparison_facts(result))
        return result

    def stats(self, requests: list[dict]) -> list:
        out = subprocess.run([str(tool("stats")), "json"], input=json.dumps(requests), capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"report: stats json failed: {out.stderr.strip()}")
        return json.loads(out.stdout)

    def kept_figure(self, name: str) -> str | None:
        """A figure already in FIG_DIR/NAME.png, not redrawn: for figures drawn from dumps that git does not keep (the
        machine that ran the study drew them; redrawing from the tables would lose what the dumps added)."""
        png = self.fig_dir / f"{name}.png"
        if not png.exists():
            return None
        self.figures.append(png.name)
        return f"{self.exp.name}/{png.name}"

    def plot(self, kind: str, run_dirs: list[Path], name: str, *extra: str) -> str | None:
        """tools/plot.py KIND over run directories into FIG_DIR/NAME.png; the relative path, or None without matplotlib
        or without a run to draw (an experiment not run yet)."""
        if not run_dirs:
            return None
        if not self.draw:  # report --no-figures: the figure already there, as it is
            return self.kept_figure(name)
        self.fig_dir.mkdir(parents=True, exist_ok=True)
        png = self.fig_dir / f"{name}.png"
        runs = [str(materialise(d)) for d in run_dirs]  # plot.py reads run folders
        cmd = [python_with_matplotlib(), str(REPO / "tools" / "plot.py"), kind, *runs, "--out", str(png), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 77:
            return None
        if r.returncode != 0:
            raise SystemExit(f"report: plot.py {kind} failed: {r.stderr.strip()}")
        self.figures.append(png.name)
        return f"{self.exp.name}/{png.name}"


def python_with_matplotlib() -> str:
    """Debian's python3 has matplotlib (python3-matplotlib); a pyenv or venv python3 earlier on PATH may not."""
    return "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def fmt_mean_std(values: list[float], digits: int = 2, scale: float = 100.0) -> str:
    if not values:
        return "—"
    m = sum(values) / len(values)
    if len(values) == 1:
        return f"{m * scale:.{digits}f}"
    sd = (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return f"{m * scale:.{digits}f} ± {sd * scale:.{digits}f}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pct(v, digits=2) -> str:
    """A fraction as a percentage (or a difference of fractions in points), as the reports print it; "—" for None."""
    return "—" if v is None else f"{100 * v:.{digits}f}"


def signed(v, digits=2) -> str:
    return "—" if v is None else f"{100 * v:+.{digits}f}"


def comparison_facts(cmp: dict) -> dict:
    """The figures of a `stats compare` result as the reports print them (accuracies in %, differences in points):
    what other pages may quote (Report.facts)."""
    w, pb, paired = cmp.get("welch_t_test") or {}, cmp.get("paired_bootstrap") or {}, cmp.get("seed_paired_t_test") or {}
    ga, gb = cmp["group_a"], cmp["group_b"]
    mdes = [m for m in (cmp.get("mde_seeds"), cmp.get("mde_examples")) if m is not None]
    bl = cmp.get("baseline_learns") or {}
    return {"a": cmp.get("a"), "b": cmp.get("b"), "seeds_a": ga["n"], "seeds_b": gb["n"],
            "a_mean": pct(ga["mean"]), "a_std": pct(ga.get("std")), "b_mean": pct(gb["mean"]),
            "b_std": pct(gb.get("std")), "a_mean_1": pct(ga["mean"], 1), "b_mean_1": pct(gb["mean"], 1),
            "difference": signed(cmp.get("difference")), "difference_1": signed(cmp.get("difference"), 1),
            "seeds_interval": f"[{pct(w.get('low'))}, {pct(w.get('high'))}]", "welch_p": fmt_p(w.get("p")),
            "seed_paired_p": fmt_p(paired.get("p")) if paired else "—",
            "examples_interval": f"[{pct(pb.get('low'))}, {pct(pb.get('high'))}]" if pb else "—",
            "paired_p": fmt_p(pb.get("p")) if pb else "—", "test_examples": cmp.get("test_examples"),
            "mde_seeds": pct(cmp.get("mde_seeds"), 1), "mde_examples": pct(cmp.get("mde_examples"), 1),
            "mde": pct(max(mdes), 1) if mdes else "—",
            "baseline_learns_p": fmt_p(bl.get("p")) if bl else "—",
            "majority_rate": pct(bl.get("majority_rate")) if bl else "—"}


def fmt_p(p) -> str:
    if p is None:
        return "—"
    if p == 0:
        return "< 1e-300"  # below the smallest double the tests compute
    return f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"
