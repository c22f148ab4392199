#!/usr/bin/env bash
# Side by side, alternating: OLD = bench_asam built at a656905 (before the row groups), NEW = this change.
# usage: OLD=path/to/old/bench_asam NEW=build/cpu/tools/bench_asam bash run.sh OUTDIR
set -euo pipefail
out=${1:?outdir}
lscpu > "$out/lscpu.txt"
for round in 1 2; do
  for which in old new; do
    bin=$([ "$which" = old ] && echo "$OLD" || echo "$NEW")
    "$bin" --n 4096,16384 --impl chunked,clustered,window,w+g+r,hierarchical --reps 3 \
      > "$out/${which}_round${round}.txt" 2>/dev/null
  done
done
