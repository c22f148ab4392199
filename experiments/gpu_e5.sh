#!/usr/bin/env bash
# Experiment 5 (ASAM against dense attention) at a larger scale, on a GPU when one is lent: the study's runs are on the
# CPU; this records what a GPU changes, beside them (bench/results/experiments/e5_gpu.md).
#
#   experiments/gpu_e5.sh prepare BUILD BIN   # here: copy train, bench_asam and the libraries of the CUDA build BUILD
#                                             # into BIN, with experiment 5's ListOps flags (from e5_asam.py)
#   experiments/gpu_e5.sh run BIN OUT         # on the GPU machine; BUDGET_S (default 420) bounds the whole run
# STEPS=S fixes S; PHASES=3 runs step 3 alone (default 123). A smoke test of the script itself on the CPU:
# DEVICE=cpu BENCH_N=64 PROBE_STEPS=2 STEPS=4.
#
# What it runs, in order, each step bounded by a timeout so the later ones still run:
#   1. bench_asam --device cuda: one forward + backward of dense attention, the sparse patterns and the ASAM layer at
#      1K-16K tokens (bfloat16), the lengths of seed 004's speed claim (2.1-4.8x over the standard Transformer).
#   2. Training-speed probes: 50-step ListOps runs of ASAM and of dense attention (e5's equal-size arms, float32) at
#      128-256 tokens (the study's lengths), 1024-2048 and 4096-8192 tokens (batch 8): training tokens/s, each alone.
#   3. Accuracy at a larger budget: e5's ListOps runs of ASAM and dense, seeds 0-2, exactly e5's flags but S steps
#      (warm-up S/10, 4 validations), all six at once on the GPU (their speed is not reported). S is the largest
#      multiple of 200 (at most 4000) that the time left fits at three times ASAM's probed step time, the rule fixed
#      before any result was seen.
# Everything lands in OUT: facts.txt, log.txt, bench_asam.json, runs.tar.gz (each run's summary, metrics and log).
set -uo pipefail

case "${1:-}" in
prepare)
  [ $# -eq 3 ] || { echo "usage: experiments/gpu_e5.sh prepare BUILD BIN" >&2; exit 2; }
  BUILD=$2 BIN=$(realpath -m "$3")
  # the GPU machine has no oneDNN: a build that needs libdnnl would not load there
  if readelf -d "$BUILD/libascender.so.0.2" 2>/dev/null | grep -q "libdnnl"; then
    echo "gpu_e5: $BUILD links oneDNN, which the GPU machine lacks: configure it with -DASC_WITH_DNNL=OFF" >&2
    exit 2
  fi
  mkdir -p "$BIN"
  cp -L "$BUILD/tools/train" "$BUILD/tools/bench_asam" "$BUILD/libascender.so.0.2" \
    "$BUILD/libascender_cuda.so.0.2" "$BIN/"
  cd "$(dirname "$0")" && python3 -c 'import sys, e5_asam; e5_asam.write_arm_flags(sys.argv[1])' "$BIN"
  exit ;;
-h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
run) [ $# -eq 3 ] || { echo "usage: experiments/gpu_e5.sh run BIN OUT" >&2; exit 2; } ;;
*) echo "usage: experiments/gpu_e5.sh prepare BUILD BIN | run BIN OUT" >&2; exit 2 ;;
esac

BIN=$(realpath "$2") OUT=$(realpath -m "$3")
mkdir -p "$OUT/runs"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BUDGET=${BUDGET_S:-420} DEVICE=${DEVICE:-cuda} PROBE_STEPS=${PROBE_STEPS:-50}
T0=$SECONDS
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
left() { echo $((BUDGET - (SECONDS - T0))); }
read -r -a ASAM <"$BIN/flags_asam.txt"
read -r -a DENSE <"$BIN/flags_dense.txt"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "asam: ${ASAM[*]}"
  echo "dense: ${DENSE[*]}"
} >"$OUT/facts.txt" 2>&1
cat "$OUT/facts.txt"

