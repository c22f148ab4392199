#!/usr/bin/env bash
# A CUDA build carried to a GPU machine that is lent for a few minutes, and the whole device run there in one command:
# the timing run (tools/gpu_bench.sh), then the GPU check (tools/gpu_check.sh --prebuilt, its benchmarks left to the
# timing run).
#
#   tools/gpu_pack.sh pack BUILD PACK   # here: PACK/build.tgz (BUILD's programs, libraries and ctest files, stripped,
#                                       # no objects), PACK/lib (the libraries the GPU machine lacks: fmt, gomp) and
#                                       # PACK/flags (experiment 5's ListOps flags), checked to fit what a device run
#                                       # carries (64 MiB with the repository's files)
#   tools/gpu_pack.sh run PACK OUT      # there, from the repository root: BUILD unpacked where it was here, both runs,
#                                       # and four files in OUT: gpu_bench_report.md, gpu_bench.tgz (every step's log
#                                       # and JSON), the dated gpu_check report, gpu_check_logs.tgz
#
# BUILD is a CUDA build configured for that machine, e.g.
#   cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DASC_LINK_SHARED=ON \
#         -DASC_WITH_MPI=OFF -DASC_WITH_BLAS=OFF -DASC_WITH_DNNL=OFF
# (shared libraries, so that the programs are small; no MPI, OpenBLAS or oneDNN, which the GPU machine lacks).
# PACK must be a folder of the repository that git ignores (e.g. .gpurun, listed in .git/info/exclude), named in the
# device run's carry. BUDGET_S (default 300) bounds the timing run.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { echo "usage: tools/gpu_pack.sh pack BUILD PACK | run PACK OUT   (see the comment at the top)"; }
case "${1:-}" in
-h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
pack | run) [ $# -eq 3 ] || { usage >&2; exit 2; } ;;
*) usage >&2; exit 2 ;;
esac

