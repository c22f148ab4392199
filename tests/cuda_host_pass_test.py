#!/usr/bin/env python3
"""tools/check_cuda_host_pass.py on small host-pass files written the way nvcc writes them: it must report a host
call of a __device__ function and a decltype of one, and stay quiet on a clean file (a kernel's launch stub, a
__host__ __device__ helper, the stubs themselves, and device code nvcc keeps under `#if 0`)."""
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECK = ROOT / "tools" / "check_cuda_host_pass.py"
SRC = f'# 1 "{ROOT}/cuda/probe.cu"'

STUBS = SRC + '''
template< class S> __attribute((always_inline)) inline S
helper(const void *base, long offset) {int volatile ___ = 1;(void)base;(void)offset;
::exit(___);}
#if 0
{ return static_cast< const S *>(base) + offset; }
#endif
template< class T> __attribute((always_inline)) inline void
value(T a, T b) {int volatile ___ = 1;(void)a;(void)b;
::exit(___);}
#if 0
{ return a < b; }
#endif
template< class T> inline T host_and_device(T x) { return x; }
struct Row { __attribute((always_inline)) inline float
get(long i) const noexcept {int volatile ___ = 1;(void)i;
::exit(___);}
};
'''
CLEAN = STUBS + '''
void launch(const void *p) {
  ::cudaLaunchKernel((const void *)kernel_stub, 1, 1, (void **)&p, 0, 0);
  long n = host_and_device< long> (3);
}
'''
CALL = STUBS + '''
void launch(const void *p) {
  auto in = helper< float> (p, 0);
}
'''
DECLTYPE = STUBS + '''
template< class T> void launch() {
  using V = __decltype((value< T> (T{}, T{})));
}
'''


def run(files):
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            (pathlib.Path(d) / name).write_text(text)
        p = subprocess.run([sys.executable, str(CHECK), d], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr


failures = []
rc, out = run({"clean.cudafe1.cpp": CLEAN})
if rc != 0:
    failures.append(f"clean file: exit {rc}\n{out}")
rc, out = run({"call.cudafe1.cpp": CALL})
if rc != 1 or "'helper'" not in out:
    failures.append(f"host call of a __device__ function not reported: exit {rc}\n{out}")
rc, out = run({"decl.cudafe1.cpp": DECLTYPE})
if rc != 1 or "'value'" not in out:
    failures.append(f"decltype of a __device__ function not reported: exit {rc}\n{out}")
rc, out = run({"member.cudafe1.cpp": STUBS + "void f(const Row &r) { float x = r.get(3); }\n"})
if rc != 1 or "'get'" not in out:
    failures.append(f"a member call of a __device__ (noexcept) function not reported: exit {rc}\n{out}")
rc, out = run({"other.cudafe1.cpp": STUBS.replace(str(ROOT), "/elsewhere") + "void f() { helper< float> (0, 0); }\n"})
if rc != 2:
    failures.append(f"a host pass of sources outside this checkout: exit {rc} (want 2: nothing checked)\n{out}")
rc, out = run({})
if rc != 2:
    failures.append(f"an empty directory: exit {rc} (want 2)\n{out}")
p = subprocess.run([sys.executable, str(CHECK), "--help"], capture_output=True, text=True)
if p.returncode != 0 or "check_cuda_host_pass" not in p.stdout:
    failures.append(f"--help: exit {p.returncode}")
p = subprocess.run([sys.executable, str(CHECK), "--bogus"], capture_output=True, text=True)
if p.returncode != 2 or "usage" not in p.stderr:
    failures.append(f"a bad flag: exit {p.returncode} (want 2 and the usage)")
for f in failures:
    print("FAIL", f)
print("cuda_host_pass_test:", "ok" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
