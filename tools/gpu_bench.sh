#!/usr/bin/env bash
# The prepared timing run of the GPU attention work, for a machine lent for a few minutes: everything is built
# beforehand on a development machine, the GPU machine only runs it and writes one report.
#
#   tools/gpu_bench.sh prepare BUILD BIN   # here: copy the binaries and shared libraries of the CUDA build BUILD
#                                          # (cmake --preset release -DASC_LINK_SHARED=ON -DASC_WITH_DNNL=OFF) into BIN,
#                                          # checked to stay under the 64 MiB a device run can carry
#   tools/gpu_bench.sh run BIN OUT         # on the GPU machine: OUT/report.md, OUT/*.json, OUT/*.log
# BUDGET_S (default 300) bounds the whole run; each step has its own timeout so that the later ones still run.
# A smoke test of the script on the CPU: DEVICE=cpu QUICK=1 tools/gpu_bench.sh run BIN OUT.
#
# Steps, in order:
#   1. test_cuda_mma: the tensor-core fragment layouts of cuda/mma.cuh against float64 products (the CPU emulator
#      implements the same layouts; this is where they meet the hardware).
#   2. bench_ascender, bfloat16: dense (cuDNN), ASCender fused and windowed at n = 1024, 4096, 16384.
#   3. bench_ascender, float32 with TF32 allowed, and float32 without: the same rows at 1024 and 4096.
#   4. bench_ascender, dense attention alone in float32 (our flash kernel) and bfloat16 (cuDNN) at 1024-16384, with
#      warm-up and 3 repetitions: whether f+b grows smoothly with n.
#   5. bench_gpu --quick: GEMM against cuBLAS, elementwise and softmax bandwidth, allocator and copies.
#   6. bench_asam on the device, bfloat16 (sparse attention on tensor cores): the kernels at B·H = 32 (--batch 8),
#      n = 4096 and 16384 — dense (cuDNN), window, hierarchical, window + global + random, random alone, clustered;
#      then the layers (ASAM, ASAM with the dense branch skipped, multi-head attention) at B 1, 1024-16384.
#   7. train: experiment 5's ListOps runs of ASAM and of dense attention (its flags, experiments/e5_asam.py) with
#      --dtype bfloat16, 40 steps, the profiler on 2 of them: tokens/s, and how much of a step is the device's work,
#      the host's waiting and the host's own work (the profile's last line).
#   8. Where the time goes in the slow rows: the profiler's table (device and host time per op, --profile) of
#      ASCender fused at n = 4096, the window kernel and the ASAM layer; then, where Nsight Compute (ncu) is
#      installed, its per-kernel device times of the same ASCender and window rows (one repetition each).
set -uo pipefail

