#!/usr/bin/env python3
"""Converts checkpoints between a PyTorch Transformer classifier and ascender's models::TransformerClassifier
(dense attention), in both directions. The name map, the mask polarity and the pooling: docs/torch_convert.md.

    python3 tools/torch_convert.py to-ascender model.pt model.safetensors [--layers 2]
    python3 tools/torch_convert.py to-torch model.safetensors back.pt          # .pt: torch.save; else safetensors

Input: a PyTorch state dict saved with torch.save (.pt / .pth / .bin; a dict holding it under "state_dict" or
"model" works too) or a safetensors file. Output: safetensors (this file's own reader and writer, numpy only), or a
torch.save'd state dict when OUT ends in .pt / .pth. Values are copied bit for bit (the packed q/k/v projection is
split or re-packed by rows, nothing is recomputed), in the checkpoint's dtype.

The PyTorch side is TorchTransformerClassifier below: nn.TransformerEncoderLayer blocks (batch_first) between
token + learned positional embeddings and a final LayerNorm, masked mean pooling and a Linear head, which computes
what ascender's TransformerClassifier computes. Exit status: 0 done; 1 a missing / malformed file or a checkpoint
whose keys do not match the architecture (every unknown and missing key listed); 2 bad arguments.
"""
import argparse
import json
import os
import re
import struct
import sys

try:
    import numpy as np
except ImportError:
    sys.exit("torch_convert.py: numpy is not installed (apt-get install python3-numpy)")

# safetensors dtype tag <-> numpy dtype. BF16 has no numpy type: its raw 16-bit patterns travel as uint16 with the
# tag kept beside them, so a bfloat16 checkpoint converts unchanged.
NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
                "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


class ConvertError(Exception):
    """A user-facing problem (bad file, unmatched keys): printed as one message, exit status 1."""


# ---- safetensors ------------------------------------------------------------------------------------------------

