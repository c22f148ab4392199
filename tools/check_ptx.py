#!/usr/bin/env python3
"""Checks what nvcc made of the attention kernels, from its own output, without a GPU.

A kernel can stay correct while losing what makes it fast: a change of tile size or a captured array can send
registers to local memory (spills), and a type change can turn tensor-core products back into scalar FMAs. Neither
shows in a test on the CPU emulator. This check reads the PTX nvcc leaves with `-keep` (cmake
-DASC_CUDA_KEEP_HOST_PASS=ON puts it in <build>/nvcc_keep: <file>.compute_<arch>.ptx, or <file>.ptx when one
architecture is built) and, for the kernels RULES
names,
  * runs ptxas -v on it and requires 0 bytes of spill stores and loads (no_spills);
  * requires mma.sync instructions in every such kernel's PTX body (mma).

  tools/check_ptx.py <build>/nvcc_keep [--ptxas PATH] [--arch 90]   # exit 0: as RULES say, 1: findings, 2: no input
"""
import argparse
import pathlib
import re
import shutil
import subprocess
import sys

# (source file under cuda/, kernels: a regular expression on the demangled entry name, mma required, spills forbidden)
RULES = [
    ("mma_check", r"mma_(product|chain)_kernel", True, True),
    ("flash_attention", r".", False, True),
    ("flash_mma", r"mma_(forward|backward_dq|backward_dkv)_kernel", True, True),
    ("sparse_attention", r".", False, True),
    ("sparse_mma", r"sparse_mma_(forward|backward_dq|backward_dkv)_kernel", True, True),
    # The one-block-per-row kernels; their long-row forward (a global workspace, 16-bit and float64 inputs) spills a
    # few bytes, which only the rest of the file is held to.
    ("ascender", r"ascender_backward_kernel|row_norms_kernel|unit_rows_backward_kernel", False, True),
    ("ascender_mma", r"ascender_mma_forward_kernel<(__nv_bfloat16|__half)>", True, True),
    # TF32 operands take twice the registers of the 16-bit kinds; that instantiation still spills.
    ("ascender_mma", r"ascender_mma_forward_kernel<float>", True, False),
    # The tensor-core backward's passes: mma everywhere; they still spill (16-bit kinds a few hundred bytes, TF32 kilobytes).
    ("ascender_mma_backward", r"ascender_mma_(query|key)_kernel", True, False),
]

ENTRY = re.compile(r"^(?:\.visible\s+)?\.entry\s+(\S+?)\s*\(", re.M)
PTXAS_FN = re.compile(r"Function properties for (\S+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                      r"(\d+) bytes spill loads")


def demangle(names):
    if not names:
        return {}
    filt = shutil.which("c++filt")
    if not filt:
        return {n: n for n in names}
    out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def entries(ptx):
    """Each .entry's mangled name and its body's text (up to the next .entry)."""
    starts = [(m.start(), m.group(1)) for m in ENTRY.finditer(ptx)]
    return {name: ptx[pos:starts[i + 1][0] if i + 1 < len(starts) else len(ptx)] for i, (pos, name) in
            enumerate(starts)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("keep_dir", type=pathlib.Path)
    ap.add_argument("--ptxas", default=shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas")
    ap.add_argument("--arch", default="90", help="the compute capability whose PTX is read (default 90)")
    args = ap.parse_args()
    findings, checked = [], 0
    for src, pattern, need_mma, no_spills in RULES:
        ptx_path = args.keep_dir / f"{src}.compute_{args.arch}.ptx"
        if not ptx_path.is_file():  # a build for one architecture names it without one
            ptx_path = args.keep_dir / f"{src}.ptx"
        if not ptx_path.is_file():
            print(f"check_ptx: {ptx_path} is missing (a build with -DASC_CUDA_KEEP_HOST_PASS=ON for arch "
                  f"{args.arch} leaves it)", file=sys.stderr)
            return 2
        ptx = ptx_path.read_text()
        bodies = entries(ptx)
        names = demangle(list(bodies))
        chosen = {m for m in bodies if re.search(pattern, names[m])}
        if not chosen:
            findings.append(f"{src}: no kernel matches {pattern!r} (renamed? update RULES)")
            continue
        for m in sorted(chosen):
            checked += 1
            if need_mma and "mma.sync" not in bodies[m]:
                findings.append(f"{src}: {names[m]}: no mma.sync in its PTX (its products left the tensor cores)")
        if no_spills:
            res = subprocess.run([args.ptxas, f"-arch=sm_{args.arch}", "-v", str(ptx_path), "-o", "/dev/null"],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                findings.append(f"{src}: ptxas failed: {res.stderr.strip()[:500]}")
                continue
            report = {f: (int(st), int(ld)) for f, _, st, ld in PTXAS_FN.findall(res.stdout + res.stderr)}
            for m in sorted(chosen):
                if m not in report:
                    findings.append(f"{src}: {names[m]}: not in ptxas -v's report")
                elif report[m] != (0, 0):
                    findings.append(f"{src}: {names[m]}: {report[m][0]} bytes spill stores, {report[m][1]} bytes "
                                    "spill loads (ptxas -v)")
    for f in findings:
        print(f)
    print(f"check_ptx: {checked} kernels checked (sm_{args.arch}), {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