if [ "$1" = pack ]; then
  BUILD="$(realpath "$2" 2>/dev/null)" PACK="$(realpath -m "$3")"
  for f in libascender.so.0.2 libascender_cuda.so.0.2 tests/test_cuda_parity tools/bench_ascender tools/train; do
    [ -e "$BUILD/$f" ] || { echo "gpu_pack: no $2/$f: a CUDA build with -DASC_LINK_SHARED=ON and the tools" >&2; exit 2; }
  done
  if readelf -d "$BUILD/libascender.so.0.2" | grep -Eq 'libdnnl|libopenblas|libmpi'; then
    echo "gpu_pack: $2 links oneDNN, OpenBLAS or MPI, which the GPU machine lacks (configure it as the comment says)" >&2
    exit 2
  fi
  case "$BUILD/" in "$ROOT"/*) ;; *) echo "gpu_pack: $2 must lie inside the repository" >&2; exit 2 ;; esac
  case "$PACK/" in "$ROOT"/*) ;; *) echo "gpu_pack: $3 must lie inside the repository (it is carried)" >&2; exit 2 ;; esac
  rm -rf "$PACK" && mkdir -p "$PACK/lib" "$PACK/flags"
  STAGE="$(mktemp -d)"
  trap 'rm -rf "$STAGE"' EXIT
  REL="${BUILD#"$ROOT"/}"
  # The build's files that run or that ctest reads: not its objects, nvcc's kept files or ninja's state.
  (cd "$ROOT" && find "$REL" \( -name CMakeFiles -o -name nvcc_keep -o -name Testing \) -prune -o -type f \
    ! -name '*.o' ! -name '*.a' ! -name '*.ninja' ! -name '.ninja_*' -print0 | xargs -0 cp --parents -t "$STAGE")
  (cd "$ROOT" && find "$REL" -maxdepth 1 -type l -name 'lib*.so*' -print0 | xargs -0 -r cp -P --parents -t "$STAGE")
  find "$STAGE" -type f -exec sh -c 'file -b "$1" | grep -q ELF && strip --strip-unneeded "$1"' _ {} \;
  tar czf "$PACK/build.tgz" -C "$STAGE" .
  echo "$REL" >"$PACK/build_path"
  echo "$ROOT" >"$PACK/root"
  for lib in libfmt libgomp; do
    path="$(ldd "$BUILD/libascender.so.0.2" | awk -v l="$lib" '$1 ~ "^" l "\\.so" {print $3}')"
    [ -n "$path" ] && cp -L "$path" "$PACK/lib/"
  done
  # experiment 5's flags, made here: experiments/ looks for a build of the machine it runs on, which the GPU one lacks
  (cd "$ROOT/experiments" && python3 -c 'import sys, e5_asam; e5_asam.write_arm_flags(sys.argv[1])' "$PACK/flags") ||
    exit 2
  pack_b=$(find "$PACK" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
  tree_b=$(cd "$ROOT" && git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
  mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
  echo "gpu_pack: $3 holds $(mib "$pack_b") MiB; with the repository's files $(mib $((pack_b + tree_b))) MiB of the 64" \
    "a run carries"
  [ $((pack_b + tree_b)) -lt $((63 * 1048576)) ] || { echo "gpu_pack: too large to carry" >&2; exit 2; }
  exit 0
fi

# run, on the GPU machine
PACK="$(realpath "$2")" OUT="$(realpath -m "$3")"
[ -f "$PACK/build.tgz" ] || { echo "gpu_pack: no $2/build.tgz (tools/gpu_pack.sh pack BUILD $2 first)" >&2; exit 2; }
cd "$ROOT" || exit 2
REL="$(cat "$PACK/build_path")" ORIG="$(cat "$PACK/root")"
T0=$SECONDS
log() { echo "[$((SECONDS - T0)) s] gpu_pack: $*"; }
# ctest's files name the build machine's paths: the same root here, through a link if the repository lies elsewhere
[ "$ROOT" = "$ORIG" ] || [ -e "$ORIG" ] || { mkdir -p "$(dirname "$ORIG")" && ln -s "$ROOT" "$ORIG"; }
tar xzf "$PACK/build.tgz" -C "$ROOT" || exit 2
export LD_LIBRARY_PATH="$PACK/lib:$ROOT/$REL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
BIN="$WORK/bin"
mkdir -p "$BIN"
cp "$ROOT/$REL"/tests/test_cuda_mma "$ROOT/$REL"/tools/{bench_ascender,bench_gpu,bench_asam,train} "$PACK"/flags/*.txt "$BIN/"
ln -s "$ROOT/$REL/libascender.so.0.2" "$ROOT/$REL/libascender_cuda.so.0.2" "$BIN/"
log "unpacked $REL"
BUDGET="${BUDGET_S:-300}"
BUDGET_S="$BUDGET" timeout -k 5 $((BUDGET + 30)) bash "$ROOT/tools/gpu_bench.sh" run "$BIN" "$WORK/gpu_bench"
cp "$WORK/gpu_bench/report.md" "$OUT/gpu_bench_report.md"
tar czf "$OUT/gpu_bench.tgz" -C "$WORK" gpu_bench
log "timing run done"
# ctest leaves out, beside what --prebuilt leaves out, the tests that need this repository's data packages
# (experiments_smoke: Fashion-MNIST), read its reports against the build machine's runs (reports_current,
# readme_commands: minutes of CPU work) or kill and resume CPU runs (crash_consistency): none touches the GPU.
CTEST_EXCLUDE="${CTEST_EXCLUDE:-experiments_smoke|readme_commands|reports_current|crash_consistency}" \
  SKIP_BENCH=1 STEP_TIMEOUT="${STEP_TIMEOUT:-150}" SANITIZER_JOBS="${SANITIZER_JOBS:-8}" CTEST_JOBS="${CTEST_JOBS:-8}" \
  timeout -k 5 "${CHECK_TIMEOUT_S:-240}" bash "$ROOT/tools/gpu_check.sh" --prebuilt "$ROOT/$REL"
rc=$?
cp "$ROOT"/bench/results/"$(date +%Y-%m-%d)"_gpu_check_*.md "$OUT/" 2>/dev/null
[ -d "$ROOT/$REL/gpu_check_logs" ] && tar czf "$OUT/gpu_check_logs.tgz" -C "$ROOT/$REL" gpu_check_logs
log "GPU check done (exit $rc); $OUT holds $(find "$OUT" -type f | wc -l) files"
rm -rf "$WORK"
exit $rc
