#!/usr/bin/env bash
# Old build (before the allocator cache and the sdpa row reductions) against the new one: bench_train --no-torch,
# three alternating rounds. OLD / NEW: bench_train binaries.
#   bash run_side_by_side.sh OLD_BENCH_TRAIN NEW_BENCH_TRAIN OUT
set -euo pipefail
old=$1 new=$2 out=$3
: > "$out"
for i in 1 2 3; do
  for b in old new; do
    bin=$old; [ $b = new ] && bin=$new
    echo "== round $i $b" >> "$out"
    "$bin" --rounds 2 --no-torch 2>&1 | grep -E '^ascender|^GEMM time' >> "$out"
  done
done
