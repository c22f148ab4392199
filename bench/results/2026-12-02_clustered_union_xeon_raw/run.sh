#!/usr/bin/env bash
# Side by side: bench_asam's dense (chunked) and clustered rows before (OLD) and after (NEW) the clustered union's
# bucket-by-bucket pair tests, alternating twice; then the phases probe (phases.cpp: assignments, clustered_union,
# the first forward with its plans, a second forward, the backward; 4 calls each, the first a warm-up) on NEW.
#   bash run.sh OLD_BENCH_ASAM NEW_BENCH_ASAM NEW_BUILD OUT_DIR   (NEW_BUILD: libascender.a inside)
set -euo pipefail
old=$1 new=$2 build=$3 out=$4
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
mkdir -p "$out"
lscpu | grep -E "Model name|^CPU\(s\)" > "$out/cpu.txt"
grep -m1 -E "^cpu family" /proc/cpuinfo >> "$out/cpu.txt"
grep -m1 -E "^model\s" /proc/cpuinfo >> "$out/cpu.txt"
for round in 1 2; do
  for side in old new; do
    b=$old; [ "$side" = new ] && b=$new
    "$b" --n 4096,16384 --impl chunked,clustered --reps 3 > "$out/${side}_$round.txt" 2>/dev/null
  done
done
link="-lfmt -lz -lopenblas -ldnnl -ldl -L/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi_cxx -lmpi"
# shellcheck disable=SC2086
g++ -O2 -std=c++20 -fopenmp -I"$root" -DASC_HAVE_DNNL=1 "$here/phases.cpp" "$build/libascender.a" $link -o "$out/phases"
for n in 4096 16384; do "$out/phases" "$n" >> "$out/phases_new.txt"; done
