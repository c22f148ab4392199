#!/usr/bin/env bash
# Side by side: bench_train before (OLD) and after (NEW) the grouped q/k/v projections (nn::linear_group) and the
# 8-row product tiles at x86-64-v4, alternating, 3 rounds of --no-torch; then NEW beside PyTorch 2.15 (3 runs of
# 3 rounds); then the sdpa probe (sdpa.cpp) against OLD_LIB and NEW_LIB.
#   bash run.sh OLD_BUILD NEW_BUILD OUT_DIR      (build dirs: tools/bench_train and libascender.a inside)
set -euo pipefail
old=$1 new=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
mkdir -p "$out"
lscpu | grep -E "Model name|^CPU\(s\)" > "$out/cpu.txt"
grep -m1 -E "^cpu family" /proc/cpuinfo >> "$out/cpu.txt"
grep -m1 -E "^model\s" /proc/cpuinfo >> "$out/cpu.txt"
for round in 1 2 3; do
  for side in old new; do
    b=$old; [ "$side" = new ] && b=$new
    "$b/tools/bench_train" --no-torch --rounds 3 --steps 40 > "$out/bench_train_${side}_$round.txt" 2>&1
  done
done
for run in 1 2 3; do
  (cd "$root" && "$new/tools/bench_train" --rounds 3) > "$out/bench_train_new_vs_torch_$run.txt" 2>&1
done
link="-lfmt -lz -lopenblas -ldnnl -ldl -L/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi_cxx -lmpi"
for side in old new; do
  b=$old; [ "$side" = new ] && b=$new
  # shellcheck disable=SC2086
  g++ -O2 -std=c++20 -fopenmp -I"$root" -DASC_HAVE_DNNL=1 "$here/sdpa.cpp" "$b/libascender.a" $link -o "$out/sdpa_$side"
done
for round in 1 2 3; do
  for side in old new; do "$out/sdpa_$side" >> "$out/sdpa_$side.txt"; done
done
rm -f "$out/sdpa_old" "$out/sdpa_new"
