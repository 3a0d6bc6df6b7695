"""flash-attn's interface on flashattn, for PyTorch.

Switch by changing one import::

    from flash_attn import flash_attn_func   ->   from flashattn.torch import flash_attn_func

Same names, arguments, layouts and return values as flash-attn 2: q (batch, seqlen_q, nheads,
headdim), k and v (batch, seqlen_k, nheads_k, headdim), nheads a multiple of nheads_k; packed
variable-length q (total_q, nheads, headdim) with int32 cu_seqlens; softmax_lse float32
(batch, nheads, seqlen_q), or (nheads, total_q) packed, contiguous. Outputs are allocated here;
CUDA work runs on the current stream; CPU tensors run on flashattn's CPU backend.

Window and causal arguments follow flash-attn's rules: a window size that is negative or
>= seqlen_k (max_seqlen_k packed) is unbounded, causal=True sets the right size to 0 whatever is
given, and the sizes may be ints or 0-d tensors. alibi_slopes: float32 (nheads,) or (batch,
nheads), on q's device; the score of query i and key j gains -slope * |i + seqlen_k - seqlen_q - j|
(after softcap), with each sequence's own lengths when packed; no gradient flows to the slopes.
flash-attn's causal kernels add slope * j instead (the same up to a constant per row): outputs and
gradients agree, softmax_lse differs by slope * (i + seqlen_k - seqlen_q).

Differences from flash-attn: dropout (dropout_p > 0) and paged KV (block_table) are not
implemented and raise NotImplementedError. return_attn_probs=True returns
(out, softmax_lse, None): the probabilities are never formed (flash-attn also returns None there
without dropout). As in flash-attn, no gradient flows through softmax_lse.

Autograd runs flashattn's backward. Both directions are torch.library custom ops
(flashattn::forward, flashattn::backward) with fake implementations and an autograd rule, so
torch.compile(fullgraph=True) traces models that use them without graph breaks. Eager calls run the
same implementation through a plain autograd.Function instead of the dispatcher: on an H100 host a
forward without grad took 17 us this way and 65 us through the custom op, a forward + backward 276
and 737 us (python/benchmarks/results/).
"""
import operator
from typing import Optional

import torch
from torch import Tensor

from . import _C

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]

# ---- the two operations: allocate the outputs, let the library write them --------------------


def _empty_lse(q: Tensor, varlen: bool) -> Tensor:
    """The forward's float32 LSE for q: (batch, nheads, seqlen_q), or (nheads, total_q) packed.

    A q of the wrong rank gets an empty LSE: the library then reports q itself.
    """
    if varlen:
        shape = (q.shape[1], q.shape[0]) if q.dim() == 3 else (0, 0)
    else:
        shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (0, 0, 0)
    return q.new_empty(shape, dtype=torch.float32)


def _write_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q, max_seqlen_k,
                   softmax_scale, causal, window_left, window_right, softcap):  # fmt: skip
    _C.forward(
        q, k, v, out, lse,
        softmax_scale=softmax_scale, causal=causal, window_size=(window_left, window_right),
        softcap=softcap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, alibi_slopes=alibi_slopes,
    )  # fmt: skip


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor]:
    out, lse = torch.empty_like(q), _empty_lse(q, cu_seqlens_q is not None)
    _write_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q, max_seqlen_k,
                   softmax_scale, causal, window_left, window_right, softcap)  # fmt: skip
    return out, lse


def _forward_fake(q, k, v, cu_seqlens_q, *options) -> tuple[Tensor, Tensor]:
    return torch.empty_like(q), _empty_lse(q, cu_seqlens_q is not None)


def _forward_without_lse(q, k, v, *options) -> Tensor:
    """Inference: the output alone, with no LSE to allocate or write."""
    out = torch.empty_like(q)
    _write_forward(q, k, v, out, None, *options[:-1])  # all but `deterministic`
    return out


def _backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _C.backward(
        dout, q, k, v, out, lse, dq, dk, dv,
        deterministic=deterministic, softmax_scale=softmax_scale, causal=causal,
        window_size=(window_left, window_right), softcap=softcap,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, alibi_slopes=alibi_slopes,
    )  # fmt: skip
    return dq, dk, dv


def _backward_fake(dout, q, k, v, *rest) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# ---- autograd: one rule, used by the custom op and by the eager Function -----------------------

_NON_TENSOR_INPUTS = 11  # forward inputs after q, k, v: none of them has a gradient (nor the slopes)


def _save_for_backward(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    ctx.options = options


def _gradients(ctx, dout: Tensor, backward) -> tuple:
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
    dout = _last_dim_contiguous(dout, "dout")
    dq, dk, dv = backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *ctx.options)
    return (dq, dk, dv) + (None,) * _NON_TENSOR_INPUTS


_forward_op = torch.library.custom_op("flashattn::forward", _forward, mutates_args=())
_forward_op.register_fake(_forward_fake)
_backward_op = torch.library.custom_op("flashattn::backward", _backward, mutates_args=())
_backward_op.register_fake(_backward_fake)
_forward_op.register_autograd(
    lambda ctx, dout, dlse: _gradients(ctx, dout, _backward_op), setup_context=_save_for_backward
)


class _EagerAttention(torch.autograd.Function):
    """The custom op's autograd without the dispatcher, for eager calls."""

    @staticmethod
    def forward(ctx, *inputs):
        out, lse = _forward(*inputs)
        _save_for_backward(ctx, inputs, (out, lse))
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        return _gradients(ctx, dout, _backward)


