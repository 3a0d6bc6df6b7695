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

flash_attn_with_kvcache serves models: attention over a KV cache, contiguous or paged
(block_table, pages of any multiple of 16 tokens from 16 to 512), with the new tokens' keys and
values appended in place and rotary embeddings applied in the same call, ALiBi included (seqlen_k
there is the sequence's cache length after the append).
flash_attn_varlen_func(..., block_table=...) attends packed queries to a paged cache
(inference only: no gradient flows to the pages, no dropout).

Window and causal arguments follow flash-attn's rules: a window size that is negative or
>= seqlen_k (max_seqlen_k packed) is unbounded, causal=True sets the right size to 0 whatever is
given, and the sizes may be ints or 0-d tensors. alibi_slopes: float32 (nheads,) or (batch,
nheads), on q's device; the score of query i and key j gains -slope * |i + seqlen_k - seqlen_q - j|
(after softcap), with each sequence's own lengths when packed; no gradient flows to the slopes.
flash-attn's causal kernels add slope * j instead (the same up to a constant per row): outputs and
gradients agree, softmax_lse differs by slope * (i + seqlen_k - seqlen_q).

FP8: flash_attn_func and flash_attn_varlen_func take torch.float8_e4m3fn q, k, v on a Hopper GPU
(inference: no gradient, dropout, ALiBi or pages) with flash-attn 3's descale factors q_descale,
k_descale, v_descale (float32 (batch, nheads_k), or (1,) for one per tensor; None = 1: each stored
value times its factor is the value it stands for) and return a bfloat16 output, as flash-attn 3.
q_descale and k_descale may also be (batch, nheads_k, ceil(seqlen / 128)), one factor per block of
128 rows of each sequence (block quantization: flashattn.fp8.quantize_e4m3(per_block=True)).

Dropout together with softcap raises NotImplementedError on CUDA tensors (as flash-attn). As in
flash-attn, no gradient flows through softmax_lse.

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

from . import _C, _dropout

__all__ = [
    "KvCacheBoundsError",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
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


def _write_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, alibi_slopes, max_seqlen_q, max_seqlen_k,
                   dropout_p,
                   softmax_scale, causal, window_left, window_right, softcap):  # fmt: skip
    _C.forward(
        q, k, v, out, lse,
        softmax_scale=softmax_scale, causal=causal, window_size=(window_left, window_right),
        softcap=softcap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, dropout_p=dropout_p,
        dropout_state=rng_state if dropout_p > 0.0 else None, alibi_slopes=alibi_slopes,
    )  # fmt: skip


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    rng_state: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
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
    _write_forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, alibi_slopes, max_seqlen_q, max_seqlen_k,
                   dropout_p,
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
    alibi_slopes: Optional[Tensor],
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
        dropout_state=rng_state if dropout_p > 0.0 else None, alibi_slopes=alibi_slopes,
    )  # fmt: skip
    return dq, dk, dv


def _backward_fake(dout, q, k, v, *rest) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# ---- autograd: one rule, used by the custom op and by the eager Function -----------------------

_NON_TENSOR_INPUTS = 13  # forward inputs after q, k, v: none of them has a gradient (nor the slopes)


def _save_for_backward(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, rng_state, alibi_slopes, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, alibi_slopes)
    ctx.options = options


def _gradients(ctx, dout: Tensor, backward) -> tuple:
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, alibi_slopes = ctx.saved_tensors
    dout = _last_dim_contiguous(dout, "dout")
    dq, dk, dv = backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, alibi_slopes, *ctx.options)
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


# ---- FP8 (e4m3) inputs: the Hopper forward, inference only -------------------------------------


def _forward_fp8(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    q_descale: Optional[Tensor],
    k_descale: Optional[Tensor],
    v_descale: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
) -> tuple[Tensor, Tensor]:
    """e4m3 q, k, v -> a bfloat16 output (flash-attn 3's for FP8) and the float32 LSE."""
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = _empty_lse(q, cu_seqlens_q is not None)
    _C.forward(
        q, k, v, out, lse,
        softmax_scale=softmax_scale, causal=causal, window_size=(window_left, window_right), softcap=softcap,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )  # fmt: skip
    return out, lse