def read_safetensors(path):
    """Returns ({name: (tag, array)}, metadata). Layout: 8-byte little-endian header length N, N bytes of JSON
    {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise ConvertError(f"{path}: cannot read ({e.strerror})")
    if len(blob) < 8:
        raise ConvertError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ConvertError(f"{path}: not a safetensors file (header length {n} exceeds the file)")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path}: malformed safetensors header ({e})")
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: malformed safetensors header (not a JSON object)")
    meta = header.pop("__metadata__", {}) or {}
    data = memoryview(blob)[8 + n:]
    tensors = {}
    for name, info in header.items():
        try:
            tag, shape, (b, e) = info["dtype"], [int(s) for s in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ConvertError(f"{path}: malformed safetensors entry '{name}'")
        if tag not in NUMPY_DTYPES:
            raise ConvertError(f"{path}: '{name}' has dtype {tag}, not supported ({', '.join(NUMPY_DTYPES)})")
        dt = np.dtype(NUMPY_DTYPES[tag]).newbyteorder("<")
        count = int(np.prod(shape, dtype=np.int64))
        if not (0 <= b <= e <= len(data)) or e - b != count * dt.itemsize:
            raise ConvertError(f"{path}: '{name}' has data offsets [{b}, {e}] that do not fit shape {shape} {tag}")
        tensors[name] = (tag, np.frombuffer(data[b:e], dtype=dt).reshape(shape).copy())
    return tensors, meta


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: (tag, array)} in the order given; the header is padded with spaces to a multiple of 8."""
    header, offset, chunks = {}, 0, []
    for name, (tag, arr) in tensors.items():
        raw = np.ascontiguousarray(arr, dtype=np.dtype(NUMPY_DTYPES[tag]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        chunks.append(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"  # a crash never leaves a half-written file under `path`
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for c in chunks:
                f.write(c)
        os.replace(tmp, path)
    except OSError as e:
        raise ConvertError(f"{path}: cannot write ({e.strerror})")


# ---- torch files (imported only when a .pt is read or written) --------------------------------------------------

def import_torch(path):
    try:
        import torch
    except ImportError:
        raise ConvertError(f"{path}: reading or writing a .pt file needs PyTorch (apt-get install python3-torch); "
                           f"safetensors files convert without it")
    return torch


TORCH_TAGS = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
              "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def read_torch(path):
    torch = import_torch(path)
    try:
        obj = torch.load(path, map_location="cpu")
    except Exception as e:  # torch raises many types for a bad file; all of them mean "not a checkpoint"
        raise ConvertError(f"{path}: cannot load with torch.load ({type(e).__name__}: {e})")
    if isinstance(obj, dict):
        for key in ("state_dict", "model"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ConvertError(f"{path}: not a state dict (expected a mapping of names to tensors)")
    out = {}
    for name, t in obj.items():
        tag = TORCH_TAGS.get(str(t.dtype).replace("torch.", ""))
        if tag is None:
            raise ConvertError(f"{path}: '{name}' has dtype {t.dtype}, not supported")
        t = t.detach().contiguous()
        arr = t.view(torch.int16).numpy().view(np.uint16) if tag == "BF16" else t.numpy()
        out[name] = (tag, arr.copy())
    return out, {}


def write_torch(path, tensors):
    torch = import_torch(path)
    sd = {}
    for name, (tag, arr) in tensors.items():
        t = torch.from_numpy(np.ascontiguousarray(arr).copy())
        sd[name] = t.view(torch.bfloat16) if tag == "BF16" else t
    try:
        torch.save(sd, path)
    except OSError as e:
        raise ConvertError(f"{path}: cannot write ({e.strerror})")


def is_torch_file(path):
    return path.lower().endswith((".pt", ".pth", ".bin"))


def read_any(path):
    if not os.path.isfile(path):
        raise ConvertError(f"{path}: no such file")
    return read_torch(path) if is_torch_file(path) else read_safetensors(path)


# ---- the name map -----------------------------------------------------------------------------------------------
# Per block i (PyTorch nn.TransformerEncoderLayer -> ascender nn::TransformerEncoderBlock). in_proj_weight (3 D, D)
# stacks the q, k and v projections by rows in that order, like in_proj_bias (3 D); ascender keeps three Linear.
BLOCK_MAP = [  # (torch suffix, ascender suffix) for the one-to-one entries
    ("self_attn.out_proj.weight", "attn.out_proj.weight"), ("self_attn.out_proj.bias", "attn.out_proj.bias"),
    ("linear1.weight", "linear1.weight"), ("linear1.bias", "linear1.bias"),
    ("linear2.weight", "linear2.weight"), ("linear2.bias", "linear2.bias"),
    ("norm1.weight", "norm1.weight"), ("norm1.bias", "norm1.bias"),
    ("norm2.weight", "norm2.weight"), ("norm2.bias", "norm2.bias"),
]
PACKED = [("self_attn.in_proj_weight", "weight"), ("self_attn.in_proj_bias", "bias")]
QKV = ("q_proj", "k_proj", "v_proj")
TOP_MAP = [("tok_emb.weight", "tok_emb.weight"), ("pos_emb.weight", "pos_emb.weight"), ("norm.weight", "norm.weight"),
           ("norm.bias", "norm.bias"), ("head.weight", "head.weight"), ("head.bias", "head.bias")]


def count_layers(names, pattern, path, expected):
    """The block count: one more than the largest index in `pattern` (its group 1), checked against --layers."""
    idx = [int(m.group(1)) for m in (re.match(pattern, n) for n in names) if m]
    found = max(idx) + 1 if idx else 0
    if expected is not None and expected != found:
        raise ConvertError(f"{path}: --layers {expected} given but the checkpoint has {found} blocks")
    return found


def check_keys(path, got, expected):
    """Every unknown and every missing key at once, so one run shows the whole mismatch."""
    unknown = [k for k in got if k not in expected]
    missing = [k for k in expected if k not in got]
    if unknown or missing:
        lines = [f"{path}: the keys do not match a TransformerClassifier with these blocks"]
        if unknown:
            lines.append(f"  unknown ({len(unknown)}): " + ", ".join(unknown))
        if missing:
            lines.append(f"  missing ({len(missing)}): " + ", ".join(missing))
        raise ConvertError("\n".join(lines))


def torch_to_ascender(src, path, layers=None):
    n = count_layers(src, r"layers\.(\d+)\.", path, layers)
    expected = [t for t, _ in TOP_MAP] + [f"layers.{i}.{s}" for i in range(n) for s, _ in BLOCK_MAP + PACKED]
    check_keys(path, src, expected)
    out = {}
    for t, a in TOP_MAP[:2]:
        out[a] = src[t]
    for i in range(n):
        for t_suffix, kind in PACKED:
            tag, arr = src[f"layers.{i}.{t_suffix}"]
            if arr.shape[0] % 3 != 0:
                raise ConvertError(f"{path}: layers.{i}.{t_suffix} has shape {list(arr.shape)}; its first dimension "
                                   f"must be 3 * d_model (q, k, v stacked)")
            for j, part in enumerate(np.split(arr, 3, axis=0)):
                out[f"blocks.{i}.attn.{QKV[j]}.{kind}"] = (tag, part.copy())
        for t_suffix, a_suffix in BLOCK_MAP:
            out[f"blocks.{i}.{a_suffix}"] = src[f"layers.{i}.{t_suffix}"]
    for t, a in TOP_MAP[2:]:
        out[a] = src[t]
    return out


def ascender_to_torch(src, path, layers=None):
    n = count_layers(src, r"blocks\.(\d+)\.", path, layers)
    expected = [a for _, a in TOP_MAP] + [f"blocks.{i}.{s}" for i in range(n) for _, s in BLOCK_MAP] + \
               [f"blocks.{i}.attn.{p}.{kind}" for i in range(n) for p in QKV for _, kind in PACKED]
    check_keys(path, src, expected)
    out = {}
    for t, a in TOP_MAP[:2]:
        out[t] = src[a]
    for i in range(n):
        for t_suffix, kind in PACKED:
            parts = [src[f"blocks.{i}.attn.{p}.{kind}"] for p in QKV]
            tags = {tag for tag, _ in parts}
            shapes = {arr.shape for _, arr in parts}
            if len(tags) != 1 or len(shapes) != 1:
                raise ConvertError(f"{path}: blocks.{i}.attn.{{q,k,v}}_proj.{kind} differ in dtype or shape "
                                   f"({sorted(tags)}, {sorted(shapes)}); they are packed into one tensor")
            out[f"layers.{i}.{t_suffix}"] = (parts[0][0], np.concatenate([arr for _, arr in parts], axis=0))
        for t_suffix, a_suffix in BLOCK_MAP:
            out[f"layers.{i}.{t_suffix}"] = src[f"blocks.{i}.{a_suffix}"]
    for t, a in TOP_MAP[2:]:
        out[t] = src[a]
    return out


# ---- the PyTorch twin -------------------------------------------------------------------------------------------

def torch_transformer_classifier(vocab, max_len, classes, d_model=128, heads=4, layers=2, ffn=512, dropout=0.1,
                                 norm_first=True):
    """A torch.nn.Module computing ascender's models::TransformerClassifier (dense attention) with the same
    options and defaults; its state dict converts with to-ascender. forward(tokens (B, T) int64, valid (B, T) bool
    or None; True = real token) -> logits (B, classes). The classifier's blocks always use the exact (erf) GELU
    and LayerNorm eps 1e-5, which are PyTorch's "gelu" and default eps."""
    import torch
    from torch import nn

    class TorchTransformerClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb = nn.Embedding(vocab, d_model)
            self.pos_emb = nn.Embedding(max_len, d_model)
            self.layers = nn.ModuleList([
                nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=ffn, dropout=dropout, activation="gelu",
                                           batch_first=True, norm_first=norm_first)
                for _ in range(layers)])
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, classes)

        def forward(self, tokens, valid=None):
            T = tokens.shape[1]
            x = self.tok_emb(tokens) + self.pos_emb(torch.arange(T, device=tokens.device))  # (B, T, D)
            # PyTorch's key padding mask is True at padding: the opposite of ascender's `valid`.
            pad = None if valid is None else ~valid
            for layer in self.layers:
                x = layer(x, src_key_padding_mask=pad)
            x = self.norm(x)
            if valid is None:
                return self.head(x.mean(dim=1))
            w = valid.to(x.dtype).unsqueeze(-1)  # (B, T, 1): masked mean over the real tokens
            return self.head((x * w).sum(dim=1) / w.sum(dim=1).clamp(min=1.0))

    return TorchTransformerClassifier()


# ---- command line -----------------------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(
        prog="torch_convert.py",
        description="Convert Transformer classifier checkpoints between PyTorch (nn.TransformerEncoderLayer names) "
                    "and ascender (models::TransformerClassifier names). See docs/torch_convert.md.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{to-ascender,to-torch}")
    for name, helptext in (("to-ascender", "PyTorch state dict (.pt or safetensors) -> ascender safetensors"),
                           ("to-torch", "ascender safetensors -> PyTorch names (.pt / .pth: torch.save, else safetensors)")):
        s = sub.add_parser(name, help=helptext, description=helptext)
        s.add_argument("input", metavar="IN")
        s.add_argument("output", metavar="OUT")
        s.add_argument("--layers", type=int, metavar="N",
                       help="the expected number of blocks (default: counted from the keys); a mismatch is an error")
    args = p.parse_args(argv)
    if args.layers is not None and args.layers < 0:
        p.error(f"--layers must be >= 0, got {args.layers}")
    try:
        src, meta = read_any(args.input)
        if args.command == "to-ascender":
            out = torch_to_ascender(src, args.input, args.layers)
            if is_torch_file(args.output):
                raise ConvertError(f"{args.output}: ascender checkpoints are safetensors; choose another extension")
            write_safetensors(args.output, out, {"converted_from": "pytorch"})
        else:
            out = ascender_to_torch(src, args.input, args.layers)
            if is_torch_file(args.output):
                write_torch(args.output, out)
            else:
                write_safetensors(args.output, out, {"converted_from": "ascender"})
    except ConvertError as e:
        print(f"torch_convert.py: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} ({len(out)} tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
