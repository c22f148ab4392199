#!/bin/bash
# A/B of the ASCender CPU kernel: OLD and NEW bench_ascender alternating, 3 rounds, 2 threads, no variable set.
#   bash run.sh OLD/tools/bench_ascender NEW/tools/bench_ascender OUT
set -e
old=$1 new=$2 out=$3
mkdir -p "$out"
lscpu > "$out/lscpu.txt"
for r in 1 2 3; do
  for v in old new; do
    bin=$old; [ $v = new ] && bin=$new
    "$bin" --n 512,1024 --impl dense,fused,windowed --no-torch --reps 20 --json "$out/${v}_$r.json" > "$out/${v}_$r.txt" 2>&1
  done
done