EXES=(test_cuda_mma bench_ascender bench_gpu bench_asam train)
case "${1:-}" in
prepare)
  [ $# -eq 3 ] || { echo "usage: tools/gpu_bench.sh prepare BUILD BIN" >&2; exit 2; }
  BUILD=$2 BIN=$(realpath -m "$3")
  for lib in libascender.so.0.2 libascender_cuda.so.0.2; do
    [ -f "$BUILD/$lib" ] || { echo "gpu_bench: no $BUILD/$lib: configure BUILD with -DASC_LINK_SHARED=ON" >&2; exit 2; }
  done
  # the GPU machine has no oneDNN: a build that needs libdnnl would not load there
  if readelf -d "$BUILD/libascender.so.0.2" | grep -q libdnnl; then
    echo "gpu_bench: $BUILD links oneDNN, which the GPU machine lacks: configure it with -DASC_WITH_DNNL=OFF" >&2
    exit 2
  fi
  mkdir -p "$BIN"
  cp -L "$BUILD/tests/test_cuda_mma" "$BUILD/tools/bench_ascender" "$BUILD/tools/bench_gpu" "$BUILD/tools/bench_asam" \
    "$BUILD/tools/train" "$BUILD/libascender.so.0.2" "$BUILD/libascender_cuda.so.0.2" "$BIN/" || exit 2
  # experiment 5's ListOps flags of its ASAM and dense arms, for step 7
  (cd "$(dirname "$0")/../experiments" && python3 -c 'import sys, e5_asam; e5_asam.write_arm_flags(sys.argv[1])' "$BIN") ||
    exit 2
  strip --strip-unneeded "$BIN"/* 2>/dev/null
  mb=$(du -sm "$BIN" | cut -f1)
  echo "gpu_bench: $BIN holds $mb MiB"
  [ "$mb" -lt 60 ] || { echo "gpu_bench: $BIN exceeds what a device run carries (64 MiB with the tree)" >&2; exit 2; }
  exit 0 ;;
-h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
run) [ $# -eq 3 ] || { echo "usage: tools/gpu_bench.sh run BIN OUT" >&2; exit 2; } ;;
*) echo "usage: tools/gpu_bench.sh prepare BUILD BIN | run BIN OUT" >&2; exit 2 ;;
esac

BIN=$(realpath "$2") OUT=$(realpath -m "$3")
for exe in "${EXES[@]}"; do
  [ -x "$BIN/$exe" ] || { echo "gpu_bench: $BIN/$exe is missing (tools/gpu_bench.sh prepare BUILD $2)" >&2; exit 2; }
done
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BUDGET=${BUDGET_S:-300} DEVICE=${DEVICE:-cuda} QUICK=${QUICK:-0}
T0=$SECONDS
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/log.txt"; }
# step NAME TIMEOUT-S COMMAND...: runs it into OUT/NAME.log unless the budget is spent, and logs its exit status.
step() {
  local name=$1 tmo=$2
  shift 2
  local left=$((BUDGET - (SECONDS - T0)))
  if [ "$left" -lt 10 ]; then
    log "$name: skipped (budget spent)"
    return
  fi
  [ "$tmo" -le "$left" ] || tmo=$left
  timeout -k 5 "$tmo" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc$([ $rc -eq 124 ] && echo " (timed out after $tmo s)")"
}
if [ "$QUICK" = 1 ]; then
  N_ASC=128,256 N_TF32=128 N_DENSE=128,256 N_ASAM_K=256 N_ASAM=256 B_ASAM=1
else
  N_ASC=1024,4096,16384 N_TF32=1024,4096 N_DENSE=1024,2048,4096,8192,16384 N_ASAM_K=4096,16384
  N_ASAM=1024,4096,16384 B_ASAM=8
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "gpu: none"
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with changes)')"
  echo "device: $DEVICE, budget $BUDGET s"
} >"$OUT/facts.txt"
cat "$OUT/facts.txt"

A=("$BIN/bench_ascender" --device "$DEVICE" --no-torch --reps 3)
[ "$DEVICE" = cuda ] && step 1-test_cuda_mma 30 env ASC_REQUIRE_GPU=1 "$BIN/test_cuda_mma"
step 2-ascender-bf16 110 "${A[@]}" --dtype bfloat16 --n "$N_ASC" --impl dense,fused,windowed --json "$OUT/ascender_bf16.json"
step 3-ascender-tf32 40 "${A[@]}" --dtype float32 --tf32 --n "$N_TF32" --impl dense,fused,windowed \
  --json "$OUT/ascender_tf32.json"
step 3-ascender-f32 40 "${A[@]}" --dtype float32 --n "$N_TF32" --impl dense,fused,windowed --json "$OUT/ascender_f32.json"
step 4-dense-f32 30 "${A[@]}" --dtype float32 --n "$N_DENSE" --impl dense --json "$OUT/dense_f32.json"
step 4-dense-bf16 30 "${A[@]}" --dtype bfloat16 --n "$N_DENSE" --impl dense --json "$OUT/dense_bf16.json"
[ "$DEVICE" = cuda ] && step 5-bench_gpu 40 "$BIN/bench_gpu" --quick --json "$OUT/bench_gpu.json"
ASAM=("$BIN/bench_asam" --device "$DEVICE")
[ "$DEVICE" = cuda ] && ASAM+=(--dtype bfloat16)
step 6-asam-kernels 60 "${ASAM[@]}" --batch "$B_ASAM" --n "$N_ASAM_K" \
  --impl chunked,window,hier-kernel,w+g+r,random,clustered --json "$OUT/asam_kernels.json"
step 6-asam-layers 45 "${ASAM[@]}" --n "$N_ASAM" --impl chunked,mha,asam,asam-skip --json "$OUT/asam_layers.json"
read -r -a E5_ASAM <"$BIN/flags_asam.txt"
read -r -a E5_DENSE <"$BIN/flags_dense.txt"
TRAIN=(--device "$DEVICE" --steps "$([ "$QUICK" = 1 ] && echo 4 || echo 40)" --profile 2 --progress none)
[ "$QUICK" = 1 ] && TRAIN+=(--train-size 64 --val-size 32 --test-size 32 --batch 8)
[ "$DEVICE" = cuda ] && TRAIN+=(--dtype bfloat16)
step 7-train-asam 45 "$BIN/train" "${E5_ASAM[@]}" "${TRAIN[@]}" --out "$OUT/train_asam"
step 7-train-dense 30 "$BIN/train" "${E5_DENSE[@]}" "${TRAIN[@]}" --out "$OUT/train_dense"
N_PROF=$([ "$QUICK" = 1 ] && echo 256 || echo 4096)
ASC1=("$BIN/bench_ascender" --device "$DEVICE" --no-torch --reps 1 --n "$N_PROF" --impl fused)
ASAM1=("$BIN/bench_asam" --device "$DEVICE" --reps 1 --n "$N_PROF")
if [ "$DEVICE" = cuda ]; then ASC1+=(--dtype bfloat16) ASAM1+=(--dtype bfloat16); fi
mkdir -p "$OUT/traces"
step 8-profile-ascender 40 "${ASC1[@]}" --profile "$OUT/traces/ascender.json"
step 8-profile-window 30 "${ASAM1[@]}" --batch "$B_ASAM" --impl window --profile "$OUT/traces/window.json"
step 8-profile-asam-layer 30 "${ASAM1[@]}" --impl asam --profile "$OUT/traces/asam_layer.json"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ "$DEVICE" = cuda ] && [ -n "$NCU" ]; then
  NCU_ARGS=("$NCU" --metrics gpu__time_duration.sum --print-summary per-kernel)
  step 8-ncu-ascender 90 "${NCU_ARGS[@]}" "${ASC1[@]}"
  step 8-ncu-window 60 "${NCU_ARGS[@]}" "${ASAM1[@]}" --batch "$B_ASAM" --impl window
fi
log "done"

# One report: the facts, each step's table as the tool printed it (its lines from the header row on).
{
  echo "# GPU bench, $(date -u +%Y-%m-%d)"
  echo
  echo '```'
  cat "$OUT/facts.txt"
  echo '```'
  for f in "$OUT"/[0-9]-*.log; do
    echo
    echo "## $(basename "$f" .log)"
    echo
    echo '```'
    grep -v '^\[' "$f" | grep -v '^\s*$' | tail -40
    echo '```'
  done
  echo
  echo '```'
  cat "$OUT/log.txt"
  echo '```'
} >"$OUT/report.md"
echo "gpu_bench: $OUT/report.md"
