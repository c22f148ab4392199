#!/usr/bin/env python3
"""Every shell command of README.md runs: the ```sh blocks are read from the README itself (so a command added there
without a way to run it here fails this test), each run small in a scratch directory.

  ASC_BUILD_DIR=build/release python3 tests/readme_commands_test.py

How each command runs:
  bash tools/run_demo.sh    with ASC_DEMO_BUILD_DIR (this build: no set-up, no second build), ASC_DEMO_SCALE=tiny
                            and ASC_DEMO_ROOT in the scratch directory: the same queue, experiment and report
  bash tools/run_tests.sh   not here: it is this suite (CI runs it, .ci/run)
  ./build/release/tools/X   the build's tool X; `train` gets flags appended that make every run tiny (the last
                            flag given wins: fewer steps and examples, a small model, short sequences)
  other lines               as written (tools/plot.py, loops), in the scratch directory, where runs/ is written;
                            my_data/train.tsv is made there for the file task
Commands the README gives inline (not in a ```sh block) are checked elsewhere: cmake --install / cpack / pkg-config by
tools/check_package.sh (CTest package_example), `stats compare` and `experiments/queue.py run` by
tests/experiments_test.py, tools/gpu_check.sh only on a GPU, tools/format.sh --check and run_tests.sh --sanitize by CI.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = ("--steps 3 --train-size 64 --val-size 32 --test-size 32 --batch 8 --d-model 16 --heads 2 --layers 1 "
        "--ffn 32 --min-len 16 --max-len 64 --progress none --threads 2")
NOT_HERE = {"bash tools/run_tests.sh": "this suite itself (CI runs it)"}


def sh_blocks(readme: str) -> list[str]:
    """The README's shell commands: the lines of its ```sh blocks, comments stripped, continuation lines joined."""
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", readme, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def main() -> int:
    build = Path(os.environ.get("ASC_BUILD_DIR", REPO / "build" / "release")).resolve()
    if not (build / "tools" / "train").exists():
        print(f"readme_commands: no {build}/tools/train (set ASC_BUILD_DIR)", file=sys.stderr)
        return 2
    if not Path("/usr/share/datasets/fashion-mnist").exists() and not os.environ.get("ASC_FMNIST_DIR"):
        print("readme_commands: skipped: the README's commands read Fashion-MNIST (apt-get install "
              "dataset-fashion-mnist)")
        return 77
    commands = sh_blocks((REPO / "README.md").read_text())
    if not commands:
        print("readme_commands: README.md has no ```sh block", file=sys.stderr)
        return 1
    failures = 0
    with tempfile.TemporaryDirectory(prefix="asc_readme_") as tmp:
        work = Path(tmp)
        # What the commands name, in a scratch directory: the build's tools behind build/release/, a wrapper that makes
        # every train run tiny, the repository's tools/ and experiments/, a file task's data.
        (work / "build" / "release" / "tools").mkdir(parents=True)
        for tool in (build / "tools").iterdir():
            if tool.is_file() and os.access(tool, os.X_OK) and tool.name != "train":
                (work / "build" / "release" / "tools" / tool.name).symlink_to(tool)
        wrapper = work / "build" / "release" / "tools" / "train"
        wrapper.write_text(f'#!/bin/sh\nexec "{build}/tools/train" "$@" {TINY}\n')
        wrapper.chmod(0o755)
        (work / "tools").symlink_to(REPO / "tools")
        (work / "experiments").symlink_to(REPO / "experiments")
        (work / "my_data").mkdir()
        (work / "my_data" / "train.tsv").write_text(
            "".join(f"{i % 2}\t{'good fine great' if i % 2 else 'bad poor awful'} example {i}\n" for i in range(400)))
        env = dict(os.environ, OMP_NUM_THREADS="2", ASC_BUILD_DIR=str(build))
        for cmd in commands:
            if cmd in NOT_HERE:
                print(f"--   {cmd}: {NOT_HERE[cmd]}")
                continue
            run_env = dict(env)
            if cmd == "bash tools/run_demo.sh":
                run_env.update(ASC_DEMO_BUILD_DIR=str(build), ASC_DEMO_SCALE="tiny",
                               ASC_DEMO_ROOT=str(work / "runs" / "quick-experiment"))
                cmd_run = f"bash {REPO}/tools/run_demo.sh"
            else:
                cmd_run = cmd
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", cmd_run], cwd=work, env=run_env,
                               capture_output=True, text=True, errors="replace", timeout=600)  # sample: any bytes
            if r.returncode == 0:
                print(f"ok   {cmd}")
            else:
                failures += 1
                print(f"FAIL {cmd} (exit {r.returncode})\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        if (work / "runs" / "quick-experiment" / "report" / "e1_ascender_dense.md").exists():
            print("ok   run_demo wrote its report")
        elif "bash tools/run_demo.sh" in commands:
            failures += 1
            print("FAIL run_demo.sh wrote no report")
    print(f"readme_commands: {len(commands)} commands, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
