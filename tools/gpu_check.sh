#!/usr/bin/env bash
# The GPU check of the CUDA backend, for a machine with an NVIDIA GPU: configure + build (Release, CUDA on), run
# the whole ctest suite, the CUDA parity suite under compute-sanitizer (memcheck), and the GPU benchmarks when
# tools/bench_gpu exists; write bench/results/<date>_gpu_check_<device>.md with the device, the commit, each command
# and its pass/fail summary.
#
#   tools/gpu_check.sh [build-dir]               # configure + build in build-dir (default build-gpu), then check
#   tools/gpu_check.sh --prebuilt build-dir      # check a build made elsewhere (no configure, no build): e.g. one
#                                                # configured with -DASC_LINK_SHARED=ON and copied to the GPU machine
#                                                # (and -DASC_WITH_DNNL=OFF -DASC_WITH_BLAS=OFF -DASC_WITH_MPI=OFF: the
#                                                # GPU machine has neither libdnnl, OpenBLAS nor MPI)
#
# With --prebuilt and no CTEST_ARGS, ctest leaves out the tests that read the build machine's files or packages
# (package_example, package_headers: the static libraries and development packages; cuda_host_pass, cuda_ptx_kernels:
# nvcc's kept files and the build machine's Python), and the tests CTEST_EXCLUDE names (a regular expression, e.g.
# 'experiments_smoke|readme_commands'); CTEST_ARGS replaces that choice.
# SKIP_BENCH=1 leaves the benchmarks out (a SKIPPED row). Every step but the configure, the build and ctest (which
# has its own per-test limits) runs under a time limit (STEP_TIMEOUT seconds, default 600); the sanitizer runs,
# independent of each other, run SANITIZER_JOBS at a time (default 1; they share the GPU, and each is mostly host
# work); the benchmarks run last and alone.
#
# Exit status: 0 all passed, 1 something failed, 2 no GPU on this machine (nothing run).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { echo "usage: tools/gpu_check.sh [--prebuilt] [build-dir]   (see the comment at the top of this script)"; }
case "${1:-}" in
  -h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  --prebuilt | "") ;;
  -*) usage >&2; exit 2 ;;
esac
PREBUILT=0
if [ "${1:-}" = "--prebuilt" ]; then
  PREBUILT=1
  shift
  [ -n "${1:-}" ] || { usage >&2; exit 2; }
fi
BUILD="$(realpath -m "${1:-$ROOT/build-gpu}")"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
STEP_TIMEOUT="${STEP_TIMEOUT:-600}"
SANITIZER_JOBS="${SANITIZER_JOBS:-1}"
for v in STEP_TIMEOUT SANITIZER_JOBS; do
  case "${!v}" in
    '' | *[!0-9]* | 0) echo "gpu_check: $v must be a whole number of at least 1, got '${!v}'" >&2; exit 2 ;;
  esac
done
cd "$ROOT"
if [ $PREBUILT -eq 1 ] && [ ! -x "$BUILD/tests/test_cuda_parity" ]; then
  echo "gpu_check: --prebuilt $BUILD: no tests/test_cuda_parity there (build it with the CUDA backend first)" >&2
  exit 2
fi

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
  [ $PREBUILT -eq 1 ] && echo "- build: prebuilt ($BUILD, configured elsewhere; not rebuilt here)"
  echo
  echo "| step | command | result | summary |"
  echo "|---|---|---|---|"
} >"$REPORT"

