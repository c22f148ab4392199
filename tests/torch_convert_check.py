#!/usr/bin/env python3
"""The PyTorch side of tests/test_torch_convert.cpp (which runs it twice, with a temporary DIR):

    torch_convert_check.py export DIR     # per case: a seeded float64 PyTorch twin with random weights, its state
                                          # dict (torch.pt), the same converted by tools/torch_convert.py to ascender
                                          # names (ascender.safetensors), and the inputs, the mask and
                                          # PyTorch's logits (io.safetensors)
    torch_convert_check.py roundtrip DIR  # per case: the C++ side's saved state dict (from_ascender.safetensors)
                                          # converted back with to-torch must equal torch.pt bit for bit and load into
                                          # the twin; then the converter's error paths (exit 1 / 2, keys listed)

Exit status 0: all checks passed; 1: a check failed; 77: PyTorch is not installed.
"""
import os
import subprocess
import sys

try:
    import torch
except ImportError:
    print("torch_convert_check.py: python3-torch is not installed: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "tools", "torch_convert.py")
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.dont_write_bytecode = True  # no tools/__pycache__ in the source tree
import torch_convert  # noqa: E402  (the module under test, for its twin class and safetensors reader/writer)

# Each case is one architecture; together they cover pre- and post-norm, several head counts, T below max_len (only
# the first T positional rows are used), a padded batch and an unmasked one.
CASES = {
    "prenorm": dict(vocab=11, max_len=9, classes=3, d_model=16, heads=4, layers=2, ffn=24, norm_first=True,
                    T=7, lengths=[7, 4, 1, 6], masked=True),
    "postnorm": dict(vocab=7, max_len=6, classes=2, d_model=12, heads=3, layers=3, ffn=20, norm_first=False,
                     T=6, lengths=[2, 6, 5], masked=True),
    "unmasked": dict(vocab=5, max_len=8, classes=4, d_model=8, heads=2, layers=1, ffn=8, norm_first=True,
                     T=8, lengths=[8, 8], masked=False),
}
ARCH_KEYS = ("vocab", "max_len", "classes", "d_model", "heads", "layers", "ffn")

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"FAIL: {what}")


def run_tool(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def make_twin(c):
    return torch_convert.torch_transformer_classifier(**{k: c[k] for k in ARCH_KEYS}, dropout=0.1,
                                                      norm_first=c["norm_first"]).double()


def export(root):
    for i, (name, c) in enumerate(CASES.items()):
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        torch.manual_seed(100 + i)
        model = make_twin(c)
        # Every parameter random (not LayerNorm's ones and zeros), so a swapped or transposed tensor shows.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn_like(p) * 0.5)
        model.eval()  # dropout off, as in ascender's eval mode
        B, T = len(c["lengths"]), c["T"]
        tokens = torch.randint(0, c["vocab"], (B, T), dtype=torch.int64)  # padded slots hold tokens too: ignored
        valid = torch.arange(T).unsqueeze(0) < torch.tensor(c["lengths"]).unsqueeze(1)  # (B, T), True = real
        # Gradients stay enabled: PyTorch's inference fast path of TransformerEncoderLayer is then not taken, and
        # the reference is the plain composition of documented ops.
        logits = model(tokens, valid if c["masked"] else None).detach()
        torch.save(model.state_dict(), os.path.join(d, "torch.pt"))
        r = run_tool("to-ascender", os.path.join(d, "torch.pt"), os.path.join(d, "ascender.safetensors"),
                     "--layers", str(c["layers"]))
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            return 1
        meta = {k: str(c[k]) for k in ARCH_KEYS}
        meta.update(norm_first=str(int(c["norm_first"])), masked=str(int(c["masked"])))
        torch_convert.write_safetensors(os.path.join(d, "io.safetensors"), {
            "tokens": ("I64", tokens.numpy()), "valid": ("BOOL", valid.numpy()), "logits": ("F64", logits.numpy())},
            meta)
    with open(os.path.join(root, "cases.txt"), "w") as f:
        f.write("\n".join(CASES) + "\n")
    print(f"exported {len(CASES)} cases to {root}")
    return 0


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8),
                                                                      b.view(-1).view(torch.uint8))


