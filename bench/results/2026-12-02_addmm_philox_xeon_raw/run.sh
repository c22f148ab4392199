#!/usr/bin/env bash
# The addmm / Philox change, OLD and NEW side by side on an idle machine (no OPENBLAS_CORETYPE or other variable set):
#   bash run.sh OLD_BENCH_TRAIN NEW_BENCH_TRAIN OUT
# 1) the training step alone, OLD and NEW alternating three times; 2) NEW beside PyTorch 2.15 (.venv-bench), three
# runs; 3) one profile of each (20 steps).
set -euo pipefail
old=$1 new=$2 out=$3
mkdir -p "$out"
lscpu > "$out/cpu.txt"
for i in 1 2 3; do
  "$old" --no-torch --rounds 3 --steps 40 > "$out/bench_train_old_$i.txt" 2>&1
  "$new" --no-torch --rounds 3 --steps 40 > "$out/bench_train_new_$i.txt" 2>&1
done
for i in 1 2 3; do "$new" --rounds 3 --steps 40 > "$out/bench_train_new_vs_torch_$i.txt" 2>&1; done
"$old" --no-torch --rounds 1 --steps 20 --profile "$out/trace_old.json" > "$out/profile_old.txt" 2>&1
"$new" --no-torch --rounds 1 --steps 20 --profile "$out/trace_new.json" > "$out/profile_new.txt" 2>&1
