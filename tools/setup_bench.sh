#!/usr/bin/env bash
# The benchmarks' anchor: current PyTorch from PyPI in a virtual environment, .venv-bench/ (git ignores it), its
# version pinned so that results stay comparable from one day to the next (ASC_TORCH_VERSION overrides it). The wheel
# brings its CUDA libraries (about 4 GB) and runs on the CPU here. Benchmarks only: the test suite's cross-checks use
# Debian's python3-torch (tools/setup.sh). Every benchmark's PyTorch twin runs with $ASC_TORCH_PYTHON, else this
# environment's python, else Debian's /usr/bin/python3, and prints which PyTorch it used.
#   bash tools/setup_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
version=${ASC_TORCH_VERSION:-2.15.0}
venv=.venv-bench
bash tools/setup.sh
missing=()
for pkg in python3-venv python3-pip; do
  [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" == *"install ok installed"* ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
have=$("$venv/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null || true)
if [ "${have%%+*}" != "$version" ]; then
  echo "setup_bench: installing torch==$version into $venv (about 4 GB with its CUDA libraries)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "torch==$version" numpy
fi
"$venv/bin/python" -c "import torch; print(f'setup_bench: {torch.__file__.rsplit(\"/\", 2)[0]}: torch {torch.__version__}, {torch.get_num_threads()} threads')"