def _last_dim_contiguous(x: Tensor, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"flashattn: {name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise TypeError(f"flashattn: {name}.layout: expected torch.strided (a dense tensor), got {x.layout}")
    return x if x.dim() == 0 or x.stride(-1) == 1 else x.contiguous()


_INT32_MAX = 2**31 - 1


def _window(window_size) -> tuple[int, int]:
    """flash-attn's (left, right) window: ints or 0-d tensors; any negative size is unbounded (-1).

    The library applies the rest of flash-attn's rules: sizes >= seqlen_k are unbounded, causal
    sets right to 0.
    """
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"flashattn: window_size: expected (left, right), got {window_size!r}") from None
    sizes = []
    for name, w in (("window_size[0]", left), ("window_size[1]", right)):
        if isinstance(w, Tensor):
            if w.numel() != 1 or w.is_floating_point() or w.is_complex() or w.dtype == torch.bool:
                raise TypeError(f"flashattn: {name}: expected an int or a 0-d integer tensor, got {w.dtype} {tuple(w.shape)}")
            w = int(w.item())
        else:
            try:
                w = operator.index(w)
            except TypeError:
                raise TypeError(f"flashattn: {name}: expected an int, got {type(w).__name__}") from None
        sizes.append(min(max(w, -1), _INT32_MAX))  # beyond any seqlen_k: unbounded all the same
    return sizes[0], sizes[1]


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
               softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
               return_lse, block_table=None) -> tuple[Tensor, Optional[Tensor]]:  # fmt: skip
    """(out, lse); lse is None where neither the caller nor autograd needs it."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flashattn: dropout_p: expected a probability in [0, 1), got {dropout_p}")
    if dropout_p > 0.0:
        raise NotImplementedError(f"flashattn: dropout_p: expected 0.0 (dropout is not implemented), got {dropout_p}")
    if block_table is not None:
        raise NotImplementedError("flashattn: block_table: expected None (paged KV is not implemented), got a tensor")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, Tensor):
            raise TypeError(f"flashattn: alibi_slopes: expected a torch.Tensor or None, got {type(alibi_slopes).__name__}")
        alibi_slopes = _last_dim_contiguous(alibi_slopes, "alibi_slopes")
    window_left, window_right = _window(window_size)
    inputs = (
        _last_dim_contiguous(q, "q"), _last_dim_contiguous(k, "k"), _last_dim_contiguous(v, "v"),
        cu_seqlens_q, cu_seqlens_k, alibi_slopes, int(max_seqlen_q), int(max_seqlen_k),
        None if softmax_scale is None else float(softmax_scale), bool(causal),
        int(window_left), int(window_right), float(softcap), bool(deterministic),
    )  # fmt: skip
    if torch.compiler.is_compiling():
        return _forward_op(*inputs)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _EagerAttention.apply(*inputs)
    return _forward(*inputs) if return_lse else (_forward_without_lse(*inputs), None)


# ---- flash-attn's functions -------------------------------------------------------------------


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):  # fmt: skip
    """Attention over (batch, seqlen, nheads, headdim) tensors.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim).
    softmax_scale: default 1 / sqrt(headdim). causal: bottom-right aligned when seqlen_q !=
    seqlen_k. window_size: (left, right) sliding window (ints or 0-d tensors), negative or >=
    seqlen_k unbounded; causal sets right to 0. softcap: 0 = off. alibi_slopes: float32 (nheads,)
    or (batch, nheads): adds -slope * |i + seqlen_k - seqlen_q - j| to the score of query i, key j.
    deterministic: the backward gives the same bits on every run.
    Returns out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse, None) with
    return_attn_probs=True; softmax_lse is float32 (batch, nheads, seqlen_q).
    """
    out, lse = _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size,
                          softcap, alibi_slopes, deterministic, return_attn_probs)  # fmt: skip
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):  # fmt: skip
    """Attention over sequences of different lengths, packed along the first dimension.

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim). cu_seqlens_q/k: int32
    (batch + 1,) offsets of each sequence, on q's device; max_seqlen_q/k: the longest sequence.
    Returns out (total_q, nheads, headdim), or (out, softmax_lse, None) with
    return_attn_probs=True; softmax_lse is float32 (nheads, total_q). Other arguments as
    flash_attn_func.
    """
    out, lse = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                          softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                          return_attn_probs, block_table)  # fmt: skip
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False,
                              return_attn_probs=False):  # fmt: skip
    """flash_attn_func with qkv (batch, seqlen, 3, nheads, headdim); q, k, v are views of it."""
    q, k, v = qkv.unbind(dim=-3)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)  # fmt: skip


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False,
                             return_attn_probs=False):  # fmt: skip
    """flash_attn_func with kv (batch, seqlen_k, 2, nheads_k, headdim); k, v are views of it."""
    k, v = kv.unbind(dim=-3)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)  # fmt: skip


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                                     causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                     deterministic=False, return_attn_probs=False):  # fmt: skip
    """flash_attn_varlen_func with qkv (total, 3, nheads, headdim) and one set of offsets."""
    q, k, v = qkv.unbind(dim=-3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)  # fmt: skip


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                    softcap=0.0, alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):  # fmt: skip
    """flash_attn_varlen_func with kv (total_k, 2, nheads_k, headdim); k, v are views of it."""
    k, v = kv.unbind(dim=-3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs)  # fmt: skip
