#!/usr/bin/env bash
# The installable package, checked as an outside user would use it (registered with CTest by tests/CMakeLists.txt):
#   bash tools/check_package.sh example BUILD_DIR   # install BUILD_DIR into a temporary prefix; build
#                                                     # examples/sorted_classifier against it with CMake (static
#                                                     # library) and with pkg-config (shared library) and run both;
#                                                     # build probes against the CPU library alone (no CUDA library
#                                                     # loaded) and with the CUDA backend (registered); pack the
#                                                     # .debs with CPack and check what each holds and needs
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
  for want in 0.1 0.2 0.2.0 0.3 1.0; do
    mkdir -p "$prefix/version-$want"
    printf 'cmake_minimum_required(VERSION 3.25)\nproject(v LANGUAGES CXX)\nfind_package(ascender %s CONFIG REQUIRED)\n' \
      "$want" > "$prefix/version-$want/CMakeLists.txt"
    if cmake -S "$prefix/version-$want" -B "$prefix/version-$want/build" -DCMAKE_PREFIX_PATH="$prefix/install" \
         >/dev/null 2>&1; then found=yes; else found=no; fi
    case "$want" in 0.2*) expect=yes ;; *) expect=no ;; esac
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

  echo "== a CPU program needs no CUDA: probes against ascender::ascender (static) and ascender::ascender_shared"
  has_cuda=no
  [ -f "$prefix/install/lib/cmake/ascender/ascenderCudaTargets.cmake" ] && has_cuda=yes
  mkdir -p "$prefix/probe"
  cat >"$prefix/probe/probe.cpp" <<'CPP'
// argv[1] = 1 when the program links the CUDA backend: is_built() must say so; the CPU path works either way.
#include <cstdio>
#include <cstring>
#include "ascender.h"
#include "cuda/cuda.h"
int main(int argc, char** argv) {
  const bool want = argc > 1 && std::strcmp(argv[1], "1") == 0;
  const float s = asc::ones({2, 2}).sum().item<float>();
  std::printf("cuda::is_built() = %d, is_available() = %d, sum = %g\n", asc::cuda::is_built(),
              asc::cuda::is_available(), s);
  return asc::cuda::is_built() == want && s == 4.0f ? 0 : 1;
}
CPP
  cat >"$prefix/probe/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(probe LANGUAGES CXX)
find_package(ascender 0.2 CONFIG REQUIRED)
add_executable(probe_cpu probe.cpp)
target_link_libraries(probe_cpu PRIVATE ascender::ascender)
add_executable(probe_cpu_shared probe.cpp)
target_link_libraries(probe_cpu_shared PRIVATE ascender::ascender_shared)
if(TARGET ascender::cuda)
  add_executable(probe_cuda probe.cpp)
  target_link_libraries(probe_cuda PRIVATE ascender::ascender ascender::cuda)
  add_executable(probe_cuda_shared probe.cpp)
  target_link_libraries(probe_cuda_shared PRIVATE ascender::ascender_shared ascender::cuda_shared)
