#!/usr/bin/env bash
# Float32 unary ops, before / after the vectorised transcendental functions, beside PyTorch, 3 alternating rounds.
#   bash bench/results/2026-11-30_vec_transcendental_xeon_raw/run.sh OLD_BUILD NEW_BUILD OUT
# OLD_BUILD / NEW_BUILD: build directories holding libascender.a (cmake --preset cpu-only; old = the commit before).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
old=$1 new=$2 out=$3
mkdir -p "$out"
libs="-lfmt -lz -lopenblas -ldnnl -ldl -L/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi_cxx -lmpi"
for side in old new; do
  dir=${!side}
  g++ -O2 -std=c++20 -fopenmp -I"$root" -DASC_HAVE_DNNL=1 "$here/unary_bench.cpp" "$dir/libascender.a" $libs \
    -o "$out/unary_bench_$side"
done
grep -m1 "model name" /proc/cpuinfo | tee "$out/cpu.txt"
for round in 1 2 3; do
  "$out/unary_bench_old" "ascender old" | tee -a "$out/rows.csv"
  "$out/unary_bench_new" "ascender new" | tee -a "$out/rows.csv"
  "$root/.venv-bench/bin/python" "$here/unary_bench_torch.py" | tee -a "$out/rows.csv"
done
