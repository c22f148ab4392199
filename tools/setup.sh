#!/usr/bin/env bash
# Installs what ascender needs to build on Debian 12 when it is missing: a C++20 compiler, CMake, Ninja,
# fmt, doctest and OpenBLAS. The CUDA toolkit is optional (used when /usr/local/cuda/bin/nvcc exists).
#   bash tools/setup.sh           # build and test dependencies
#   bash tools/setup.sh --bench   # also Debian's python3-torch, the reference the benchmarks compare against
set -euo pipefail
pkgs=(g++ cmake ninja-build libfmt-dev doctest-dev libopenblas-dev pkg-config)
[ "${1:-}" = "--bench" ] && pkgs+=(python3-torch)
need=()
for pkg in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
else
  echo "setup: all packages present"
fi
