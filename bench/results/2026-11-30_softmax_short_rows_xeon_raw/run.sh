#!/usr/bin/env bash
# Softmax over short rows, before / after the short rows' kernel, beside PyTorch, 3 alternating rounds.
#   bash bench/results/2026-11-30_softmax_short_rows_xeon_raw/run.sh OLD_BUILD NEW_BUILD OUT
# OLD_BUILD / NEW_BUILD: build directories holding libascender.a (cmake --preset cpu-only).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
old=$1 new=$2 out=$3
mkdir -p "$out"
libs="-lfmt -lz -lopenblas -ldnnl -ldl -L/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi_cxx -lmpi"
for side in old new; do
  dir=${!side}
  g++ -O2 -std=c++20 -fopenmp -I"$root" -DASC_HAVE_DNNL=1 "$here/softmax_bench.cpp" "$dir/libascender.a" $libs \
    -o "$out/softmax_bench_$side"
done
grep -m1 "model name" /proc/cpuinfo | tee "$out/cpu.txt"
for round in 1 2 3; do
  "$out/softmax_bench_old" "ascender old" | tee -a "$out/rows.csv"
  "$out/softmax_bench_new" "ascender new" | tee -a "$out/rows.csv"
  "$root/.venv-bench/bin/python" "$here/softmax_bench_torch.py" | tee -a "$out/rows.csv"
done
