"""Quantizing bf16 / fp16 attention inputs for the FP8 forward of flashattn.torch.

    from flashattn.fp8 import hadamard_signs, quantize_e4m3
    signs = hadamard_signs(q.shape[-1], seed=0, device=q.device)   # once per model, Q and K alike
    q8, q_descale = quantize_e4m3(q, heads_kv=k.shape[2], signs=signs)
    k8, k_descale = quantize_e4m3(k, signs=signs)
    v8, v_descale = quantize_e4m3(v)
    out = flash_attn_func(q8, k8, v8, causal=True, q_descale=q_descale, k_descale=k_descale,
                          v_descale=v_descale)                      # bfloat16

Scales: one per (sequence, KV head) (flash-attn 3's descale shape), amax / 448; one per (sequence,
KV head, block of BLOCK_ROWS = 128 rows) for Q and K (per_block=True: block quantization, which the
FP8 forward takes for q_descale and k_descale; V keeps one per (sequence, KV head)); or one per
tensor (per_tensor=True). Incoherent processing (`signs`): Q and K are multiplied by the same orthogonal
transform H diag(signs) / sqrt(d) (H the Walsh-Hadamard matrix), which leaves QK^T, and so the
attention, unchanged and spreads an outlier entry over the whole head dim, so that one large value
no longer pushes the rest of its row toward e4m3's subnormals. Use it when Q or K have outliers
(the error measured on flash-attn 3's outlier data is in docs/kernels/fp8-forward.md); V is not
transformed. The head dim must then be a power of two.

quantize_e4m3 runs the library's kernels (flashattn/fp8.hpp: two passes over x, the transform fused;
CPU and CUDA tensors give the same bits) on the current stream.
"""
from typing import Optional

import torch
from torch import Tensor

from . import _C

E4M3_MAX = 448.0
BLOCK_ROWS = 128  # rows of Q or K per factor with per_block (flashattn::kFp8ScaleBlockRows)

__all__ = ["BLOCK_ROWS", "E4M3_MAX", "hadamard_signs", "quantize_e4m3"]


def hadamard_signs(head_dim: int, seed: int = 0, device=None) -> Tensor:
    """Random signs (+-1, float32) for quantize_e4m3's transform: draw them once, use them for Q and K."""
    if head_dim <= 0 or head_dim & (head_dim - 1):
        raise ValueError(f"flashattn.fp8: head_dim: expected a power of two, got {head_dim}")
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (head_dim,), generator=generator) * 2 - 1).to(torch.float32).to(device)


def quantize_e4m3(x: Tensor, heads_kv: Optional[int] = None, signs: Optional[Tensor] = None,
                  per_tensor: bool = False, per_block: bool = False) -> tuple[Tensor, Tensor]:  # fmt: skip
    """x (batch, seqlen, heads, d), float32 / float16 / bfloat16 -> (float8_e4m3fn, descale).

    descale: float32 (batch, heads_kv), one factor per sequence and KV head (the query heads of a
    group share their KV head's: pass heads_kv for q); (batch, heads_kv, ceil(seqlen / BLOCK_ROWS))
    with per_block (for q and k); or (1,) with per_tensor. signs: multiply by the random-sign
    Hadamard transform first (Q and K, the same signs).
    """
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"flashattn.fp8: x: expected a (batch, seqlen, heads, head_dim) tensor, got {getattr(x, 'shape', type(x).__name__)}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    heads_kv = x.shape[2] if heads_kv is None else int(heads_kv)
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if per_tensor:
        shape = (1,)
    elif per_block:
        shape = (x.shape[0], heads_kv, (x.shape[1] + BLOCK_ROWS - 1) // BLOCK_ROWS)
    else:
        shape = (x.shape[0], heads_kv)
    descale = torch.empty(shape, dtype=torch.float32, device=x.device)
    _C.quantize_e4m3(x, out, descale, signs=signs, heads_kv=heads_kv, per_tensor=bool(per_tensor),
                     per_block=bool(per_block))  # fmt: skip
    return out, descale
