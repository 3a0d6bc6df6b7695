"""flash-attn's interface on flashattn, for PyTorch.

Switch by changing one import::

    from flash_attn import flash_attn_func   ->   from flashattn.torch import flash_attn_func

Same names, arguments, layouts and return values as flash-attn 2: q (batch, seqlen_q, nheads,
headdim), k and v (batch, seqlen_k, nheads_k, headdim), nheads a multiple of nheads_k; packed
variable-length q (total_q, nheads, headdim) with int32 cu_seqlens; softmax_lse float32
(batch, nheads, seqlen_q), or (nheads, total_q) packed, contiguous. Outputs are allocated here;
CUDA work runs on the current stream; CPU tensors run on flashattn's CPU backend.

Dropout (dropout_p > 0): the random numbers come from torch's generator of q's device, so
torch.manual_seed reproduces a run. Each call draws a (seed, offset) pair into a small int64
tensor with torch.randint (an ordinary generator op, so CUDA graphs capture it: every replay
draws anew) and the kernels read the pair from that tensor when they run; the backward reuses
the forward's tensor, so it regenerates the same mask. Which entries a (seed, offset) drops is
the same on the CPU and every GPU kernel (src/common/philox.hpp). The dropout is applied whenever
dropout_p > 0, as in flash-attn (pass 0 in evaluation).

return_attn_probs=True returns (out, softmax_lse, S_dmask). Without dropout S_dmask is None
(flash-attn returns an unspecified tensor there). With dropout it is, as flash-attn's, a
(batch, nheads, seqlen_q rounded up to 128, seqlen_k rounded up to 128) tensor of probabilities
relative to the running max of flash-attn 2's key blocks, with dropped entries negated: its tests
decode it (sign = mask; magnitudes normalized by the LSE). It is computed here, in float32 from q
and k, for testing only: O(seqlen_q * seqlen_k) memory.

ALiBi (alibi_slopes) and paged KV (block_table) are not implemented and raise
NotImplementedError. Dropout together with softcap raises NotImplementedError on CUDA tensors (as
flash-attn). As in flash-attn, no gradient flows through softmax_lse.

Autograd runs flashattn's backward. Both directions are torch.library custom ops
(flashattn::forward, flashattn::backward) with fake implementations and an autograd rule, so
torch.compile(fullgraph=True) traces models that use them without graph breaks. Eager calls run the
same implementation through a plain autograd.Function instead of the dispatcher: on an H100 host a
forward without grad took 17 us this way and 65 us through the custom op, a forward + backward 276
and 737 us (python/benchmarks/results/).
"""
from typing import Optional

import torch
from torch import Tensor

from . import _C, _dropout

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


def _write_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, max_seqlen_q, max_seqlen_k, dropout_p,
                   softmax_scale, causal, window_left, window_right, softcap):  # fmt: skip
    _C.forward(
        q, k, v, out, lse,
        softmax_scale=softmax_scale, causal=causal, window_size=(window_left, window_right),
        softcap=softcap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, dropout_p=dropout_p,
        dropout_state=rng_state if dropout_p > 0.0 else None,
    )  # fmt: skip


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    rng_state: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor]:
    out, lse = torch.empty_like(q), _empty_lse(q, cu_seqlens_q is not None)
    _write_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, max_seqlen_q, max_seqlen_k, dropout_p,
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
    rng_state: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
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
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, dropout_p=dropout_p,
        dropout_state=rng_state if dropout_p > 0.0 else None,
    )  # fmt: skip
    return dq, dk, dv


def _backward_fake(dout, q, k, v, *rest) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# ---- autograd: one rule, used by the custom op and by the eager Function -----------------------

_NON_TENSOR_INPUTS = 12  # forward inputs after q, k, v: none of them has a gradient


def _save_for_backward(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, rng_state, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state)
    ctx.options = options


def _gradients(ctx, dout: Tensor, backward) -> tuple:
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state = ctx.saved_tensors
    dout = _last_dim_contiguous(dout, "dout")
    dq, dk, dv = backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, *ctx.options)
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


