#!/usr/bin/env bash
# README command (1): set up, build and run the main job: the demo (a small MLP trained with the autograd
# engine) followed by the core benchmark table (also written to bench/results/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target demo bench_core
./build/release/tools/demo
./build/release/tools/bench_core --csv bench/results/bench_core_latest.csv
