#!/usr/bin/env bash
# Installs what ascender needs on Debian 12 when it is missing: a C++20 compiler, CMake, Ninja, fmt, doctest,
# oneDNN (the float32 GEMMs; its CMake package needs the OpenCL headers) and OpenBLAS (float64) to build; OpenMPI
# for distributed training and its 2-rank tests; zlib (gzip-compressed data files), CLI11 and nlohmann-json (the
# command-line tools), matplotlib (tools/plot.py's figures), and the data the tasks read: Debian's Fashion-MNIST and
# the manual pages of manpages / manpages-dev and the texts of fortunes at the version its task is defined on
# (data/tasks.h); Debian's python3-torch for the test suite's PyTorch
# cross-check of ASCender attention (tools/ascender_torch_check.py) and for the benchmarks' PyTorch twins; scipy and
# scikit-learn for the suite's independent check of the statistics (tests/stats_check.py). The CUDA toolkit is
# optional (used when /usr/local/cuda/bin/nvcc exists).
#   bash tools/setup.sh           # build, test and benchmark dependencies
set -euo pipefail
pkgs=(g++ cmake ninja-build libfmt-dev doctest-dev libopenblas-dev libdnnl-dev ocl-icd-opencl-dev pkg-config
      libopenmpi-dev openmpi-bin zlib1g-dev libcli11-dev nlohmann-json3-dev python3-matplotlib dataset-fashion-mnist
      manpages manpages-dev)
pinned=("fortunes=1:1.99.1-7.3")  # data whose every byte makes a task (data/text.h: kFortunesVersion)
optional=(python3-torch python3-scipy python3-sklearn)  # without them the build and the suite still run; the
                                                     # cross-checks (PyTorch, scipy / scikit-learn) report themselves skipped
missing() {
  local out=()
  for pkg in "$@"; do
    # captured, not piped into grep -q: under pipefail a SIGPIPE there would count a package as missing
    [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" == *"install ok installed"* ]] || out+=("$pkg")
  done
  echo "${out[@]}"
}
need=($(missing "${pkgs[@]}")) want=($(missing "${optional[@]}"))
for p in "${pinned[@]}"; do  # NAME=VERSION: missing unless that very version is installed
  [[ "$(dpkg-query -W -f='${Status} ${Version}' "${p%%=*}" 2>/dev/null || true)" == "install ok installed ${p#*=}" ]] ||
    need+=("$p")
done
if ((${#need[@]} + ${#want[@]})); then
  echo "setup: installing ${need[*]} ${want[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  ((${#need[@]})) && $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
  if ((${#want[@]})) && ! $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}"; then
    echo "setup: could not install ${want[*]}: the PyTorch cross-check and twins will be skipped"
  fi
else
  echo "setup: all packages present"
fi
