#!/usr/bin/env bash
# The train step's scaling over processes: `train` in one process and as an mpirun job of N processes on the same
# global batch, side by side in rounds (ABAB...), on an idle machine. Prints a markdown table (tokens/s from each run's
# summary.json, the median over the rounds, and the speed-up over one process with as many threads in all) headed by
# the CPU model and the command; the numbers go into bench/results/.
#
#   tools/bench_train_scaling.sh [build-dir] [rounds] [N...]     # default build/release, 3 rounds, N = 2
#
# Each configuration uses the machine's cores in all: one process with `nproc` threads, N processes with nproc / N
# threads each (and one process with nproc / N threads: what one rank alone does).
set -euo pipefail
BUILD="${1:-build/release}"
ROUNDS="${2:-3}"
shift $(($# > 2 ? 2 : $#)) || true
NS=("${@:-2}")
TRAIN="$BUILD/tools/train"
[ -x "$TRAIN" ] || { echo "bench_train_scaling: no $TRAIN (build it first)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "bench_train_scaling: no mpirun (apt-get install openmpi-bin)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
CORES=$(nproc)
ARGS=(--task fashion-mnist-seq --image-size 14 --model dense --batch 32 --steps 60 --eval-every 60 --dropout 0
      --progress none)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tps() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tokens_per_s'])" "$1/summary.json"; }
declare -A results
configs=("1x$CORES")
for n in "${NS[@]}"; do configs+=("1x$((CORES / n))" "${n}x$((CORES / n))"); done
for ((r = 0; r < ROUNDS; r++)); do
  for cfg in "${configs[@]}"; do
    n=${cfg%x*} threads=${cfg#*x}
    out="$tmp/$cfg-$r"
    if [ "$n" -eq 1 ]; then
      OMP_NUM_THREADS=$threads "$TRAIN" "${ARGS[@]}" --threads "$threads" --out "$out" >/dev/null 2>&1
    else
      OMP_NUM_THREADS=$threads mpirun -np "$n" --oversubscribe --bind-to none "$TRAIN" "${ARGS[@]}" \
        --threads "$threads" --out "$out" >/dev/null 2>&1
    fi
    results[$cfg]+="$(printf '%.0f' "$(tps "$out")") "
  done
done
median() { printf '%s\n' $1 | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
base=$(median "${results[1x$CORES]}")
family=$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
model=$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//') (family $family, model $model), $CORES cores;" \
  "$(date +%Y-%m-%d)"
echo "command: train ${ARGS[*]} --threads T [under mpirun -np N]; $ROUNDS rounds, median"
echo
echo "| processes x threads | tokens/s (median) | each round | vs 1 x $CORES |"
echo "|---|---|---|---|"
for cfg in "${configs[@]}"; do
  m=$(median "${results[$cfg]}")
  echo "| $cfg | $(printf '%.0f' "$m") | ${results[$cfg]% } | $(python3 -c "print(f'{$m / $base:.2f}x')") |"
done