def roundtrip(root):
    for name, c in CASES.items():
        d = os.path.join(root, name)
        original = torch.load(os.path.join(d, "torch.pt"))
        # (1) what ascender itself saved (its own writer, its key order) -> .pt; (2) the converter's file ->
        # safetensors with PyTorch names: both must be the original state dict, bit for bit.
        for src, out in (("from_ascender.safetensors", "back.pt"), ("ascender.safetensors", "back.safetensors")):
            r = run_tool("to-torch", os.path.join(d, src), os.path.join(d, out))
            check(r.returncode == 0, f"{name}: to-torch {src} exited {r.returncode}: {r.stderr.strip()}")
            if r.returncode != 0:
                continue
            if out.endswith(".pt"):
                back = torch.load(os.path.join(d, out))
            else:
                back = {k: torch.from_numpy(a) for k, (_, a) in
                        torch_convert.read_safetensors(os.path.join(d, out))[0].items()}
            check(set(back) == set(original), f"{name}: {out} keys differ: {sorted(set(back) ^ set(original))}")
            for k, v in original.items():
                if k in back:
                    check(same_bits(back[k], v), f"{name}: {out} '{k}' is not bit-identical to the original")
            twin = make_twin(c)
            twin.load_state_dict(back, strict=True)  # raises on any mismatch
    errors(root)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"round trip bit-exact for {len(CASES)} cases; error paths as documented")
    return 0


def errors(root):
    """Unknown and missing keys are all listed, exit 1; a wrong --layers, a missing file, garbage: exit 1;
    bad flags: exit 2."""
    d = os.path.join(root, "prenorm")
    sd = torch.load(os.path.join(d, "torch.pt"))
    sd["layers.0.extra.weight"] = torch.zeros(2)
    sd["classifier.bias"] = torch.zeros(2)
    del sd["norm.bias"], sd["layers.1.self_attn.in_proj_weight"]
    bad = os.path.join(root, "bad.pt")
    torch.save(sd, bad)
    r = run_tool("to-ascender", bad, os.path.join(root, "bad.safetensors"))
    check(r.returncode == 1, f"unmatched keys: exit {r.returncode}, expected 1")
    for key in ("layers.0.extra.weight", "classifier.bias", "norm.bias", "layers.1.self_attn.in_proj_weight",
                "unknown (2)", "missing (2)"):
        check(key in r.stderr, f"unmatched keys: '{key}' not in the message: {r.stderr.strip()}")
    check(not os.path.exists(os.path.join(root, "bad.safetensors")), "unmatched keys: an output was written")
    r = run_tool("to-ascender", os.path.join(d, "torch.pt"), os.path.join(root, "x.safetensors"), "--layers", "3")
    check(r.returncode == 1 and "--layers 3" in r.stderr, f"--layers mismatch: {r.returncode} {r.stderr.strip()}")
    r = run_tool("to-torch", os.path.join(d, "torch.pt"), os.path.join(root, "x.pt"))  # PyTorch names given
    check(r.returncode == 1 and "unknown" in r.stderr, f"to-torch on torch names: {r.returncode} {r.stderr.strip()}")
    r = run_tool("to-torch", os.path.join(root, "no_such.safetensors"), os.path.join(root, "x.pt"))
    check(r.returncode == 1 and "no_such.safetensors" in r.stderr, f"missing file: {r.returncode} {r.stderr.strip()}")
    garbage = os.path.join(root, "garbage.safetensors")
    with open(garbage, "wb") as f:
        f.write(b"\xff" * 20)
    r = run_tool("to-torch", garbage, os.path.join(root, "x.pt"))
    check(r.returncode == 1 and "garbage.safetensors" in r.stderr and "Traceback" not in r.stderr,
          f"garbage file: {r.returncode} {r.stderr.strip()}")
    for argv in (["to-ascender"], ["sideways", "a", "b"], ["to-torch", "a", "b", "--layers", "x"]):
        r = run_tool(*argv)
        check(r.returncode == 2 and "usage" in r.stderr, f"bad arguments {argv}: exit {r.returncode}")
    r = run_tool("--help")
    check(r.returncode == 0 and "to-ascender" in r.stdout, "--help")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("export", "roundtrip"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(export(sys.argv[2]) if sys.argv[1] == "export" else roundtrip(sys.argv[2]))