FAILED=0
ROWS="$LOGDIR/rows"
rm -rf "$ROWS"
mkdir -p "$ROWS"
ROW=0
# step NAME LOGFILE SUMMARY_REGEX COMMAND...: runs the command under STEP_TIMEOUT, logs it, writes its report row to
# its own numbered file (steps run in the background finish in any order; the report lists them in order).
step() {
  ROW=$((ROW + 1))
  run_step "$ROW" "$@"
}
# bg_step ...: step in the background, at most SANITIZER_JOBS at a time (the row is numbered before the fork).
bg_step() {
  while [ "$(jobs -rp | wc -l)" -ge "$SANITIZER_JOBS" ]; do wait -n; done
  ROW=$((ROW + 1))
  run_step "$ROW" "$@" &
}
run_step() {
  local row
  row="$(printf '%s/%03d' "$ROWS" "$1")"
  local name="$2" log="$LOGDIR/$3" pattern="$4"
  shift 4
  echo "== $name: $*"
  local t0=$SECONDS
  if [ "${NO_LIMIT:-0}" = 1 ]; then
    "$@" >"$log" 2>&1
  else
    timeout --kill-after=10 "$STEP_TIMEOUT" "$@" >"$log" 2>&1
  fi
  local rc=$?
  local summary
  summary="$(grep -E "$pattern" "$log" | tail -n 2 | tr '\n' ' ' | sed 's/|/\\|/g')"
  local result="PASS"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    result="TIMEOUT (over ${STEP_TIMEOUT} s)"
  elif [ $rc -ne 0 ]; then
    result="FAIL (exit $rc)"
  fi
  echo "   $result in $((SECONDS - t0)) s; log: $log"
  local cmd="$*"
  echo "| $name | \`${cmd//|/\\|}\` | $result | ${summary:-see log} ($((SECONDS - t0)) s) |" >"$row"
  return $rc
}
# The report's rows so far, in order; FAILED=1 if one is neither a PASS nor a SKIPPED, or if a step left no row (killed
# before it wrote one).
FLUSHED=0
flush_rows() {
  wait
  local f n
  for ((n = FLUSHED + 1; n <= ROW; n++)); do
    f="$(printf '%s/%03d' "$ROWS" "$n")"
    [ -e "$f" ] || echo "| step $n | | FAIL | no result: the step was killed before it reported |" >"$f"
  done
  FLUSHED=$ROW
  for f in "$ROWS"/*; do
    [ -e "$f" ] || continue
    grep -qE '\| (PASS|SKIPPED) \|' "$f" || FAILED=1
    cat "$f" >>"$REPORT"
    rm -f "$f"
  done
}

BUILT=1
if [ $PREBUILT -eq 0 ]; then
  NO_LIMIT=1 step "configure" configure.log "CUDA backend|Build files" \
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DASC_WITH_CUDA=ON
  NO_LIMIT=1 step "build" build.log "^\[[0-9]+/[0-9]+\]|error" cmake --build "$BUILD" -j "$JOBS" || BUILT=0
  flush_rows
  if ! grep -q "CUDA backend enabled" "$LOGDIR/configure.log"; then
    echo "| configure | | FAIL | the CUDA backend was not enabled (nvcc not found?) |" >>"$REPORT"
    FAILED=1
  fi
fi
if [ $BUILT -eq 1 ]; then
  SECTIONS="$LOGDIR/sections.md"  # benchmark outputs, appended after the table
  : >"$SECTIONS"
  # ASC_REQUIRE_GPU=1: the parity suite fails instead of skipping if it cannot see the device.
  step "parity suite" parity.log "test cases:|assertions:|passed, .* failed" \
    env ASC_REQUIRE_GPU=1 "$BUILD/tests/test_cuda_parity"
  # CTEST_ARGS: more ctest arguments, e.g. -E to leave out tests that need this machine's packages.
  [ $PREBUILT -eq 1 ] && [ -z "${CTEST_ARGS:-}" ] &&
    CTEST_ARGS="-E package_example|package_headers|cuda_host_pass\$|cuda_ptx_kernels${CTEST_EXCLUDE:+|$CTEST_EXCLUDE}"
  # shellcheck disable=SC2086
  NO_LIMIT=1 step "ctest" ctest.log "tests passed|tests failed" \
    env ASC_REQUIRE_GPU=1 ctest --test-dir "$BUILD" --output-on-failure -j "${CTEST_JOBS:-2}" ${CTEST_ARGS:-}
  flush_rows
  bg_step "memcheck (parity suite)" memcheck.log "ERROR SUMMARY|test cases:" \
    env ASC_REQUIRE_GPU=1 "$SANITIZER" --tool memcheck --error-exitcode 3 --leak-check no \
    "$BUILD/tests/test_cuda_parity"
  # Every other test executable that touches CUDA, under memcheck too.
  for exe in "$BUILD"/tests/test_cuda_*; do
    [ -x "$exe" ] || continue
    case "$(basename "$exe")" in test_cuda_parity) continue ;; esac
    bg_step "memcheck ($(basename "$exe"))" "memcheck_$(basename "$exe").log" "ERROR SUMMARY|test cases:" \
      env ASC_REQUIRE_GPU=1 "$SANITIZER" --tool memcheck --error-exitcode 3 --leak-check no "$exe"
  done
  # The mechanism kernels (shared memory, barriers, atomics): memcheck and racecheck on their CUDA test cases.
  for tool in memcheck racecheck; do
    for mech in test_ascender_attention test_firing test_sparse_attention test_asam_attention; do
      bg_step "$tool ($mech CUDA cases)" "${tool}_${mech}.log" "ERROR SUMMARY|RACECHECK SUMMARY|test cases:" \
        env ASC_REQUIRE_GPU=1 "$SANITIZER" --tool "$tool" --error-exitcode 3 "$BUILD/tests/$mech" "-tc=*CUDA*"
    done
  done
  # Our flash attention kernels (cuda/flash_attention.cu: shared-memory tiles, barriers, shuffles).
  bg_step "racecheck (flash attention cases)" racecheck_flash.log "RACECHECK SUMMARY|test cases:" \
    env ASC_REQUIRE_GPU=1 "$SANITIZER" --tool racecheck --error-exitcode 3 "$BUILD/tests/test_cuda_attention" \
    "-tc=*flash*"
  flush_rows
  # The benchmarks, alone on the machine: one at a time, after the sanitizers.
  # bench TITLE LOG PATTERN COMMAND...: a benchmark step and its output as a section of the report.
  bench() {
    local title="$1" log="$2"
    step "$@"
    if [ -s "$LOGDIR/$log" ]; then
      { echo; echo "## ${title} output"; echo; echo '```'; cat "$LOGDIR/$log"; echo '```'; } >>"$SECTIONS"
    fi
  }
  if [ "${SKIP_BENCH:-0}" = 1 ]; then
    echo "| benchmarks | | SKIPPED | SKIP_BENCH=1 |" >"$ROWS/999"
  else
    if [ -x "$BUILD/tools/bench_ascender" ]; then
      bench "tools/bench_ascender --device cuda" bench_ascender_gpu.log "fused|windowed|dense" \
        "$BUILD/tools/bench_ascender" --device cuda --n 1024,4096,16384 --impl dense,fused,windowed --reps 3 \
        --csv "$LOGDIR/bench_ascender_gpu.csv"
    fi
    if [ -x "$BUILD/tools/bench_asam" ]; then
      bench "tools/bench_asam --device cuda" bench_asam_gpu.log "window|chunked|targets" \
        "$BUILD/tools/bench_asam" --device cuda --n 1024,4096,16384 \
        --impl naive,chunked,window,w+g+r,asam,asam-skip,mha --reps 3 --csv "$LOGDIR/bench_asam_gpu.csv"
    fi
    if [ -x "$BUILD/tools/bench_gpu" ]; then
      bench "tools/bench_gpu" bench_gpu.log "." "$BUILD/tools/bench_gpu"
    else
      echo "| GPU benchmarks | tools/bench_gpu | SKIPPED | no bench_gpu in this build (tools not built) |" >"$ROWS/999"
    fi
  fi
  flush_rows
  cat "$SECTIONS" >>"$REPORT"
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
