#!/bin/bash
# (copied from 2026-12-01_row_groups_zen4_raw)
# usage: e5_side.sh OLD_TRAIN NEW_TRAIN ROUNDS OUTDIR: experiment 5's ASAM ListOps model, 21 steps, the last 20
# profiled, the two binaries alternating
OLD=$1 NEW=$2 ROUNDS=$3 OUT=$4
mkdir -p $OUT
FLAGS="--task listops --min-len 128 --max-len 256 --train-size 20000 --val-size 1000 --test-size 2000 --model asam --d-model 64 --heads 4 --layers 2 --ffn 128 --dropout 0.1 --attn-dropout 0 --optimizer adamw --lr 1e-3 --weight-decay 0.01 --schedule cosine --clip 1 --batch 32 --steps 21 --warmup 40 --positional learned --asam-patterns window,global,random,clustered,hierarchical --asam-window 32 --on-nonfinite skip --eval-every 100 --eval-batches 16 --profile 20"
for r in $(seq 1 $ROUNDS); do
  for which in old new; do
    BIN=$OLD; [ $which = new ] && BIN=$NEW
    rm -rf $OUT/run_${which}_$r; $BIN $FLAGS --out $OUT/run_${which}_$r > $OUT/log_${which}_$r.txt 2>&1
    P=$OUT/run_${which}_$r/profile.txt
    step=$(grep -m1 "^train_step" $P | awk '{print $6/20}')
    cl=$(grep -m1 "^asam clustered pattern" $P | awk '{print $6/20}')
    pl=$(grep -m1 "^sparse_attention plans" $P | awk '{print $5/20}')
    echo "round $r $which: step $step ms, clustered pattern (total) $cl ms, plans $pl ms"
  done
done