def _forward_fp8_fake(q, k, v, cu_seqlens_q, *options) -> tuple[Tensor, Tensor]:
    return q.new_empty(q.shape, dtype=torch.bfloat16), _empty_lse(q, cu_seqlens_q is not None)


_forward_fp8_op = torch.library.custom_op("flashattn::forward_fp8", _forward_fp8, mutates_args=())
_forward_fp8_op.register_fake(_forward_fp8_fake)


def _attention_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                   causal, window_size, softcap, alibi_slopes, descales) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(out, lse) of e4m3 inputs."""
    if dropout_p != 0.0:
        raise NotImplementedError(f"flashattn: dropout_p: expected 0.0 with float8_e4m3fn inputs (the FP8 forward has no dropout), got {dropout_p}")
    if alibi_slopes is not None:
        raise NotImplementedError("flashattn: alibi_slopes: expected None with float8_e4m3fn inputs (the FP8 forward has no ALiBi)")
    if torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in (q, k, v)):
        raise NotImplementedError("flashattn: q, k, v: float8_e4m3fn inputs have no backward (the FP8 forward is for inference)")
    window_left, window_right = _window(window_size)
    inputs = (
        _last_dim_contiguous(q, "q"), _last_dim_contiguous(k, "k"), _last_dim_contiguous(v, "v"),
        cu_seqlens_q, cu_seqlens_k, *descales, int(max_seqlen_q), int(max_seqlen_k),
        None if softmax_scale is None else float(softmax_scale), bool(causal), int(window_left), int(window_right),
        float(softcap),
    )  # fmt: skip
    if torch.compiler.is_compiling():
        return _forward_fp8_op(*inputs)
    return _forward_fp8(*inputs)


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
               softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
               return_lse, block_table=None, seqused_k=None,
               descales=(None, None, None)) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:  # fmt: skip
    """(out, lse, rng_state); lse is None where neither the caller nor autograd needs it, rng_state
    None without dropout."""
    if isinstance(dropout_p, Tensor):
        dropout_p = dropout_p.item()
    if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool):
        raise TypeError(f"flashattn: dropout_p: expected a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flashattn: dropout_p: expected a probability in [0, 1), got {dropout_p}")
    dropout_p = float(dropout_p)
    fp8 = isinstance(q, Tensor) and q.dtype == torch.float8_e4m3fn
    if not fp8 and any(d is not None for d in descales):
        raise ValueError(f"flashattn: q_descale, k_descale, v_descale: expected None (descale factors go with float8_e4m3fn inputs), got them with {getattr(q, 'dtype', type(q).__name__)} inputs")
    if fp8 and block_table is None and seqused_k is None:
        out, lse = _attention_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, descales)  # fmt: skip
        return out, lse, None
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, Tensor):
            raise TypeError(f"flashattn: alibi_slopes: expected a torch.Tensor or None, got {type(alibi_slopes).__name__}")
        alibi_slopes = _last_dim_contiguous(alibi_slopes, "alibi_slopes")
    window_left, window_right = _window(window_size)
    if block_table is not None or seqused_k is not None:
        if dropout_p > 0.0:
            raise NotImplementedError(f"flashattn: dropout_p: expected 0.0 with block_table/seqused_k (paged calls are inference only), got {dropout_p}")
        out, lse = _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                 causal, window_left, window_right, softcap, alibi_slopes, block_table, seqused_k,
                                 return_lse)  # fmt: skip
        return out, lse, None
    rng_state = _draw_rng_state(q) if dropout_p > 0.0 and isinstance(q, Tensor) else None
    inputs = (
        _last_dim_contiguous(q, "q"), _last_dim_contiguous(k, "k"), _last_dim_contiguous(v, "v"),
        cu_seqlens_q, cu_seqlens_k, rng_state, alibi_slopes, int(max_seqlen_q), int(max_seqlen_k), dropout_p,
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
                window_size, softcap, rng_state, alibi_slopes) -> Optional[Tensor]:  # fmt: skip
    """return_attn_probs' third value: None without dropout, else flash-attn's S_dmask."""
    if rng_state is None:
        return None
    with torch.no_grad():
        return _dropout.attn_probs(q.detach(), k.detach(), cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                   int(max_seqlen_k), float(dropout_p.item() if isinstance(dropout_p, Tensor) else dropout_p),
                                   softmax_scale, causal, _window(window_size), softcap, rng_state,
                                   alibi_slopes)  # fmt: skip


def _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                  window_left, window_right, softcap, alibi_slopes, block_table, seqused_k, return_lse):  # fmt: skip
    """The varlen forward over paged K/V (or with seqused_k): inference only, no autograd. ALiBi's
    seqlen_k is each sequence's keys in use (seqused_k[b], else its cu_seqlens_k length)."""
    q, k, v = _last_dim_contiguous(q, "q"), _last_dim_contiguous(k, "k"), _last_dim_contiguous(v, "v")
    if block_table is not None and cu_seqlens_k is not None and k.dim() == 4:
        lengths = seqused_k if seqused_k is not None else cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        _check_pages_fit(lengths, 0, block_table, k.shape[1])
    if causal:
        window_right = 0
    out = torch.empty_like(q)
    lse = _empty_lse(q, True) if return_lse else None
    _C.forward(
        q, k, v, out, lse,
        softmax_scale=None if softmax_scale is None else float(softmax_scale), causal=bool(causal),
        window_size=(int(window_left), int(window_right)), softcap=float(softcap),
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=int(max_seqlen_q),
        max_seqlen_k=int(max_seqlen_k), block_table=block_table, seqused_k=seqused_k, alibi_slopes=alibi_slopes,
    )  # fmt: skip
    return out, lse


