#!/usr/bin/env python3
"""The committed reports of the study are what the code makes of the committed outcomes today: every report and its
facts file (bench/results/experiments/<name>.md and .json) and docs/results.md are written again, from the tables in
experiments/results/full/, into a copy of the results folder, and must equal the committed ones but for the date
each report was written. A change to the statistics, the verdict rules or a report script that would change a
verdict fails here until the reports are regenerated (python3 experiments/queue.py report) and committed.

    /usr/bin/python3 tests/reports_current_test.py     (ctest: reports_current; needs the built train and stats:
                                                         $ASC_BUILD_DIR, else build/release, else build/cpu)
"""
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "experiments"
DATE = re.compile(r"report written \d{4}-\d{2}-\d{2}")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "experiments"
        # a copy of the committed folder: the figures are referenced, not redrawn (--no-figures)
        shutil.copytree(RESULTS, out)
        r = subprocess.run([sys.executable, str(REPO / "experiments" / "queue.py"), "report", "--no-figures",
                            "--out-dir", str(out)], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"reports_current: queue.py report failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
            return 1
        failures = []
        for committed in sorted(RESULTS.glob("e*.md")) + sorted(RESULTS.glob("e*.json")):
            if committed.name.startswith("e5_gpu"):
                continue  # written by gpu_e5_report.py from a GPU run, not by the queue
            fresh = out / committed.name
            a, b = DATE.sub("", committed.read_text()), DATE.sub("", fresh.read_text()) if fresh.exists() else None
            if a != b:
                failures.append(committed.name)
                diff = subprocess.run(["diff", str(committed), str(fresh)], capture_output=True, text=True).stdout
                print(f"FAIL {committed.relative_to(REPO)} is not what the code writes today:\n{diff[:3000]}")
        if failures:
            print(f"reports_current: {len(failures)} report file(s) out of date: run python3 experiments/queue.py "
                  "report and commit")
            return 1
    print("reports_current: every committed report and facts file is what the code writes from the committed "
          "outcomes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