endif()
CMAKE
  cmake -S "$prefix/probe" -B "$prefix/probe/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$prefix/install" >/dev/null
  cmake --build "$prefix/probe/build" >/dev/null
  cuda_libs='libcuda|libcudart|libcublas|libcudnn|libnccl|libascender_cuda'
  for exe in probe_cpu probe_cpu_shared; do
    linked=$(ldd "$prefix/probe/build/$exe")
    if grep -E "$cuda_libs" <<<"$linked"; then echo "check_package: $exe links a CUDA library" >&2; exit 1; fi
    # The loader's own trace lists every library it loads, dlopen()ed ones included.
    loaded=$(LD_DEBUG=files "$prefix/probe/build/$exe" 0 2>&1)
    if grep -E "file=.*($cuda_libs)" <<<"$loaded"; then echo "check_package: $exe loads a CUDA library" >&2; exit 1; fi
    "$prefix/probe/build/$exe" 0
    echo "$exe: no CUDA library in ldd or loaded ($(du -h "$prefix/probe/build/$exe" | cut -f1))"
  done
  if [ "$has_cuda" = yes ]; then
    echo "== the CUDA backend registers itself: probes against ascender::cuda (static) and ascender::cuda_shared"
    for exe in probe_cuda probe_cuda_shared; do
      "$prefix/probe/build/$exe" 1
    done
    g++ -O1 "$prefix/probe/probe.cpp" $(pkg-config --cflags --libs ascender-cuda) -o "$prefix/probe/pkg-config-cuda"
    "$prefix/probe/pkg-config-cuda" 1
  fi

  echo "== cpack -G DEB: one package per component"
  (cd "$build" && cpack -G DEB -B "$prefix/deb" >/dev/null)
  version=$(sed -n 's/^project(ascender VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
  check_deb() {  # check_deb NAME FILE... : the package exists and holds each FILE
    local deb="$prefix/deb/${1}_${version}_amd64.deb"; shift
    [ -f "$deb" ] || { echo "check_package: $(basename "$deb") was not packed" >&2; exit 1; }
    dpkg-deb -I "$deb" | grep -E "Package|Version|Depends"
    local contents
    contents=$(dpkg-deb -c "$deb")
    for f in "$@"; do
      grep -q "$f" <<<"$contents" || { echo "check_package: $f is missing from $(basename "$deb")" >&2; exit 1; }
    done
    echo "$(basename "$deb"): $* present"
  }
  check_deb libascender-dev include/ascender/ascender.h include/ascender/core/tensor.h include/ascender/cuda/cuda.h \
    libascender.a libascender.so cmake/ascender/ascenderConfig.cmake cmake/ascender/ascenderConfigVersion.cmake \
    cmake/ascender/ascenderTargets.cmake pkgconfig/ascender.pc
  cpu_contents=$(dpkg-deb -c "$prefix/deb/libascender-dev_${version}_amd64.deb")
  if grep -E "libascender_cuda|ascenderCuda" <<<"$cpu_contents"; then
    echo "check_package: the CPU package holds the CUDA backend" >&2; exit 1
  fi
  # Every library the CPU package's shared library loads comes from a Debian package (dpkg -S knows its file).
  needed=$(ldd "$prefix/install/lib/libascender.so")
  while read -r lib _ path _; do
    [ -n "${path:-}" ] && [ -f "$path" ] || continue
    real=$(realpath "$path")
    # usrmerge: /lib is /usr/lib, and dpkg knows a file under the name its package shipped it with.
    found=no
    for candidate in "$path" "$real" "/usr$path" "${real#/usr}"; do
      dpkg -S "$candidate" >/dev/null 2>&1 && { found=yes; break; }
    done
    [ "$found" = yes ] \
      || { echo "check_package: libascender.so needs $lib ($path), which no Debian package provides" >&2; exit 1; }
  done < <(grep "=> /" <<<"$needed")
  echo "libascender.so: every library it loads belongs to a Debian package"
  if [ "$has_cuda" = yes ]; then
    check_deb libascender-cuda-dev libascender_cuda.a libascender_cuda.so cmake/ascender/ascenderCudaTargets.cmake \
      pkgconfig/ascender-cuda.pc README.md
    info=$(dpkg-deb -I "$prefix/deb/libascender-cuda-dev_${version}_amd64.deb")  # captured: no SIGPIPE under pipefail
    grep -qF "Depends: libascender-dev (= $version)" <<<"$info" \
      || { echo "check_package: libascender-cuda-dev does not depend on libascender-dev $version" >&2; exit 1; }
  fi
  if [ -f "$prefix/deb/ascender-tools_${version}_amd64.deb" ]; then
    check_deb ascender-tools bin/ascender-train bin/ascender-demo
  fi
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
