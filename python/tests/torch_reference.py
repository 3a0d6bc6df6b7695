"""Attention in PyTorch for the tests: F.scaled_dot_product_attention where it applies, explicit
math where it does not (softcap, rows that see no key). In float64 it is the ground truth; in
the tested dtype it is PyTorch's own accuracy, the baseline that flashattn's error is held to."""
import math

import torch
import torch.nn.functional as F


def visible(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1), device="cpu"):
    """(seqlen_q, seqlen_k) boolean mask, bottom-right aligned as flash-attn >= 2.1."""
    left, right = window_size
    if causal:
        right = 0
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= i - left
    if right >= 0:
        mask &= j <= i + right
    return mask


def alibi_bias(slopes, batch, seqlen_q, seqlen_k, device):
    """(b or 1, hq, sq, sk) float32: -slope * |i + seqlen_k - seqlen_q - j| (flash-attn's ALiBi)."""
    slopes = slopes.to(device=device, dtype=torch.float64)
    slopes = slopes[None] if slopes.dim() == 1 else slopes
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    return -slopes[:, :, None, None] * (i - j).abs().double()


def attention(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None):
    """q (b, sq, hq, d), k and v (b, sk, hk, d), computed in their dtype; returns (out, lse).
    alibi_slopes: (hq,) or (b, hq); the bias is added after softcap.

    Differentiable: gradients come from autograd.
    """
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if softmax_scale is None else softmax_scale
    mask = visible(sq, sk, causal, window_size, q.device)
    # (b, h, s, d), K/V heads repeated for GQA.
    qt = q.transpose(1, 2)
    kt = k.transpose(1, 2).repeat_interleave(hq // hk, dim=1)
    vt = v.transpose(1, 2).repeat_interleave(hq // hk, dim=1)
    raw = (qt @ kt.transpose(-1, -2)) * scale
    if softcap > 0:
        raw = softcap * torch.tanh(raw / softcap)
    if alibi_slopes is not None:
        raw = raw + alibi_bias(alibi_slopes, b, sq, sk, q.device).to(raw.dtype)
    raw = raw.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(raw.to(torch.promote_types(raw.dtype, torch.float32)), dim=-1)
    seen = mask.any(dim=1)
    if softcap == 0 and alibi_slopes is None and bool(seen.all()):
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)
    else:  # rows that see no key: 0, with no NaN in the gradient
        p = torch.softmax(raw.masked_fill(~seen[:, None], 0.0), dim=-1) * seen[:, None]
        out = p @ vt
    return out.transpose(1, 2), lse


def rel_err(x, ref):
    """||x - ref|| / ||ref||, in float64."""
    x, ref = x.detach().double(), ref.detach().double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()
