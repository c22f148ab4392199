#!/usr/bin/env bash
# The step idle and with one core kept busy (bench_train --busy 1), OLD and NEW alternating, 3 rounds.
#   bash busy.sh OLD_BUILD NEW_BUILD OUT_DIR
set -euo pipefail
old=$1 new=$2 out=$3
mkdir -p "$out"
for r in 1 2 3; do
  for side in old new; do
    b=$old; [ "$side" = new ] && b=$new
    "$b/tools/bench_train" --no-torch --rounds 2 --steps 30 > "$out/idle_${side}_$r.txt" 2>&1
    "$b/tools/bench_train" --no-torch --rounds 2 --steps 30 --busy 1 > "$out/busy_${side}_$r.txt" 2>&1
  done
done
