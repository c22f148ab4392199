#!/usr/bin/env bash
# The installable package, checked as an outside user would use it (registered with CTest by tests/CMakeLists.txt):
#   bash tools/check_package.sh example BUILD_DIR   # install BUILD_DIR into a temporary prefix; build
#                                                     # examples/sorted_classifier against it with CMake (static
#                                                     # library) and with pkg-config (shared library) and run both;
#                                                     # pack the .deb with CPack and check what it holds
#   bash tools/check_package.sh headers BUILD_DIR   # every installed public header compiles on its own
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: check_package.sh example|headers BUILD_DIR}
build=$(realpath "${2:?usage: check_package.sh example|headers BUILD_DIR}")
prefix=$(mktemp -d /tmp/ascender-package.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix/install" >/dev/null
export PKG_CONFIG_PATH=$(dirname "$(find "$prefix/install" -name ascender.pc)")

case "$mode" in
example)
  echo "== find_package(ascender) from examples/sorted_classifier (static library)"
  cmake -S examples/sorted_classifier -B "$prefix/cmake-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$prefix/install" >/dev/null
  cmake --build "$prefix/cmake-build"
  "$prefix/cmake-build/sorted_classifier"
  echo "== version rules (0.x: only the same minor version is compatible)"
  for want in 0.1 0.1.0 0.2 1.0; do
    mkdir -p "$prefix/version-$want"
    printf 'cmake_minimum_required(VERSION 3.25)\nproject(v LANGUAGES CXX)\nfind_package(ascender %s CONFIG REQUIRED)\n' \
      "$want" > "$prefix/version-$want/CMakeLists.txt"
    if cmake -S "$prefix/version-$want" -B "$prefix/version-$want/build" -DCMAKE_PREFIX_PATH="$prefix/install" \
         >/dev/null 2>&1; then found=yes; else found=no; fi
    case "$want" in 0.1*) expect=yes ;; *) expect=no ;; esac
    echo "find_package(ascender $want): found=$found"
    [ "$found" = "$expect" ] || { echo "check_package: expected found=$expect for $want" >&2; exit 1; }
  done
  echo "== pkg-config --cflags --libs ascender (shared library)"
  g++ -O1 examples/sorted_classifier/main.cpp $(pkg-config --cflags --libs ascender) -o "$prefix/pkg-config-build"
  # ldd's output is captured first: `ldd | grep -q` under pipefail fails at random when grep exits on its
  # match before ldd has written its last line (SIGPIPE), which is what failed a CI run.
  linked=$(ldd "$prefix/pkg-config-build")
  grep -q "$prefix/install/.*libascender.so" <<<"$linked" \
    || { echo "check_package: the pkg-config build does not use the installed libascender.so" >&2; exit 1; }
  "$prefix/pkg-config-build"
  echo "== cpack -G DEB"
  (cd "$build" && cpack -G DEB -B "$prefix/deb" >/dev/null)
  deb=$(ls "$prefix"/deb/*.deb)
  dpkg-deb -I "$deb" | grep -E "Package|Version|Depends"
  contents=$(dpkg-deb -c "$deb")
  for f in include/ascender/ascender.h include/ascender/core/tensor.h libascender.a libascender.so \
           cmake/ascender/ascenderConfig.cmake cmake/ascender/ascenderConfigVersion.cmake \
           cmake/ascender/ascenderTargets.cmake pkgconfig/ascender.pc; do
    grep -q "$f" <<<"$contents" || { echo "check_package: $f is missing from $(basename "$deb")" >&2; exit 1; }
  done
  echo "$(basename "$deb"): headers, static and shared library, CMake package and pkg-config file present"
  ;;
headers)
  cflags=$(pkg-config --cflags ascender)
  cd "$prefix/install/include/ascender"
  headers=$(find . -name '*.h' | sed 's|^\./||' | sort)
  echo "== $(wc -w <<<"$headers") installed headers, each compiled alone (twice: the include guard)"
  # shellcheck disable=SC2086
  printf '%s\n' $headers | xargs -P "$(nproc)" -I{} sh -c \
    'printf "#include \"%s\"\n#include \"%s\"\n" "$1" "$1" | g++ $2 -fsyntax-only -x c++ - || { echo "not self-contained: $1" >&2; exit 255; }' \
    _ {} "$cflags"
  echo "all headers compile on their own"
  ;;
*) echo "usage: check_package.sh example|headers BUILD_DIR" >&2; exit 2 ;;
esac