class KvCacheBoundsError(ValueError, RuntimeError):
    """A paged cache's block_table has too few pages for a sequence (flash-attn raises RuntimeError
    there; this is both a ValueError, as flashattn's argument errors are, and a RuntimeError)."""


def _check_pages_fit(lengths, appended: int, block_table: Tensor, page_size: int) -> None:
    """Raises KvCacheBoundsError when a sequence needs more rows than its row of block_table
    holds (flash-attn's check). lengths: an int (every sequence's, checked on the host) or a
    tensor. On CUDA tensors this reads one number back (a synchronization), as flash-attn does on
    its paged path; skipped while a CUDA graph is captured or compiled."""
    if not isinstance(block_table, Tensor) or block_table.dim() != 2:
        return  # the library reports malformed arguments
    if isinstance(lengths, int):
        longest = lengths + appended
    else:
        if not isinstance(lengths, Tensor) or lengths.numel() == 0 or torch.compiler.is_compiling():
            return
        if lengths.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        longest = int(lengths.max().item()) + appended
    capacity = block_table.shape[1] * int(page_size)
    if longest > capacity:
        raise KvCacheBoundsError(
            f"flashattn: cache_seqlens: expected every sequence (with {appended} appended rows) to fit the pages "
            f"of block_table (max_blocks {block_table.shape[1]} * page_size {page_size} = {capacity} rows), "
            f"got a sequence of {longest} rows"
        )


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):  # fmt: skip
    """Attention over a KV cache, appending new keys/values and applying rotary in one call.

    q: (batch, seqlen_q, nheads, headdim): 1 query per sequence (decoding) or more (speculative
    decoding, chunked prefill). k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim),
    or paged (num_blocks, page_block_size, nheads_k, headdim) with block_table (batch,
    max_num_blocks_per_seq) int32; page_block_size a multiple of 16 from 16 to 512.
    k, v (batch, seqlen_new, nheads_k, headdim), optional: written into the caches in place at
    rows cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1, before the attention.
    rotary_cos, rotary_sin (seqlen_ro, rotary_dim / 2), optional (requires k): the new keys are
    rotated at their rows; q at cache_seqlens[b] + i if causal or local, at cache_seqlens[b]
    otherwise. rotary_interleaved: pairs (2j, 2j+1) (GPT-J) rather than (j, j + rotary_dim/2)
    (GPT-NeoX). cache_seqlens: int or (batch,) int32, the rows in each cache before the call
    (None: the whole cache). cache_batch_idx (batch,) int32: the cache batch of each sequence
    (contiguous caches). cache_leftpad (batch,) int32: the first cache row of each sequence.
    The queries attend to rows [cache_leftpad[b], cache_seqlens[b] + seqlen_new), causal and
    window masks aligned to the bottom-right (causal sets window_size[1] to 0, as flash-attn).
    num_splits: split-KV count on the GPU (0 = flashattn's heuristic). alibi_slopes: float32
    (nheads,) or (batch, nheads) (indexed by the sequence, not its cache_batch_idx), on q's device:
    the score of query i and cache row j gains -slope * |i + seqlen_k - seqlen_q - j| with seqlen_k
    = cache_seqlens[b] + seqlen_new, the cache's rows after the append (cache_leftpad changes which
    rows are seen, not the distance), as flash-attn. Returns out (batch, seqlen_q, nheads, headdim),
    or (out, softmax_lse) with return_softmax_lse=True; softmax_lse float32 (batch, nheads,
    seqlen_q). No gradient flows through this function.
    """
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, Tensor):
            raise TypeError(f"flashattn: alibi_slopes: expected a torch.Tensor or None, got {type(alibi_slopes).__name__}")
        alibi_slopes = _last_dim_contiguous(alibi_slopes, "alibi_slopes")
    if (k is None) != (v is None):
        raise ValueError(f"flashattn: {'v' if k is not None else 'k'}: expected k and v both given or both None, got one")
    q = _last_dim_contiguous(q, "q")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        # Never copied: the append writes into the caller's cache.
        if _last_dim_contiguous(cache, name) is not cache:
            raise ValueError(f"flashattn: {name}.stride[-1]: expected 1 (the cache is written in place), "
                             f"got {cache.stride(-1)}")
    if k is not None:
        k, v = _last_dim_contiguous(k, "k"), _last_dim_contiguous(v, "v")
    window_left, window_right = (int(w) for w in window_size)
    if causal:
        window_right = 0
    if block_table is not None and cache_seqlens is not None and k_cache.dim() == 4:
        # An int is checked on the host; a tensor costs a device-to-host read (see the function).
        _check_pages_fit(cache_seqlens, 0 if k is None else k.shape[1], block_table, k_cache.shape[1])
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    out = torch.empty_like(q)
    lse = _empty_lse(q, False) if return_softmax_lse else None
    with torch.no_grad():
        _C.forward_kvcache(
            q, k_cache, v_cache, out, lse,
            k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_seqlens=cache_seqlens,
            cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, block_table=block_table,
            rotary_interleaved=bool(rotary_interleaved),
            softmax_scale=None if softmax_scale is None else float(softmax_scale), causal=bool(causal),
            window_size=(window_left, window_right), softcap=float(softcap), alibi_slopes=alibi_slopes,
            num_splits=int(num_splits),
        )  # fmt: skip
    return (out, lse) if return_softmax_lse else out


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size_left=-1, window_size_right=-1,
                               softcap=0.0, alibi_slopes=None, return_softmax=False, block_table=None,
                               leftpad_k=None, seqused_k=None, zero_tensors=False, num_splits=0):  # fmt: skip
    """flash-attn's internal varlen forward (flash_attn.flash_attn_interface), which its tests
    call directly: returns (out, softmax_lse, None, None). num_splits: 0 or 1 (the varlen forward
    chooses its own splits; flash-attn also rejects more than 1 there); leftpad_k is not
    implemented; no gradient flows."""
    if num_splits > 1:
        raise NotImplementedError(
            f"flashattn: num_splits: expected 0 or 1 (num_splits > 1 is not supported by the varlen forward), got {num_splits}"
        )
    if leftpad_k is not None:
        raise NotImplementedError("flashattn: leftpad_k: expected None (use flash_attn_with_kvcache's cache_leftpad)")
    with torch.no_grad():
        out, lse, _ = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                 softmax_scale, causal, (window_size_left, window_size_right), softcap, alibi_slopes,
                                 False, True, block_table, seqused_k)  # fmt: skip
    return out, lse, None, None


