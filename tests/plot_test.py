#!/usr/bin/env python3
"""Tests of tools/plot.py on the fixture run pair tests/data/plot_fixture (tests/data/make_plot_fixture.py).

    python3 tests/plot_test.py        # CTest: plot_figures; exit 0 passed, 1 failed, 77 matplotlib missing (skipped)

(1) Without matplotlib (hidden by a stub package first on PYTHONPATH) every subcommand says so and exits 77, writing
nothing. (2) The numbers behind the figures against independent computations: the safetensors reader on a file
built by hand here, the JSONL and CSV readers against each other, the seed grouping, mean ± std against the
statistics module. (3) Each subcommand writes a PNG with a valid signature and the documented pixel size (IHDR), a
PDF for .pdf. (4) Missing or malformed inputs exit 1 with one line naming the file; bad flags exit 2.
"""
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "tools", "plot.py")
FIXTURE = os.path.join(HERE, "data", "plot_fixture")
SEED0, SEED1 = os.path.join(FIXTURE, "seed0"), os.path.join(FIXTURE, "seed1")
DECOMP = os.path.join(SEED0, "dumps", "decomposition_3.safetensors")
BENCH = os.path.join(FIXTURE, "bench_asam.csv")
NO_MPL = ("plot.py: matplotlib is not installed (apt-get install python3-matplotlib); the run's data files are "
          "unaffected")

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}")


def plot(*args, env=None):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, env=env)


