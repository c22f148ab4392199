#!/usr/bin/env bash
# README command (1): set up, build and run the main job — a quick real experiment. Experiment 1 at its quick scale
# (experiments/e1_ascender_dense.py): ASCender attention against dense attention (both with rotary positions, the same
# parameter count) on Fashion-MNIST read as sequences of 49 pixel tokens, 2 seeds each, with progress lines; then its
# report — accuracy with intervals, paired tests over the test images, effect sizes, attention FLOPs, speed, the
# learning curves and ASCender's ω per head — in runs/quick-experiment/report/e1_ascender_dense.md. At this size a
# difference of a few points is not detectable, and the report says so; experiments/README.md runs the full study.
#
# For the test suite's check of this script (tests/readme_commands_test.py), three variables run it small on a build
# that exists: ASC_DEMO_BUILD_DIR (a build directory holding tools/train and tools/stats: no set-up, no build),
# ASC_DEMO_SCALE (tiny; default quick) and ASC_DEMO_ROOT (default runs/quick-experiment).
set -euo pipefail
cd "$(dirname "$0")/.."
scale=${ASC_DEMO_SCALE:-quick}
root=${ASC_DEMO_ROOT:-runs/quick-experiment}
case "$scale" in tiny | quick) ;; *) echo "run_demo: ASC_DEMO_SCALE is tiny or quick, got '$scale'" >&2; exit 2 ;; esac
if [[ -n "${ASC_DEMO_BUILD_DIR:-}" ]]; then
  bin=$ASC_DEMO_BUILD_DIR
  [[ -x "$bin/tools/train" && -x "$bin/tools/stats" ]] || { echo "run_demo: no tools/train and tools/stats in $bin" >&2; exit 2; }
else
  bash tools/setup.sh
  # Without a GPU the CPU-only build: the CUDA kernels (which nvcc would compile whenever the toolkit is installed)
  # are about half of the first build's time and could not run here anyway.
  preset=cpu-only bin=build/cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then preset=release bin=build/release; fi
  cmake --preset "$preset" >/dev/null
  # the libraries too (static and shared), so that `cmake --install build/cpu --prefix P` works after the demo
  cmake --build --preset "$preset" -j "$(nproc)" --target train stats sample predict ascender ascender_shared
fi
export ASC_BUILD_DIR=$bin
rm -rf "$root"
/usr/bin/python3 experiments/queue.py run e1_ascender_dense --scale "$scale" --root "$root" --progress-every 10
/usr/bin/python3 experiments/queue.py report e1_ascender_dense --scale "$scale" --root "$root" --out-dir "$root/report"
echo "run_demo: the report is $root/report/e1_ascender_dense.md (figures beside it); the runs are in $root/"
