#!/usr/bin/env bash
# README command (1): set up, build and run the main job: the demo (a small MLP trained with the autograd
# engine), the core benchmark table, and the headline training benchmark — one AdamW step of the Transformer
# classifier next to the same model in PyTorch (Debian's python3-torch, installed by setup), in one run — and the
# ASCender attention table at n = 128 and 512 (all four n: bench_ascender --n 128,512,1024,2048, about 4 minutes).
# Tables are printed and CSVs written to bench/results/*_latest.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target demo bench_core bench_train bench_ascender
./build/release/tools/demo
./build/release/tools/bench_core --csv bench/results/bench_core_latest.csv
./build/release/tools/bench_train --csv bench/results/bench_train_latest.csv
./build/release/tools/bench_ascender --n 128,512 --csv bench/results/bench_ascender_latest.csv
