#!/usr/bin/env bash
# Side by side, alternating (copied from 2026-11-30_ascender_narrow_xeon_raw/run.sh): experiment 1's ASCender arm on ListOps
# and bench_ascender (heads of 64), with the binaries before (OLD) and after (NEW) the change.
#   bash run.sh OLD_BIN_DIR NEW_BIN_DIR OUT_DIR      (each BIN_DIR holds train and bench_ascender)
set -euo pipefail
old=$1 new=$2 out=$3
mkdir -p "$out"
flags="--task listops --min-len 128 --max-len 256 --train-size 20000 --val-size 1000 --test-size 2000 --model ascender
 --d-model 64 --heads 4 --layers 2 --ffn 128 --dropout 0.1 --attn-dropout 0 --optimizer adamw --lr 1e-3
 --weight-decay 0.01 --schedule cosine --clip 1 --batch 32 --steps 8 --warmup 100 --positional rope --eval-every 100
 --eval-batches 16"
lscpu | grep -E "Model name|^CPU\(s\)" > "$out/cpu.txt"
for round in 1 2 3; do
  for side in old new; do
    dir=$old; [ "$side" = new ] && dir=$new
    rm -rf "$out/train_${side}_$round"
    # shellcheck disable=SC2086
    "$dir/train" $flags --profile 5 --progress none --out "$out/train_${side}_$round" > "$out/train_${side}_$round.log" 2>&1
    cp "$out/train_${side}_$round/profile.txt" "$out/train_${side}_${round}_profile.txt"
    "$dir/bench_ascender" --n 512,1024 --impl dense,fused --no-torch --reps 5 --csv "$out/bench_${side}_$round.csv" \
      > "$out/bench_${side}_$round.log" 2>&1
  done
done
