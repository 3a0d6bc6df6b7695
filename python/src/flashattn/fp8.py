"""Quantizing bf16 / fp16 attention inputs for the FP8 (e4m3) forward of flashattn.torch.

    from flashattn.fp8 import hadamard_signs, quantize_e4m3
    signs = hadamard_signs(q.shape[-1], seed=0, device=q.device)   # once per model, Q and K alike
    q8, q_descale = quantize_e4m3(q, heads_kv=k.shape[2], signs=signs)
    k8, k_descale = quantize_e4m3(k, signs=signs)
    v8, v_descale = quantize_e4m3(v)
    out = flash_attn_func(q8, k8, v8, causal=True, q_descale=q_descale, k_descale=k_descale,
                          v_descale=v_descale)                      # bfloat16

Scales: one per (sequence, KV head) (flash-attn 3's descale shape), amax / 448, or one per tensor
(per_tensor=True). Incoherent processing (`signs`): Q and K are multiplied by the same orthogonal
transform H diag(signs) / sqrt(d) (H the Walsh-Hadamard matrix), which leaves QK^T, and so the
attention, unchanged and spreads an outlier entry over the whole head dim, so that one large value
no longer pushes the rest of its row toward e4m3's subnormals. Use it when Q or K have outliers
(the error measured on flash-attn 3's outlier data is in docs/kernels/fp8-forward.md); V is not
transformed. The head dim must be a power of two.

These helpers are plain PyTorch (a few passes over the tensor), not fused kernels: their time is
part of a user's cost and is measured beside the kernel's in docs/kernels/fp8-forward.md.
"""
from typing import Optional

import torch
from torch import Tensor

E4M3_MAX = 448.0

__all__ = ["E4M3_MAX", "hadamard_signs", "incoherent", "quantize_e4m3"]


def hadamard_signs(head_dim: int, seed: int = 0, device=None) -> Tensor:
    """Random signs (+-1, float32) for `incoherent`: draw them once and use them for Q and K."""
    if head_dim <= 0 or head_dim & (head_dim - 1):
        raise ValueError(f"flashattn.fp8: head_dim: expected a power of two, got {head_dim}")
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (head_dim,), generator=generator) * 2 - 1).to(torch.float32).to(device)


def incoherent(x: Tensor, signs: Tensor) -> Tensor:
    """x times H diag(signs) / sqrt(d) over its last dim (fast Walsh-Hadamard, in float32)."""
    d = x.shape[-1]
    if signs.shape != (d,):
        raise ValueError(f"flashattn.fp8: signs: expected shape ({d},) for head dim {d}, got {tuple(signs.shape)}")
    y = (x.float() * signs.to(x.device)).reshape(-1, d)
    h = 1
    while h < d:  # butterflies over pairs (i, i + h) within blocks of 2h
        y = y.view(-1, d // (2 * h), 2, h)
        y = torch.stack((y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]), dim=2).view(-1, d)
        h *= 2
    return (y / d**0.5).view(x.shape)


def quantize_e4m3(x: Tensor, heads_kv: Optional[int] = None, signs: Optional[Tensor] = None,
                  per_tensor: bool = False) -> tuple[Tensor, Tensor]:  # fmt: skip
    """x (batch, seqlen, heads, d) -> (float8_e4m3fn x / descale, descale).

    descale: float32 (batch, heads_kv), one factor per sequence and KV head (the query heads of a
    group share their KV head's: pass heads_kv for q), or (1,) with per_tensor. signs: apply
    `incoherent` first (Q and K, the same signs).
    """
    if x.dim() != 4:
        raise ValueError(f"flashattn.fp8: x: expected (batch, seqlen, heads, head_dim), got shape {tuple(x.shape)}")
    if signs is not None:
        x = incoherent(x, signs)
    batch, _, heads, _ = x.shape
    heads_kv = heads if heads_kv is None else heads_kv
    if heads % heads_kv:
        raise ValueError(f"flashattn.fp8: heads_kv: expected a divisor of the {heads} heads, got {heads_kv}")
    magnitude = x.abs().float()
    if per_tensor:
        amax = magnitude.amax().reshape(1)
        scaled = x.float() / (amax / E4M3_MAX).clamp_min(1e-30)
    else:
        amax = magnitude.reshape(batch, -1, heads_kv, heads // heads_kv, x.shape[-1]).amax(dim=(1, 3, 4))
        factor = (amax / E4M3_MAX).clamp_min(1e-30)
        scaled = x.float() / factor.repeat_interleave(heads // heads_kv, dim=1)[:, None, :, None]
    descale = (amax / E4M3_MAX).clamp_min(1e-30).to(torch.float32)
    return scaled.to(torch.float8_e4m3fn), descale
