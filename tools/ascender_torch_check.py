#!/usr/bin/env python3
"""Cross-implementation check of nn::AscenderAttention: an independent PyTorch float64 implementation of
docs/ascender.md, compared with what the C++ layer computed (tests/ascender_export.cpp wrote it, with the layer's
random weights, as safetensors) — the output y and the gradient of sum(y * g) with respect to the input and every
parameter, through the fused kernel and through the composed reference — to a relative 1e-9.

    python3 tools/ascender_torch_check.py --exporter build/release/tests/ascender_export   # exports, then checks
    python3 tools/ascender_torch_check.py case.safetensors ...                              # checks given files

Written from the documentation's formulas, not from the C++ code: the alignment variance by its definition (mean
squared distance of the unit keys to their mean) rather than the closed form, squared distances as sums of squared
differences, the neighbourhood as a 0/1 membership matrix. Exit status 0: all equal; 1: a mismatch; 77: PyTorch is
not installed (CTest reports the test as skipped).
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:  # CTest's SKIP_RETURN_CODE
    print("ascender_torch_check: python3-torch is not installed (bash tools/setup.sh --bench installs it): skipped")
    sys.exit(77)

torch.set_default_dtype(torch.float64)
TOL = 1e-9
DTYPES = {"F64": torch.float64, "F32": torch.float32, "I64": torch.int64, "BOOL": torch.bool}


def load_safetensors(path):
    """The format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    tensors = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=DTYPES[info["dtype"]]) if e > b else torch.zeros(0)
        tensors[name] = t.reshape(info["shape"]).clone()
    return tensors, meta


def per_head(s, heads, cast):
    v = [cast(x) for x in s.split(",")]
    return v if len(v) == heads else v * heads


