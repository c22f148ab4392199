#!/usr/bin/env bash
# The GPU check of the CUDA backend, for a machine with an NVIDIA GPU: configure + build (Release, CUDA on), run
# the whole ctest suite, the CUDA parity suite under compute-sanitizer (memcheck), and the GPU benchmarks when
# tools/bench_gpu exists; write bench/results/<date>_gpu_check_<device>.md with the device, the commit, each command
# and its pass/fail summary.
#
#   tools/gpu_check.sh [build-dir]        # default build-gpu
#
# Exit status: 0 all passed, 1 something failed, 2 no GPU on this machine (nothing run).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
cd "$ROOT"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi missing or finds no device): nothing was run" >&2
  exit 2
fi
GPU_INFO="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n1)"
DEVICE_NAME="$(echo "$GPU_INFO" | cut -d, -f1 | sed 's/^ *//;s/ *$//')"
DEVICE_SLUG="$(echo "$DEVICE_NAME" | tr -c 'A-Za-z0-9\n' '_' | sed 's/__*/_/g;s/^_//;s/_$//')"
COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY="$([ -n "$(git status --porcelain 2>/dev/null)" ] && echo ' (uncommitted changes)' || true)"
DATE="$(date +%Y-%m-%d)"
mkdir -p bench/results
REPORT="bench/results/${DATE}_gpu_check_${DEVICE_SLUG}.md"
LOGDIR="$BUILD/gpu_check_logs"
mkdir -p "$LOGDIR"

NVCC="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
SANITIZER="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"

{
  echo "# GPU check — $DATE"
  echo
  echo "- device: $GPU_INFO (name, driver, memory)"
  echo "- commit: $COMMIT$DIRTY"
  echo "- nvcc: $("$NVCC" --version 2>/dev/null | tail -n1)"
  echo "- host: $(uname -srm), $(nproc) cores"
  echo
  echo "| step | command | result | summary |"
  echo "|---|---|---|---|"
} >"$REPORT"

FAILED=0
# step NAME LOGFILE SUMMARY_REGEX COMMAND...: runs the command, logs it, adds a report row.
step() {
  local name="$1" log="$LOGDIR/$2" pattern="$3"
  shift 3
  echo "== $name: $*"
  local t0=$SECONDS
  "$@" >"$log" 2>&1
  local rc=$?
  local summary
  summary="$(grep -E "$pattern" "$log" | tail -n 2 | tr '\n' ' ' | sed 's/|/\\|/g')"
  local result="PASS"
  if [ $rc -ne 0 ]; then result="FAIL (exit $rc)"; FAILED=1; fi
  echo "   $result in $((SECONDS - t0)) s; log: $log"
  echo "| $name | \`$*\` | $result | ${summary:-see log} ($((SECONDS - t0)) s) |" >>"$REPORT"
  return $rc
}

step "configure" configure.log "CUDA backend|Build files" \
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DASC_WITH_CUDA=ON
if ! grep -q "CUDA backend enabled" "$LOGDIR/configure.log"; then
  echo "| configure | | FAIL | the CUDA backend was not enabled (nvcc not found?) |" >>"$REPORT"
  FAILED=1
