#!/usr/bin/env bash
# Asks the installed cuDNN whether it accepts ascender's fused-attention graphs for the GPUs described in
# tools/cudnn_devices/ (no GPU needed): builds tools/cudnn_sdpa_check in build/release and runs it with the CUDA
# driver's stub library on the loader path (the engines need libcuda.so.1 to answer at all).
#   bash tools/cudnn_sdpa_check.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
cmake --build "$build" --target cudnn_sdpa_check >/dev/null
stubs=$(ls -d /usr/local/cuda/lib64/stubs /usr/local/cuda/targets/*/lib/stubs 2>/dev/null | head -1)
[ -n "$stubs" ] || { echo "cudnn_sdpa_check.sh: no CUDA stub libraries found"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ln -s "$stubs/libcuda.so" "$tmp/libcuda.so.1"
LD_LIBRARY_PATH="$tmp:${LD_LIBRARY_PATH:-}" "$build/tools/cudnn_sdpa_check" tools/cudnn_devices/*.json
