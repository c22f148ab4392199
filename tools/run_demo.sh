#!/usr/bin/env bash
# README command (1): set up, build and run the main job — a quick real experiment. A small ASCender attention
# classifier (2 blocks, width 32, 2 heads, k = 8) learns Fashion-MNIST from its pixels read as a sequence of tokens
# (the images average-pooled to 7 x 7: 49 tokens), 800 steps of batch 64, with a progress line; then the figures
# of the run: training and validation curves, ASCender's ω per head over training, the head-specialisation map and
# the attention decomposition of test example 0 (chosen as the first of the test split, not for its look).
# Everything lands in runs/quick-ascender/ (rewritten on each run): config.json, metrics.csv / .jsonl, summary.json,
# predictions.csv, checkpoints, dumps/ and figures/*.png. docs/train.md explains each file and how to go on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# Without a GPU the CPU-only build: the CUDA kernels (which nvcc would compile whenever the toolkit is installed) are
# about half of the first build's time and could not run here anyway.
preset=cpu-only bin=build/cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then preset=release bin=build/release; fi
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" --target train
out=runs/quick-ascender
rm -rf "$out"
"$bin/tools/train" --task fashion-mnist-seq --image-size 7 --model ascender --d-model 32 --heads 2 \
  --layers 2 --ffn 64 --k 8 --batch 64 --steps 800 --lr 3e-3 --warmup 100 --eval-every 200 --val-size 2000 \
  --dump-decomposition 0 --seed 0 --out "$out"
/usr/bin/python3 tools/plot.py all "$out" --out-dir "$out/figures" ||
  echo "run_demo: no figures (see the message above); the run's data files are in $out"