fi
if step "build" build.log "^\[[0-9]+/[0-9]+\]|error" cmake --build "$BUILD" -j "$JOBS"; then
  # ASC_REQUIRE_GPU=1: the parity suite fails instead of skipping if it cannot see the device.
  step "ctest" ctest.log "tests passed|tests failed" \
    env ASC_REQUIRE_GPU=1 ctest --test-dir "$BUILD" --output-on-failure -j 2
  step "parity suite" parity.log "test cases:|assertions:|passed, .* failed" \
    env ASC_REQUIRE_GPU=1 "$BUILD/tests/test_cuda_parity"
  step "memcheck (parity suite)" memcheck.log "ERROR SUMMARY|test cases:" \
    env ASC_REQUIRE_GPU=1 "$SANITIZER" --tool memcheck --error-exitcode 3 --leak-check none \
    "$BUILD/tests/test_cuda_parity"
  # Every other test executable that touches CUDA, under memcheck too.
  for exe in "$BUILD"/tests/test_cuda_*; do
    [ -x "$exe" ] || continue
    case "$(basename "$exe")" in test_cuda_parity) continue ;; esac
    step "memcheck ($(basename "$exe"))" "memcheck_$(basename "$exe").log" "ERROR SUMMARY|test cases:" \
      env ASC_REQUIRE_GPU=1 "$SANITIZER" --tool memcheck --error-exitcode 3 --leak-check none "$exe"
  done
  # The mechanism kernels (shared memory, barriers, atomics): memcheck and racecheck on their CUDA test cases.
  for tool in memcheck racecheck; do
    for mech in test_ascender_attention test_firing test_sparse_attention test_asam_attention; do
      step "$tool ($mech CUDA cases)" "${tool}_${mech}.log" "ERROR SUMMARY|RACECHECK SUMMARY|test cases:" \
        env ASC_REQUIRE_GPU=1 "$SANITIZER" --tool "$tool" --error-exitcode 3 "$BUILD/tests/$mech" "-tc=*CUDA*"
    done
  done
  # Our flash attention kernels (cuda/flash_attention.cu: shared-memory tiles, barriers, shuffles).
  step "racecheck (flash attention cases)" racecheck_flash.log "RACECHECK SUMMARY|test cases:" \
    env ASC_REQUIRE_GPU=1 "$SANITIZER" --tool racecheck --error-exitcode 3 "$BUILD/tests/test_cuda_attention" \
    "-tc=*flash*"
  if [ -x "$BUILD/tools/bench_ascender" ]; then
    step "ASCender GPU benchmark" bench_ascender_gpu.log "fused|windowed|dense" "$BUILD/tools/bench_ascender" \
      --device cuda --n 1024,4096,16384 --impl dense,fused,windowed --reps 3 \
      --csv "$LOGDIR/bench_ascender_gpu.csv"
    if [ -s "$LOGDIR/bench_ascender_gpu.log" ]; then
      { echo; echo "## tools/bench_ascender --device cuda output"; echo; echo '```'; cat "$LOGDIR/bench_ascender_gpu.log"
        echo '```'; } >>"$REPORT"
    fi
  fi
  if [ -x "$BUILD/tools/bench_asam" ]; then
    step "ASAM GPU benchmark" bench_asam_gpu.log "window|chunked|targets" "$BUILD/tools/bench_asam" \
      --device cuda --n 1024,4096,16384 --impl naive,chunked,window,w+g+r,asam,asam-skip,mha --reps 3 \
      --csv "$LOGDIR/bench_asam_gpu.csv"
    if [ -s "$LOGDIR/bench_asam_gpu.log" ]; then
      { echo; echo "## tools/bench_asam --device cuda output"; echo; echo '```'; cat "$LOGDIR/bench_asam_gpu.log"
        echo '```'; } >>"$REPORT"
    fi
  fi
  if [ -x "$BUILD/tools/bench_gpu" ]; then
    step "GPU benchmarks" bench_gpu.log "." "$BUILD/tools/bench_gpu"
    if [ -s "$LOGDIR/bench_gpu.log" ]; then
      { echo; echo "## tools/bench_gpu output"; echo; echo '```'; cat "$LOGDIR/bench_gpu.log"; echo '```'; } >>"$REPORT"
    fi
  else
    echo "| GPU benchmarks | tools/bench_gpu | SKIPPED | no bench_gpu target in this tree yet (or tools not built) |" >>"$REPORT"
  fi
else
  echo "| tests, memcheck, benchmarks | | NOT RUN | the build failed |" >>"$REPORT"
fi

# The parity suite's per-family summaries (what passed, what is missing) in the report.
if [ -s "$LOGDIR/parity.log" ]; then
  { echo; echo "## Parity summary"; echo; echo '```';
    grep -E "passed, [0-9]+ failed|missing/wrong|no CUDA device|test cases:|assertions:" "$LOGDIR/parity.log" | sed 's/^ *//'
    echo '```'; } >>"$REPORT"
fi
{ echo; echo "Overall: $([ $FAILED -eq 0 ] && echo PASS || echo FAIL). Logs: \`$LOGDIR\`."; } >>"$REPORT"

echo "gpu_check: report written to $REPORT"
[ $FAILED -eq 0 ] && exit 0 || exit 1
