"""What the experiments share: a run (train flags + seed), an experiment (its runs at each scale and its report), the
resumable run queue, and the report helpers (the stats tool, plot.py, markdown tables).

Standard library only, so Debian's /usr/bin/python3 runs it as is; figures go through tools/plot.py (matplotlib).
experiments/README.md explains how to use the queue.
"""
from __future__ import annotations

import array
import dataclasses
import functools
import datetime
import gzip
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
SCALES = ("tiny", "quick", "full")
# The directories whose last commit is "the version of the code" a result was produced with (results and docs
# commits do not change it). The queue refuses to mix versions inside one experiment unless told to.
# tools/plot.py is left out: it draws the results and cannot change them.
CODE_DIRS = ["core", "autograd", "ops", "cuda", "nn", "optim", "models", "data", "stats", "tools", "CMakeLists.txt",
             ":(exclude)tools/plot.py"]


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
    keep: list[str] = dataclasses.field(default_factory=list)  # files of the run that .gitignore leaves out and git
                                                                # keeps all the same: a model other runs evaluate
    after: Callable[[Path], None] | None = None  # called on the run's directory when it is done, before the commit:
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


# ---- the run queue ---------------------------------------------------------------------------------------------

def run_dir(root: Path, exp: Experiment, run: Run) -> Path:
    return root / exp.name / run.id


def state_of(d: Path) -> str:
    """done (summary.json and the queue's record), partial (a checkpoint to resume), failed, or pending."""
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
        rec = read_json(run_dir(root, exp, other) / "queue.json") or {}
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
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    tmp.replace(path)


def fmt_duration(s: float) -> str:
    if s == float("inf"):
        return "no limit"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Queue:
    """Runs the pending and partial runs of some experiments in order, each resumable, until a deadline.

    At the deadline the running `train` gets SIGINT: it finishes its step, writes its checkpoint and exits 130; the
    next `run` resumes it bit-identically. A finished run's light files (config, metrics, summary, predictions
    gzipped) can be committed at once (commit=True), so a session that ends loses nothing finished."""

    def __init__(self, root: Path, scale: str, threads: int = 0, commit: bool = False, allow_mixed: bool = False,
                 log=print, progress_every: float = 0):
        self.root, self.scale, self.threads, self.commit = root, scale, threads, commit
        self.progress_every = progress_every  # > 0: show train's progress lines (every that many seconds) too
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
        versions = {r.get("code_version") for r in (read_json(p) for p in (self.root / exp.name).glob("**/queue.json"))
                    if r}
        other = versions - {self.version, None}
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
                if not all((self.root / n).exists() for n in run.needs):
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
        record["command"] = " ".join(["train", *args, "--seed", str(run.seed), "--out", str(d.relative_to(REPO)
                                     if d.is_relative_to(REPO) else d)])
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
        lock.write_text(f"{os.getpid()}\n")
        stopping = False
        try:
            with open(d / "train.log", "a") as log:
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
                                "seconds": round(elapsed, 1), "exit": rc})
        record["code_version"] = record.get("code_version", self.version)
        if rc == 0 and (d / "summary.json").exists():
            record["state"] = "done"
            record["wall_s"] = round(sum(p["seconds"] for p in record["parts"]), 1)
            self._finish(d)
            if run.after:
                run.after(d)
            write_json(d / "queue.json", record)
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
        """predictions.csv -> predictions.csv.gz (what the stats tool reads and git keeps)."""
        p = d / "predictions.csv"
        if p.exists():
            with open(p, "rb") as src, gzip.open(str(p) + ".gz", "wb", compresslevel=9) as dst:
                shutil.copyfileobj(src, dst)
            p.unlink()

    def _commit(self, exp: Experiment, run: Run, d: Path, partial: bool = False) -> None:
        # In the repository that holds the run. The directory, not its files one by one: git then leaves out what
        # .gitignore names (checkpoints, models). --only: just this run's files, whatever else is staged. A run that
        # git ignores (the tiny and quick scales) or that lies outside a repository is not committed: a warning.
        # A run stopped at the deadline (partial) is committed whole, checkpoint and models included (git add -f,
        # about 1.5 MB for the study's models): the next session may be another machine, which resumes it from the
        # clone. When it is done, those files leave the tree again (they stay in the history), except the ones the
        # run keeps (run.keep: a model that other runs evaluate, which another machine needs as well).
        git = lambda *a: subprocess.run(["git", "-C", str(d), *a], capture_output=True, text=True)  # noqa: E731
        if git("check-ignore", "-q", ".").returncode == 0:
            self.log(f"queue: {exp.name}/{run.id}: not committed: git ignores {d}")
            return
        steps = [("add", "-f", "--", ".") if partial else ("add", "--", ".")]
        if not partial:
            kept = [f for f in run.keep if (d / f).exists()]
            if kept:
                steps.append(("add", "-f", "--", *kept))
            # What a partial commit brought in and a done run does not keep (its checkpoint): out of the tree and
            # off the disk (a done run is not resumed), so that the commit below records its removal.
            dropped = [f for f in git("ls-files", "-ci", "--exclude-standard", "--", ".").stdout.split()
                       if f not in run.keep]
            if dropped:
                steps.append(("rm", "-q", "-f", "--", *dropped))
        what = "partial: its checkpoint, to resume" if partial else "done"
        steps.append(("commit", "-q", "--only", "-m", f"experiments: {exp.name}/{run.id} ({self.scale}) {what}", "--",
                      "."))
        for step in steps:
            if step[0] == "commit" and not git("diff", "--cached", "--name-only", "--", ".").stdout.split():
                return
            r = git(*step)
            if r.returncode != 0:
                self.log(f"queue: {exp.name}/{run.id}: not committed: git {step[0]}: {r.stderr.strip()}")
                return


