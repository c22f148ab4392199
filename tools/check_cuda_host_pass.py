#!/usr/bin/env python3
"""Finds, in nvcc's host pass, code that compiles but cannot work on a GPU.

nvcc compiles a .cu file twice: once for the device, once for the host. In the host pass every __device__ function
becomes a stub whose body is `{int volatile ___ = 1; ... ::exit(___);}`, and a __device__ function with a deduced
return type (`auto`) returns void. Two mistakes therefore compile without a diagnostic and only fail on a GPU:

  * host code that calls a __device__ function (a launcher building a kernel argument with a device helper): the
    program exits with status 1, silently, when it reaches the call;
  * host code that takes a type from a __device__ function (`decltype(device_fn(...))` choosing a kernel's template
    arguments): the host launches an instantiation the device pass never compiled or registered, and the launch
    fails with cudaErrorInvalidResourceHandle.

The CUDA emulator (tests/cuda_emu) compiles both passes as one C++ program, so neither shows there. Not covered:
__device__ operators and constructors (their uses have no name to match), and a host function that shares a
__device__ function's name is reported too (rename one of them). This check reads
the host-pass sources nvcc leaves with `-keep` (the *.cudafe1.cpp files; cmake -DASC_CUDA_KEEP_HOST_PASS=ON puts them
in <build>/nvcc_keep) and reports every call of a stubbed __device__ function, and every decltype of one, in live
(not `#if 0`) code of this repository's sources.

  tools/check_cuda_host_pass.py <build>/nvcc_keep        # exit 0: clean, 1: findings (listed), 2: nothing to read
"""
import pathlib
import re
import sys

# A stub definition: name, optional template arguments, parameters, then the stub body nvcc writes.
PARAMS = r"[^{};()]*(?:\([^{};()]*\)[^{};()]*)*"  # a parameter list: one level of nested parentheses
STUB = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^{};()]*>)?\s*\(" + PARAMS +
                  r"\)\s*(?:const\s*)?(?:noexcept\s*)?\{\s*int volatile ___ = 1;")
LINE_MARK = re.compile(r'#\s*\d+\s+"([^"]+)"')
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype", "static_assert"}


def live_lines(text):
    """(source file, line) for every line outside `#if 0` blocks, with nvcc's line markers resolved."""
    depth, current = 0, "?"
    for line in text.split("\n"):
        marker = LINE_MARK.match(line)
        if marker:
            current = marker.group(1)
            continue
        if depth == 0 and line.startswith("#if 0"):
            depth = 1
            continue
        if depth:
            if line.startswith("#if"):
                depth += 1
            elif line.startswith("#endif"):
                depth -= 1
            continue
        if not line.startswith("#"):
            yield current, line


def check(path, repo):
    """(findings, number of stubbed __device__ functions of this repository seen in the file)."""
    lines = list(live_lines(path.read_text(errors="replace")))
    ours = [(f, l) for f, l in lines if f.startswith(repo)]
    text = "\n".join(l for _, l in ours)
    stubs = {m.group(1) for m in STUB.finditer(text)} - KEYWORDS
    if not stubs:
        return [], 0
    # Drop the stub definitions themselves, then look for any other mention that calls or decltypes a stub.
    body = STUB.sub("{", text)
    names = "|".join(sorted(map(re.escape, stubs), key=len, reverse=True))
    # A call (free, qualified or a member's: x.f( / p->f( / ns::f<T>( ) or an address taken (&f).
    use = re.compile(r"(?<![\w:~])(?:[\w:]*::)?(" + names + r")\s*(?:<[^;{}]*?>)?\s*\(|&\s*(?:[\w:]*::)?(" + names +
                     r")\b")
    findings = []
    for lineno, line in enumerate(body.split("\n")):
        if "__device_stub__" in line or "__cudaLaunch" in line:
            continue
        for m in use.finditer(line):
            name = m.group(1) or m.group(2)
            findings.append(f"{path.name}: host code uses __device__ function '{name}': {line.strip()[:160]}")
    return findings, len(stubs)


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: " + __doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    keep = pathlib.Path(argv[1])
    files = sorted(keep.glob("*.cudafe1.cpp"))
    if not files:
        print(f"check_cuda_host_pass: no *.cudafe1.cpp in {keep} (configure with -DASC_CUDA_KEEP_HOST_PASS=ON)",
              file=sys.stderr)
        return 2
    repo = str(pathlib.Path(__file__).resolve().parent.parent) + "/"
    findings, stubs = [], 0
    for path in files:
        f, n = check(path, repo)
        findings += f
        stubs += n
    if stubs == 0:
        # Nothing of ours recognised: nvcc's stub text changed, or the build's sources are not this checkout (a build
        # made elsewhere): a pass here would check nothing.
        print(f"check_cuda_host_pass: {len(files)} host-pass files but no stubbed __device__ function of {repo} in "
              "them: nothing was checked", file=sys.stderr)
        return 2
    for f in findings:
        print(f)
    print(f"check_cuda_host_pass: {len(files)} host-pass files, {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
