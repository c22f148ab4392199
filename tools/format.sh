#!/usr/bin/env bash
# The house style (.clang-format: Google's, 120 columns), applied or checked with clang-format 14 — Debian 12's
# package clang-format-14, pinned because another version formats some constructs differently.
#   bash tools/format.sh           # reformat every C++ / CUDA source of the repository in place
#   bash tools/format.sh --check   # list the files that differ from the style and exit 1 if any (CI runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case "$mode" in
  ""|--check) ;;
  *) echo "usage: format.sh [--check]" >&2; exit 2 ;;
esac
if ! command -v clang-format-14 >/dev/null; then
  echo "format: installing clang-format-14"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang-format-14 >/dev/null \
    || { DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq \
         && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang-format-14; }
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [ "$mode" = --check ]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format-14 --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    echo "format: ${#bad[@]} file(s) differ from .clang-format (run: bash tools/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: all ${#files[@]} C++ / CUDA sources follow .clang-format"
else
  clang-format-14 -i "${files[@]}"
  echo "format: ${#files[@]} files formatted"
fi