# ---- flash-attn's functions -------------------------------------------------------------------


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                    q_descale=None, k_descale=None, v_descale=None):  # fmt: skip
    """Attention over (batch, seqlen, nheads, headdim) tensors.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim).
    softmax_scale: default 1 / sqrt(headdim). causal: bottom-right aligned when seqlen_q !=
    seqlen_k. window_size: (left, right) sliding window (ints or 0-d tensors), negative or >=
    seqlen_k unbounded; causal sets right to 0. softcap: 0 = off. alibi_slopes: float32 (nheads,)
    or (batch, nheads): adds -slope * |i + seqlen_k - seqlen_q - j| to the score of query i, key j.
    deterministic: the backward gives the same bits on every run. dropout_p: probability of
    dropping each attention probability (kept ones scaled by 1 / (1 - dropout_p)), drawn from
    torch's generator of q's device.
    Returns out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse, S_dmask) with
    return_attn_probs=True; softmax_lse is float32 (batch, nheads, seqlen_q); S_dmask is None
    without dropout, else the probabilities with dropped entries negated (module docstring).
    q, k, v float8_e4m3fn (Hopper, inference): q_descale, k_descale, v_descale float32 (batch,
    nheads_k) or (1,), None = 1 (q_descale, k_descale also per block of 128 rows); out is bfloat16
    (module docstring).
    """
    out, lse, rng_state = _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size,
                                     softcap, alibi_slopes, deterministic, return_attn_probs,
                                     descales=(q_descale, k_descale, v_descale))  # fmt: skip
    if not return_attn_probs:
        return out
    return out, lse, _attn_probs(q, k, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap,
                                 rng_state, alibi_slopes)  # fmt: skip


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, seqused_k=None,
                           q_descale=None, k_descale=None, v_descale=None):  # fmt: skip
    """Attention over sequences of different lengths, packed along the first dimension.

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim). cu_seqlens_q/k: int32
    (batch + 1,) offsets of each sequence, on q's device; max_seqlen_q/k: the longest sequence.
    block_table (batch, max_blocks) int32: k and v are a paged cache (num_blocks, page_size,
    nheads_k, headdim), sequence b's keys its first cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows
    (or seqused_k[b]); inference only. seqused_k (batch,) int32: sequence b uses only its first
    seqused_k[b] keys.
    Returns out (total_q, nheads, headdim), or (out, softmax_lse, S_dmask) with
    return_attn_probs=True; softmax_lse is float32 (nheads, total_q); S_dmask (dropout only) is
    (batch, nheads, max_seqlen_q rounded up to 128, max_seqlen_k rounded up to 128). Other
    arguments as flash_attn_func (the descale factors too: (batch, nheads_k) per sequence, blocks
    counted from each sequence's start and up to ceil(max_seqlen / 128)).
    """
    out, lse, rng_state = _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                     softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                     return_attn_probs, block_table, seqused_k,
                                     (q_descale, k_descale, v_descale))  # fmt: skip
    if not return_attn_probs:
        return out
    return out, lse, _attn_probs(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                 softmax_scale, causal, window_size, softcap, rng_state, alibi_slopes)  # fmt: skip


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
