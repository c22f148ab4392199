#!/usr/bin/env bash
# Experiment 1's image task (dense attention, its full-scale flags) trained in float32 and with CPU bfloat16 autocast
# (`train --dtype bfloat16`), seeds 0-2 each, one run at a time on the idle machine. Resumable: a finished run
# (summary.json) is skipped. Then summarize.py prints the table.
#   bash bench/results/2026-11-30_cpu_bf16_xeon_raw/run.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
build=${1:-build/cpu}
out=${2:-/tmp/bf16_accuracy}
flags=(--task fashion-mnist-seq --image-size 14 --train-size 20000 --val-size 2000 --test-size 5000 --model dense
       --d-model 64 --heads 4 --layers 2 --ffn 160 --dropout 0.1 --attn-dropout 0 --optimizer adamw --lr 1e-3
       --weight-decay 0.01 --schedule cosine --clip 1 --batch 32 --steps 1000 --warmup 100 --positional rope
       --progress none)
for dtype in float32 bfloat16; do
  for seed in 0 1 2; do
    dir="$out/$dtype/s$seed"
    [[ -f "$dir/summary.json" ]] && continue
    rm -rf "$dir"
    "$build/tools/train" "${flags[@]}" --dtype "$dtype" --seed "$seed" --out "$dir" | tail -1
  done
done
python3 "$(dirname "$0")/summarize.py" "$out"