def png_size(path):
    """(width, height) from the IHDR chunk, which must follow the 8-byte signature; None if not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def expect_png(r, path, size, what):
    check(r.returncode == 0, f"{what}: exit {r.returncode}: {r.stderr.strip()}")
    check(path in r.stdout, f"{what}: the path written is not printed: {r.stdout.strip()}")
    check(os.path.exists(path) and png_size(path) == size,
          f"{what}: {path} is not a {size[0]}x{size[1]} PNG (got {png_size(path) if os.path.exists(path) else None})")


def expect_error(r, code, needle, what):
    lines = r.stderr.strip().splitlines()
    check(r.returncode == code, f"{what}: exit {r.returncode}, expected {code}: {r.stderr.strip()}")
    check("Traceback" not in r.stderr, f"{what}: a traceback: {r.stderr.strip()}")
    if code == 1:
        check(len(lines) == 1 and lines[0].startswith("plot.py: ") and needle in lines[0],
              f"{what}: expected one line naming '{needle}', got {lines}")
    else:
        check("usage" in r.stderr and needle in r.stderr, f"{what}: no usage mentioning '{needle}': {lines}")


def test_without_matplotlib(tmp):
    stub = os.path.join(tmp, "hide", "matplotlib")
    os.makedirs(stub)
    with open(os.path.join(stub, "__init__.py"), "w") as f:
        f.write("raise ImportError('matplotlib hidden by tests/plot_test.py')\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(stub))
    out = os.path.join(tmp, "nompl")
    for argv in (["curves", SEED0, SEED1, "--out", out + "/c.png"], ["decomposition", DECOMP, "--out", out + "/d.png"],
                 ["omega", SEED0, "--out", out + "/o.png"], ["heads", SEED0, "--out", out + "/h.png"],
                 ["gate", SEED0, "--out", out + "/g.png"], ["bench-asam", BENCH, "--out", out + "/b.png"],
                 ["firing", SEED0, "--out", out + "/f.png"], ["all", SEED0, "--out-dir", out]):
        r = plot(*argv, env=env)
        check(r.returncode == 77 and r.stderr.strip() == NO_MPL,
              f"no matplotlib, {argv[0]}: exit {r.returncode}, stderr {r.stderr.strip()!r}")
    check(not os.path.exists(out), "no matplotlib: something was written")


def test_numbers(tmp):
    sys.path.insert(0, os.path.join(HERE, "..", "tools"))
    sys.dont_write_bytecode = True  # no tools/__pycache__ in the source tree
    import numpy as np
    import plot as P

    # The safetensors reader on a file assembled by hand (two dtypes, metadata, an unpadded header)...
    a = np.arange(6, dtype="<f4").reshape(2, 3) / 7
    b = np.array([-1, 2**40], dtype="<i8")
    header = json.dumps({"b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]},
                         "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                         "__metadata__": {"example": "5"}}).encode()
    path = os.path.join(tmp, "hand.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + a.tobytes() + b.tobytes())
    t, meta = P.read_safetensors(path)
    check(meta == {"example": "5"} and np.array_equal(t["a"], a) and np.array_equal(t["b"], b),
          "read_safetensors: values differ from the hand-built file")
    with open(path, "wb") as f:  # ...and one whose offsets do not fit the shape
        f.write(struct.pack("<Q", len(header)) + header + a.tobytes())
    try:
        P.read_safetensors(path)
        check(False, "read_safetensors: a truncated file was accepted")
    except P.PlotError as e:
        check(path in str(e), f"read_safetensors: the error does not name the file: {e}")

    # JSONL and CSV are the same rows: read each alone.
    csv_only = os.path.join(tmp, "csv_only")
    os.makedirs(csv_only)
    shutil.copy(os.path.join(SEED0, "metrics.csv"), csv_only)
    from_jsonl, from_csv = P.read_metrics(SEED0), P.read_metrics(csv_only)
    check(from_jsonl == from_csv, "metrics.csv and metrics.jsonl of seed0 read differently")
    check(from_jsonl[0]["mech"]["L1.omega_sep"] == json.loads(open(os.path.join(SEED0, "metrics.jsonl"))
                                                             .readlines()[0])["mech"]["L1.omega_sep"],
          "a per-head list does not survive reading")

    # Mean ± sample std over the two seeds, recomputed from the JSONL lines with the statistics module.
    raw = {}
    for run in (SEED0, SEED1):
        for line in open(os.path.join(run, "metrics.jsonl")):
            r = json.loads(line)
            if r["split"] == "val":
                raw.setdefault(r["step"], []).append(r["loss"])
    series = [P.metric_series(P.read_metrics(run), "loss", "val") for run in (SEED0, SEED1)]
    steps, mean, std, count = P.aggregate(series)
    check(list(steps) == sorted(raw), f"aggregate: steps {list(steps)} != {sorted(raw)}")
    for s, m, sd, n in zip(steps, mean, std, count):
        check(abs(m - statistics.mean(raw[s])) < 1e-12 and abs(sd - statistics.stdev(raw[s])) < 1e-12 and n == 2,
              f"aggregate at step {s}: {m} ± {sd} != {statistics.mean(raw[s])} ± {statistics.stdev(raw[s])}")
    # The accuracy at step 0 of train is null: not an entry of the series.
    s_acc, _ = P.metric_series(from_jsonl, "accuracy", "train")
    check(0 not in list(s_acc), "a null accuracy became a value")

    # Grouping: the two seeds are one group; a copy with another model is a second group, labelled by it.
    other = os.path.join(tmp, "other_model")
    shutil.copytree(SEED1, other)
    cfg = json.load(open(os.path.join(other, "config.json")))
    cfg["model"], cfg["seed"] = "dense", 7
    json.dump(cfg, open(os.path.join(other, "config.json"), "w"))
    groups = P.group_runs([SEED0, SEED1, other], None)
    check(sorted((label, len(runs)) for label, runs in groups) == [("model=ascender", 2), ("model=dense", 1)],
          f"group_runs: {groups}")
    # Groups that differ in many keys: the label names the fewest that tell them apart, however far down the list.
    variants = []
    base = {"eta_f": 0.0, "eta_w": 0.0, "firing_init": "signed", "rule": "none"}
    for name, changes in (("v_a", base), ("v_b", {"eta_f": 0.1, "eta_w": 0.1, "firing_init": "nonnegative", "rule": "A"}),
                          ("v_c", {"eta_f": 0.1, "eta_w": 0.1, "firing_init": "nonnegative", "rule": "B"})):
        d = os.path.join(tmp, name)
        shutil.copytree(SEED1, d)
        cfg = json.load(open(os.path.join(d, "config.json")))
        cfg.update(changes)
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        variants.append(d)
    labels = [label for label, _ in P.group_runs(variants, None)]
    check(sorted(labels) == ["eta_f=0.0, rule=none", "eta_f=0.1, rule=A", "eta_f=0.1, rule=B"],
          f"group_runs: every group told apart, by the fewest keys: {labels}")
    groups = P.group_runs([SEED0, SEED1, other], "task")
    check([(label, len(runs)) for label, runs in groups] == [("task=listops", 3)], f"group_runs --label-by: {groups}")
    return other


def test_figures(tmp, other):
    out = os.path.join(tmp, "figs")
    f = lambda name: os.path.join(out, name)  # noqa: E731
    expect_png(plot("curves", SEED0, SEED1, other, "--out", f("curves.png")), f("curves.png"), (800, 500), "curves")
    expect_png(plot("curves", SEED0, SEED1, "--out", f("acc.png"), "--metric", "accuracy", "--split", "train,val,test",
                    "--label-by", "model"), f("acc.png"), (800, 500), "curves accuracy --label-by")
    expect_png(plot("decomposition", DECOMP, "--out", f("dec.png"), "--layer", "1", "--head", "1"), f("dec.png"),
               (2400, 450), "decomposition")
    expect_png(plot("omega", SEED0, "--out", f("omega.png")), f("omega.png"), (1300, 625), "omega")  # 2 layers
    expect_png(plot("heads", SEED1, "--out", f("heads.png")), f("heads.png"), (600, 400), "heads")  # 4 rows
    expect_png(plot("gate", SEED0, "--out", f("gate.png")), f("gate.png"), (1200, 450), "gate with the dump")
    expect_png(plot("gate", SEED1, "--out", f("gate1.png")), f("gate1.png"), (650, 450), "gate without a dump")
    expect_png(plot("bench-asam", BENCH, "--out", f("bench.png")), f("bench.png"), (1200, 475), "bench-asam")
    expect_png(plot("firing", SEED0, "--out", f("firing.png")), f("firing.png"), (1200, 450), "firing")
    xy = os.path.join(tmp, "xy.csv")
    with open(xy, "w") as fh:
        fh.write("x,y,yerr,group\n64,0.5,0.01,dense\n128,0.4,,dense\n64,0.55,0.02,ascender\n")
    expect_png(plot("xy", xy, "--out", f("xy.png"), "--lines", "--logx"), f("xy.png"), (700, 500), "xy")
    with open(xy, "w") as fh:
        fh.write("x,y\n1,abc\n")
    expect_error(plot("xy", xy, "--out", f("xy2.png")), 1, "expected a number", "xy with a bad value")
    expect_png(plot("omega", SEED0, "--out", f("omega200.png"), "--dpi", "200"), f("omega200.png"), (2600, 1250),
               "omega --dpi 200")
    r = plot("heads", SEED0, "--out", f("heads.pdf"))
    check(r.returncode == 0 and open(f("heads.pdf"), "rb").read(5) == b"%PDF-", "heads .pdf is not a PDF")
    r = plot("all", SEED0, "--out-dir", f("all"))
    check(r.returncode == 0, f"all: exit {r.returncode}: {r.stderr.strip()}")
    sizes = {"curves_loss": (800, 500), "curves_accuracy": (800, 500), "omega": (1300, 625), "heads": (600, 400),
             "gate": (1200, 450), "firing": (1200, 450), "decomposition_3": (2400, 450)}
    for name, size in sizes.items():
        p = os.path.join(out, "all", name + ".png")
        check(os.path.exists(p) and png_size(p) == size, f"all: {name}.png missing or not {size}")
    check("skipped curves_bits_per_byte" in r.stdout, f"all: no note for the absent bits_per_byte: {r.stdout}")
    check(sorted(os.listdir(os.path.join(out, "all"))) == sorted(n + ".png" for n in sizes), "all: unexpected files")


def test_errors(tmp):
    e = os.path.join(tmp, "err")
    bad_run = os.path.join(tmp, "bad_run")
    os.makedirs(bad_run)
    shutil.copy(os.path.join(SEED0, "config.json"), bad_run)
    with open(os.path.join(bad_run, "metrics.jsonl"), "w") as f:
        f.write('{"step": 0, "split": "train", "loss": 1.0}\n{"step": 10, "split": \n')
    bad_st = os.path.join(tmp, "bad.safetensors")
    with open(bad_st, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at al}")
    bad_csv = os.path.join(tmp, "bench.csv")
    with open(bad_csv, "w") as f:
        f.write("a,b\n1,2\n")
    plain_run = os.path.join(tmp, "plain_run")  # a run of a model without any mechanism
    os.makedirs(plain_run)
    with open(os.path.join(plain_run, "metrics.jsonl"), "w") as f:
        f.write('{"step": 0, "split": "train", "loss": 1.0, "mech": {}}\n')
    missing = os.path.join(tmp, "no_such_run")
    for argv, needle in (
            (["omega", missing, "--out", e + "/o.png"], missing),
            (["curves", SEED0, missing, "--out", e + "/c.png"], missing),
            (["curves", bad_run, "--out", e + "/c.png"], "metrics.jsonl:2"),
            (["curves", SEED0, "--out", e + "/c.png", "--metric", "bits_per_byte"], "bits_per_byte"),
            (["curves", SEED0, "--out", e + "/c.png", "--label-by", "optimizer"], "optimizer"),
            (["curves", SEED0, "--out", e + "/c.png", "--split", "train,dev"], "dev"),
            (["decomposition", bad_st, "--out", e + "/d.png"], bad_st),
            (["decomposition", os.path.join(tmp, "none.safetensors"), "--out", e + "/d.png"], "none.safetensors"),
            (["decomposition", DECOMP, "--out", e + "/d.png", "--head", "2"], "--head 2"),
            (["decomposition", DECOMP, "--out", e + "/d.png", "--layer", "5"], "L5.S_base"),
            (["omega", plain_run, "--out", e + "/o.png"], "omega_align"),
            (["heads", plain_run, "--out", e + "/h.png"], "omega_align"),
            (["gate", plain_run, "--out", e + "/g.png"], "asam_gate"),
            (["firing", plain_run, "--out", e + "/f.png"], "firing_threshold"),
            (["bench-asam", bad_csv, "--out", e + "/b.png"], bad_csv),
            (["bench-asam", os.path.join(tmp, "none.csv"), "--out", e + "/b.png"], "none.csv"),
            (["all", missing, "--out-dir", e], missing)):
        expect_error(plot(*argv), 1, needle, " ".join(argv[:1] + [os.path.basename(a) for a in argv[1:]]))
    check(not os.path.exists(e), "an error case wrote a figure")
    for argv, needle in ((["omega", SEED0], "--out"), (["sideways", SEED0], "invalid choice"), ([], "usage"),
                         (["decomposition", DECOMP, "--out", "x.png", "--layer", "x"], "--layer"),
                         (["curves", SEED0, "--out", "x.png", "--metric", "f1"], "--metric"),
                         (["gate", SEED0, "--out", "x.png", "--dpi", "0"], "--dpi"),
                         (["decomposition", DECOMP, "--out", "x.png", "--head", "-1"], "--head")):
        expect_error(plot(*argv), 2, needle, f"bad flags {argv}")


def main():
    with tempfile.TemporaryDirectory(prefix="asc_plot_test_") as tmp:
        test_without_matplotlib(tmp)
        try:
            import matplotlib  # noqa: F401 (only whether it imports)
        except ImportError:
            print("plot_test.py: matplotlib is not installed: the figure tests are skipped (the no-matplotlib path "
                  "passed)" if not failures else "plot_test.py: the no-matplotlib path failed")
            return 1 if failures else 77
        other = test_numbers(tmp)
        test_figures(tmp, other)
        test_errors(tmp)
    if failures:
        print(f"plot_test.py: {len(failures)} check(s) failed")
        return 1
    print("plot_test.py: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
