#!/usr/bin/env bash
# Side by side, alternating, 3 rounds: experiment 5's ListOps ASAM arm (its flags, 8 steps, 5 profiled from step 2)
# with the train binary before (OLD) and after (NEW) the change.
#   bash run.sh OLD_TRAIN NEW_TRAIN OUT_DIR
set -euo pipefail
old=$1 new=$2 out=$3
mkdir -p "$out"
flags="--task listops --min-len 128 --max-len 256 --train-size 20000 --val-size 1000 --test-size 2000 --model asam
 --d-model 64 --heads 4 --layers 2 --ffn 128 --dropout 0.1 --attn-dropout 0 --optimizer adamw --lr 1e-3
 --weight-decay 0.01 --schedule cosine --clip 1 --batch 32 --steps 8 --warmup 40 --positional learned
 --asam-patterns window,global,random,clustered,hierarchical --asam-window 32 --on-nonfinite skip --eval-every 100
 --eval-batches 16"
lscpu | grep -E "Model name|^CPU\(s\)" > "$out/cpu.txt"
for round in 1 2 3; do
  for side in old new; do
    bin=$old; [ "$side" = new ] && bin=$new
    rm -rf "$out/train_${side}_$round"
    # shellcheck disable=SC2086
    "$bin" $flags --profile 5 --progress none --out "$out/train_${side}_$round" > "$out/train_${side}_$round.log" 2>&1
  done
done
