#!/usr/bin/env bash
# README command (2): set up, build and run the whole test suite.
#   bash tools/run_tests.sh              # Release build (CUDA backend compiled when nvcc exists) + ctest, then the
#                                        # CUDA backend on the CPU CUDA emulator (tests/cuda_emu) + ctest: every CUDA
#                                        # kernel runs against the CPU, on machines without a GPU too
#   bash tools/run_tests.sh --sanitize   # the suite under AddressSanitizer + UBSan (CPU build), then the thread-safety
#                                        # tests (tests/test_threads.cpp, tests/test_data_loader.cpp) under ThreadSanitizer
#   bash tools/run_tests.sh --tsan       # only the ThreadSanitizer build and its tests
#   bash tools/run_tests.sh --cuda-emu   # only the CUDA-emulator build and its suite
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") presets=(release cuda-emu) ;;
  --sanitize) presets=(asan tsan) ;;
  --tsan) presets=(tsan) ;;
  --cuda-emu) presets=(cuda-emu) ;;
  *) echo "usage: bash tools/run_tests.sh [--sanitize | --tsan | --cuda-emu]" >&2; exit 2 ;;
esac
bash tools/setup.sh
jobs=$(nproc)
for preset in "${presets[@]}"; do
  echo "== ${preset}: configure, build, test"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  # Tests run one at a time: each uses all cores through OpenMP (OMP_NUM_THREADS=2 in tests/CMakeLists.txt), and two
  # fork-join programs sharing 2 cores make every parallel region wait for a descheduled thread (a 2 s training
  # test took 40-60 s that way).
  ctest --preset "$preset"
done