# ---- reports -----------------------------------------------------------------------------------------------------

class Report:
    """What an experiment's report function gets: its runs and their directories, the stats tool, figure paths."""

    def __init__(self, exp: Experiment, root: Path, scale: str, out_dir: Path):
        self.exp, self.root, self.scale, self.out_dir = exp, root, scale, out_dir
        self.runs = exp.runs(scale)
        self.fig_dir = out_dir / exp.name
        self.figures: list[str] = []

    def dir(self, run: Run) -> Path:
        return run_dir(self.root, self.exp, run)

    def done(self, arm: str) -> list[Path]:
        """The finished runs of an arm."""
        return [self.dir(r) for r in self.runs if r.arm == arm and state_of(self.dir(r)) == "done"]

    def arms(self) -> list[str]:
        return list(dict.fromkeys(r.arm for r in self.runs))

    def summary(self, d: Path) -> dict:
        return read_json(d / "summary.json") or {}

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
        cmd = [str(tool("stats")), "compare", "--a", *map(str, da), "--b", *map(str, db), "--metric", metric,
               "--a-name", a, "--b-name", b, "--json", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            if not strict:
                return None
            raise SystemExit(f"report: stats compare {a} vs {b} failed: {r.stderr.strip()}")
        result = json.loads(out.read_text())
        out.unlink()  # the report keeps the figures it prints; the JSON is regenerated on demand
        return result

    def stats(self, requests: list[dict]) -> list:
        out = subprocess.run([str(tool("stats")), "json"], input=json.dumps(requests), capture_output=True, text=True,
                             check=True)
        return json.loads(out.stdout)

    def plot(self, kind: str, run_dirs: list[Path], name: str, *extra: str) -> str | None:
        """tools/plot.py KIND over run directories into FIG_DIR/NAME.png; the relative path, or None without matplotlib
        or without a run to draw (an experiment not run yet)."""
        if not run_dirs:
            return None
        self.fig_dir.mkdir(parents=True, exist_ok=True)
        png = self.fig_dir / f"{name}.png"
        cmd = [python_with_matplotlib(), str(REPO / "tools" / "plot.py"), kind, *map(str, run_dirs), "--out", str(png),
               *extra]
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


def fmt_p(p) -> str:
    if p is None:
        return "—"
    return f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"
