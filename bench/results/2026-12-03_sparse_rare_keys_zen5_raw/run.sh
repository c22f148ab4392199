#!/usr/bin/env bash
# OLD and NEW bench_asam alternating, three rounds, no environment variable set.
# Usage: bash run.sh OLD/tools/bench_asam NEW/tools/bench_asam OUTDIR
set -euo pipefail
old=$1 new=$2 out=$3
mkdir -p "$out"
lscpu > "$out/lscpu.txt"
for round in 1 2 3; do
  for which in old new; do
    bin=$old; [[ $which == new ]] && bin=$new
    "$bin" --n 4096,16384 --impl chunked,window,w+g+r,hierarchical --reps 3 > "$out/${which}_$round.txt" 2>&1
  done
done