def _draw_rng_state(q: Tensor) -> Tensor:
    """(seed, offset) for one call's dropout, int64, on q's device, from torch's generator there."""
    return torch.randint(0, 2**62, (2,), dtype=torch.int64, device=q.device)


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
               softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
               return_lse, block_table=None) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:  # fmt: skip
    """(out, lse, rng_state); lse is None where neither the caller nor autograd needs it, rng_state
    None without dropout."""
    if isinstance(dropout_p, Tensor):
        dropout_p = dropout_p.item()
    if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool):
        raise TypeError(f"flashattn: dropout_p: expected a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flashattn: dropout_p: expected a probability in [0, 1), got {dropout_p}")
    dropout_p = float(dropout_p)
    if alibi_slopes is not None:
        raise NotImplementedError("flashattn: alibi_slopes: expected None (ALiBi is not implemented), got a tensor")
    if block_table is not None:
        raise NotImplementedError("flashattn: block_table: expected None (paged KV is not implemented), got a tensor")
    window_left, window_right = window_size
    rng_state = _draw_rng_state(q) if dropout_p > 0.0 and isinstance(q, Tensor) else None
    inputs = (
        _last_dim_contiguous(q, "q"), _last_dim_contiguous(k, "k"), _last_dim_contiguous(v, "v"),
        cu_seqlens_q, cu_seqlens_k, rng_state, int(max_seqlen_q), int(max_seqlen_k), dropout_p,
        None if softmax_scale is None else float(softmax_scale), bool(causal),
        int(window_left), int(window_right), float(softcap), bool(deterministic),
    )  # fmt: skip
    if torch.compiler.is_compiling():
        return (*_forward_op(*inputs), rng_state)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return (*_EagerAttention.apply(*inputs), rng_state)
    if return_lse:
        return (*_forward(*inputs), rng_state)
    return _forward_without_lse(*inputs), None, rng_state


def _attn_probs(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                window_size, softcap, rng_state) -> Optional[Tensor]:  # fmt: skip
    """return_attn_probs' third value: None without dropout, else flash-attn's S_dmask."""
    if rng_state is None:
        return None
    with torch.no_grad():
        return _dropout.attn_probs(q.detach(), k.detach(), cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                   int(max_seqlen_k), float(dropout_p.item() if isinstance(dropout_p, Tensor) else dropout_p),
                                   softmax_scale, causal, window_size, softcap, rng_state)  # fmt: skip


# ---- flash-attn's functions -------------------------------------------------------------------


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):  # fmt: skip
    """Attention over (batch, seqlen, nheads, headdim) tensors.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim).
    softmax_scale: default 1 / sqrt(headdim). causal: bottom-right aligned when seqlen_q !=
    seqlen_k. window_size: (left, right) sliding window, -1 unbounded. softcap: 0 = off.
    deterministic: the backward gives the same bits on every run. dropout_p: probability of
    dropping each attention probability (kept ones scaled by 1 / (1 - dropout_p)), drawn from
    torch's generator of q's device.
    Returns out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse, S_dmask) with
    return_attn_probs=True; softmax_lse is float32 (batch, nheads, seqlen_q); S_dmask is None
    without dropout, else the probabilities with dropped entries negated (module docstring).
    """
    out, lse, rng_state = _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size,
                                     softcap, alibi_slopes, deterministic, return_attn_probs)  # fmt: skip
    if not return_attn_probs:
        return out
    return out, lse, _attn_probs(q, k, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap,
                                 rng_state)  # fmt: skip


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):  # fmt: skip
    """Attention over sequences of different lengths, packed along the first dimension.

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim). cu_seqlens_q/k: int32
    (batch + 1,) offsets of each sequence, on q's device; max_seqlen_q/k: the longest sequence.
    Returns out (total_q, nheads, headdim), or (out, softmax_lse, S_dmask) with
    return_attn_probs=True; softmax_lse is float32 (nheads, total_q); S_dmask (dropout only) is
    (batch, nheads, max_seqlen_q rounded up to 128, max_seqlen_k rounded up to 128). Other
    arguments as flash_attn_func.
    """
    out, lse, rng_state = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                     softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                     return_attn_probs, block_table)  # fmt: skip
    if not return_attn_probs:
        return out
    return out, lse, _attn_probs(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                 softmax_scale, causal, window_size, softcap, rng_state)  # fmt: skip


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