def rope(x, base=10000.0):
    """Rotary embedding on (..., T, d): pairs (x_i, x_{i+d/2}) rotated by t · base^(-2i/d)."""
    t_len, d = x.shape[-2], x.shape[-1]
    m = d // 2
    theta = base ** (-2.0 * torch.arange(m) / d)
    ang = torch.arange(t_len)[:, None] * theta[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    rotated = torch.cat([-x[..., m:], x[..., :m]], -1)
    return x * cos + rotated * sin


def row_normalize(x, valid, eps):
    """(x - μ) / (σ + eps) over the valid entries of each row, population σ; 0 off the valid set and on constant rows
    (σ <= 1e-5 max|x|), which pass no gradient."""
    vf = valid.to(x.dtype)
    cnt = vf.sum(-1, keepdim=True).clamp_min(1)
    mu = (x * vf).sum(-1, keepdim=True) / cnt
    xc = (x - mu) * vf
    var = (xc * xc).sum(-1, keepdim=True) / cnt
    big = (x.abs() * vf).amax(-1, keepdim=True)
    with torch.no_grad():
        constant = var.sqrt() <= 1e-5 * big
    sd = torch.where(constant, torch.ones_like(var), var).sqrt()
    return torch.where(constant, torch.zeros_like(xc), xc / (sd + eps)) * vf


def layer_forward(p, x, meta, bias):
    B, T, D, H = (int(meta[k]) for k in ("B", "T", "d_model", "heads"))
    dh, dz, da = D // H, int(meta["d_z"]), int(meta["d_a"])
    ks = per_head(meta["k"], H, int)
    tau_sep, tau_coh = per_head(meta["tau_sep"], H, float), per_head(meta["tau_coh"], H, float)
    alpha_a, alpha_c = per_head(meta["alpha_align"], H, float), per_head(meta["alpha_coh"], H, float)
    after = meta["gate_position"] == "after_norm"
    include_self = meta["include_self"] == "1"
    use = {t: meta["use_" + t] == "1" for t in ("align", "sep", "coh")}
    eps, m_omega = float(meta["norm_eps"]), float(meta["omega_scale"])

    def lin(name, inp):
        out = inp @ p[name + ".weight"].T
        return out + p[name + ".bias"] if name + ".bias" in p else out

    def heads(t, c):  # (B, T, H c) -> (B, H, T, c)
        return t.reshape(B, T, H, c).permute(0, 2, 1, 3)

    q, k, v = (heads(lin(n, x), dh) for n in ("q_proj", "k_proj", "v_proj"))
    z, e = heads(lin("z_proj", x), dz), heads(lin("e_proj", x), da)
    q_rot, k_rot = (rope(q), rope(k)) if meta["rope"] == "1" else (q, k)
    softplus = torch.nn.functional.softplus
    lam = {t: softplus(p[f"lambda_{t}_raw"]) for t in ("align", "sep", "coh")}
    omega = {t: p[f"omega_{t}"] for t in ("align", "sep", "coh")}
    kappa, tau_score, delta = softplus(p["kappa_raw"]), softplus(p["tau_score_raw"]), p["delta"]

    # valid[b, i, j]: row i attends to key j (padding, causal, window).
    i_idx, j_idx = torch.arange(T)[:, None], torch.arange(T)[None, :]
    valid = meta["valid"].bool()[:, None, :].expand(B, T, T).clone()
    if meta["causal"] == "1":
        valid &= (j_idx <= i_idx)[None]
    if meta["mode"] == "windowed":
        w, g = int(meta["window"]), int(meta["global_tokens"])
        valid &= (((i_idx - j_idx).abs() < w) | (i_idx < g) | (j_idx < g))[None]
    eye = torch.eye(T, dtype=torch.bool)[None]
    vf = valid.to(x.dtype)

    outs = []
    for h in range(H):
        qh, kh, vh, zh, eh = q_rot[:, h], k[:, h], v[:, h], z[:, h], e[:, h]
        s_base = qh @ k_rot[:, h].transpose(-1, -2) / math.sqrt(dh)
        khat = kh / kh.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        ehat = eh / eh.norm(dim=-1, keepdim=True).clamp_min(1e-8)
        aff = ehat @ ehat.transpose(-1, -2)                                  # cos(e_i, e_j)
        d2 = ((zh[:, :, None, :] - zh[:, None, :, :]) ** 2).sum(-1)          # |z_i - z_j|²
        S = s_base
        if use["align"]:
            by = (s_base if meta["mode"] == "reuse" else aff).detach()
            cand = valid & (~eye if not include_self else torch.ones_like(eye))
            vals, idx = by.masked_fill(~cand, -math.inf).topk(min(ks[h], T), dim=-1)
            member = torch.zeros(B, T, T).scatter(-1, idx, torch.isfinite(vals).to(x.dtype))  # N(i) as 0/1
            cnt = member.sum(-1)
            s = member @ khat
            u = s / s.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            kbar = s / cnt.clamp_min(1)[..., None]
            spread = ((khat[:, None, :, :] - kbar[:, :, None, :]) ** 2).sum(-1)   # |k̂_l - k̄_i|²
            # the variance of an empty neighbourhood is 0 (docs §3): gamma = 1/2 there
            var = torch.where(cnt > 0, (member * spread).sum(-1) / cnt.clamp_min(1), torch.zeros_like(cnt))
            gamma = torch.sigmoid(-alpha_a[h] * var)
            r = u @ khat.transpose(-1, -2)
            gate = lam["align"][h] * gamma[..., None]
            bt = gate * row_normalize(r, valid, eps) if after else row_normalize(gate * r, valid, eps)
            S = S + m_omega * omega["align"][h] * bt
        if use["sep"]:
            ws = torch.exp(-d2 / tau_sep[h])
            rho = (ws * vf * (~eye)).sum(-1)
            eta = torch.minimum(torch.ones_like(rho), rho / kappa[h])
            phi = ws * torch.relu(aff - delta[h])
            gate = lam["sep"][h] * eta[..., None]
            bt = gate * row_normalize(-phi, valid, eps) if after else row_normalize(-gate * phi, valid, eps)
            S = S + m_omega * omega["sep"][h] * bt
        if use["coh"]:
            wc = torch.exp(-d2 / tau_coh[h]) * vf
            W = wc.sum(-1)
            c = (wc @ zh) / W.clamp_min(1e-30)[..., None]
            dist = ((zh[:, None, :, :] - c[:, :, None, :]) ** 2).sum(-1)     # |z_j - c_i|²
            var = (wc * dist).sum(-1) / W.clamp_min(1e-30)
            gamma = torch.sigmoid(-alpha_c[h] * var)
            gate = lam["coh"][h] * gamma[..., None]
            bt = gate * row_normalize(-dist, valid, eps) if after else row_normalize(-gate * dist / tau_coh[h], valid,
                                                                                        eps)
            S = S + m_omega * omega["coh"][h] * bt
        if bias is not None:
            S = S + bias[0, h]
        alive = valid.any(-1, keepdim=True)
        logits = (S / tau_score[h]).masked_fill(~valid, -math.inf).masked_fill(~alive, 0.0)
        A = torch.softmax(logits, -1) * alive
        outs.append(A @ vh)
    y = torch.stack(outs, 1).permute(0, 2, 1, 3).reshape(B, T, D)
    return lin("out_proj", y)


def check(path):
    t, meta = load_safetensors(path)
    meta = dict(meta, valid=t["valid"])
    params = {n[2:]: t[n].clone().requires_grad_(True) for n in t if n.startswith("p.")}
    x = t["x"].clone().requires_grad_(True)
    y = layer_forward(params, x, meta, t.get("bias"))
    (y * t["g"]).sum().backward()
    ours = {"y": y.detach(), "grad.x": x.grad}
    for n, prm in params.items():
        ours["grad.p." + n] = prm.grad if prm.grad is not None else torch.zeros_like(prm)
    worst, ok = 0.0, True
    for tag in ("", "ref."):
        for name, want in ours.items():
            got = t[tag + name]
            err = (got - want).abs().max().item() / max(1.0, want.abs().max().item())
            worst = max(worst, err)
            if not err <= TOL:
                ok = False
                print(f"  MISMATCH {os.path.basename(path)} {tag or 'fused.'}{name}: relative error {err:.3e}")
    label = os.path.basename(path).removesuffix(".safetensors")
    print(f"{label:32s} {'ok' if ok else 'FAIL'}   worst relative error {worst:.2e} over y and "
          f"{len(ours) - 1} gradients, fused and reference")
    return ok


def main(argv):
    files = []
    if len(argv) >= 2 and argv[0] == "--exporter":
        out = tempfile.mkdtemp(prefix="ascender_check_")
        subprocess.run([argv[1], out], check=True, stdout=subprocess.DEVNULL)
        files = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".safetensors"))
    else:
        files = argv
    if not files:
        print(__doc__)
        return 2
    print(f"PyTorch {torch.__version__}, float64, tolerance {TOL:g} relative to max(1, max|value|)")
    results = [check(f) for f in files]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