PHASES=${PHASES:-123}
if [[ $PHASES == *1* ]]; then
log "1. bench_asam on the GPU"
timeout -k 10 100 "$BIN/bench_asam" --device "$DEVICE" --n "${BENCH_N:-1024,2048,4096,8192,16384}" --impl chunked,mha,window,w+g+r,asam \
  --json "$OUT/bench_asam.json" >"$OUT/runs/bench_asam.log" 2>&1
log "   exit $?"
fi

# train RUN-NAME TIMEOUT-S FLAG-ARRAY-NAME [more flags]: one run into OUT/runs/RUN-NAME (0: no timeout; the last of
# repeated flags counts).
train() {
  local name=$1 tmo=$2 arr="$3[@]"
  shift 3
  timeout -k 10 "$tmo" "$BIN/train" "${!arr}" --device "$DEVICE" --progress none --out "$OUT/runs/$name" "$@" \
    >"$OUT/runs/$name.log" 2>&1
}
tps() { grep -o '"tokens_per_s": [0-9.e+]*' "$OUT/runs/$1/summary.json" 2>/dev/null | cut -d' ' -f2; }

if [[ $PHASES == *2* ]]; then
log "2. training-speed probes"
for lens in "128 256 32" "1024 2048 32" "4096 8192 8"; do
  read -r lo hi batch <<<"$lens"
  for arm in ASAM DENSE; do
    name="probe-${arm,,}-$lo-$hi"
    train "$name" 60 "$arm" --min-len "$lo" --max-len "$hi" --batch "$batch" --steps "$PROBE_STEPS" --warmup $(((PROBE_STEPS + 9) / 10)) \
      --eval-every "$PROBE_STEPS" --eval-batches 1 --train-size 2000 --val-size 64 --test-size 64 --threads 4
    log "   $name: exit $?, $(tps "$name") tokens/s"
  done
done

fi

if [[ $PHASES == *3* ]]; then
log "3. accuracy at a larger budget"
asam_tps=$(tps probe-asam-128-256)
if [ -z "$asam_tps" ] && [ -z "${STEPS:-}" ]; then
  log "   no ASAM probe at 128-256 tokens: skipped"
else
  # 32 examples of 192 tokens on average per step; three times the probed step time for six runs sharing the GPU.
  steps=$([ -z "$asam_tps" ] || awk -v t="$asam_tps" -v left="$(($(left) - 90))" \
    'BEGIN { s = int(left / (3 * 32 * 192 / t) / 200) * 200; print (s > 4000 ? 4000 : s) }')
  log "   ASAM probe $asam_tps tokens/s, $(left) s left: $steps steps per run${STEPS:+ (fixed: $STEPS)}"
  steps=${STEPS:-$steps}
  if [ "$steps" -ge 400 ] || [ -n "${STEPS:-}" ]; then
    for seed in 0 1 2; do
      for arm in ASAM DENSE; do
        train "${arm,,}-s$seed" $(($(left) > 40 ? $(left) - 20 : 20)) "$arm" --seed "$seed" --steps "$steps" --warmup $(((steps + 9) / 10)) \
          --eval-every $(((steps + 3) / 4)) --threads 2 &
      done
    done
    wait
    for seed in 0 1 2; do
      for arm in asam dense; do
        log "   $arm-s$seed: $(grep -o '"test_accuracy": [0-9.]*' "$OUT/runs/$arm-s$seed/summary.json" 2>/dev/null)"
      done
    done
  else
    log "   fewer than 400 steps fit: skipped"
  fi
fi

fi
log "done"
tar -czf "$OUT/runs.tar.gz" --exclude='*.safetensors' --exclude=ckpt --exclude=dumps \
  --exclude='predictions.csv.gz' -C "$OUT" runs
rm -rf "$OUT/runs"
