#!/usr/bin/env bash
# README command (2): set up, build and run the whole test suite.
#   bash tools/run_tests.sh              # Release build (CUDA backend compiled when nvcc exists) + ctest
#   bash tools/run_tests.sh --sanitize   # the same suite under AddressSanitizer + UBSan (CPU build)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
preset=release
[ "${1:-}" = "--sanitize" ] && preset=asan
jobs=$(nproc)
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
# Tests run one at a time: each uses all cores through OpenMP (OMP_NUM_THREADS=2 in tests/CMakeLists.txt), and two
# fork-join programs sharing 2 cores make every parallel region wait for a descheduled thread (a 2 s training
# test took 40-60 s that way).
ctest --preset "$preset"
