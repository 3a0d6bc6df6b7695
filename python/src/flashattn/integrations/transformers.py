"""Hugging Face transformers on flashattn's attention.

Importing this module registers flashattn with transformers' AttentionInterface (and the matching
mask function with its AttentionMaskInterface) under the name ``"fattn"``; a model then switches
to it like to any built-in implementation::

    import flashattn.integrations.transformers   # registers "fattn"
    model.set_attn_implementation("fattn")       # or from_pretrained(..., attn_implementation="fattn")

The name has no "flash" in it because transformers reserves such names for its own flash-attn
path (``"flash" in name`` selects that path's checks and imports).

What the attention function handles:

- transformers' (batch, heads, seqlen, head_dim) tensors, read as flashattn's (batch, seqlen,
  heads, head_dim) through a transpose view (no copy: flashattn takes any strides whose last
  dimension is contiguous, which is also what a KV cache holds).
- GQA / MQA (fewer key/value heads than query heads) natively, without repeating K and V.
- causal attention (``module.is_causal``, or an ``is_causal`` argument), bottom-right aligned when
  there are more keys than queries: the KV-cache decode and chunked-prefill steps.
- padding masks: the mask function hands the attention the 2D (batch, keys) padding mask, or
  None where nothing is padded; padded batches are unpadded to flashattn's variable-length
  function (only the valid keys are read). Self-attention that is causal or has a sliding window
  also unpads the queries (the last seqlen_q columns of the mask) and leaves zeros at padded
  query rows; other non-causal attention (encoders without a window, cross-attention, whose key
  mask says nothing about the queries) computes every query row. Padding on the left
  (generation) or the right (training) is what this covers; a static cache's unused slots past
  the mask are skipped.
- padding-free batches: ``cu_seq_lens_q/k`` and ``max_length_q/k`` (transformers'
  DataCollatorWithFlattening), or batch-1 ``position_ids`` that restart (packed sequences).
- ``sliding_window`` (a window of that many keys, the query's included: flashattn's window
  (sliding_window - 1, 0) when causal, symmetric (sliding_window - 1) on both sides otherwise, as
  transformers' flash-attn path reads it) and ``softcap`` (tanh soft-capping of the scores).
- ``scaling``; value head dims different from the query's (zero-padded to one head dim).

What it does not handle, and raises NotImplementedError for: attention dropout > 0 (use
``model.eval()`` or ``config.attention_dropout = 0``), attention sinks (``s_aux``), additive
position biases, and 4D attention masks (custom patterns other than causal, sliding window and
padding). Attention weights are never formed: the function returns ``(attn_output, None)``.
Mask patterns that transformers composes into the mask function (chunked attention, block masks
of vision tokens) are not seen here; such models are not supported.

Tensors on the CPU run flashattn's CPU backend; CUDA tensors the CUDA kernels (bf16 / f16, the
head dims the package was built with). Tested with transformers 5.23.
"""
from typing import Optional

import torch
from torch import Tensor

from ..torch import flash_attn_func, flash_attn_varlen_func

try:
    from transformers import AttentionInterface, AttentionMaskInterface
except ImportError as e:  # transformers missing, or older than its AttentionMaskInterface
    raise ImportError(
        "flashattn.integrations.transformers: needs transformers with AttentionInterface and "
        "AttentionMaskInterface (tested with transformers 5.23): pip install transformers"
    ) from e

__all__ = ["NAME", "attention_forward", "padding_mask", "register"]

NAME = "fattn"
"""The name this module registers on import: ``model.set_attn_implementation(NAME)``."""


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function=None, attention_mask: Optional[Tensor] = None, **kwargs) -> Optional[Tensor]:  # fmt: skip
    """transformers' mask function for flashattn: the bool (batch, keys) padding mask, or None.

    Causality and sliding windows are options of the attention call, not mask entries, so only
    the padding is kept: the last kv_length columns of the 2D mask (a sliding-window cache keeps
    the last keys), and None when none of them is padded. A mask shorter than kv_length is kept
    too: with a static cache, the keys past it are unused slots. Without a 2D mask, a static
    cache's unused slots still have to be left out of causal attention: then the mask covers the
    filled slots only. Bidirectional masks (transformers passes them the extra argument
    allow_is_bidirectional_skip) are left alone: they come from encoders and cross-attention,
    where more keys than queries is no sign of unused slots.
    """
    if attention_mask is None:
        if "allow_is_bidirectional_skip" in kwargs:
            return None
        filled = int(q_offset or 0) - int(kv_offset or 0) + int(q_length)  # keys the cache holds after this step
        if 0 < filled < int(kv_length):
            return torch.ones(batch_size, filled, dtype=torch.bool, device=kwargs.get("device"))
        return None
    if attention_mask.dim() != 2:
        return attention_mask  # a 4D mask is the caller's own pattern: the attention rejects it
    mask = attention_mask[:, -kv_length:]
    if mask.shape[-1] == kv_length and bool(mask.all()):
        return None
    return mask.bool()


def _offsets(lengths: Tensor) -> Tensor:
    """int32 (batch + 1,) cumulative offsets of per-sequence lengths."""
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def _window(sliding_window, causal: bool) -> tuple[int, int]:
    if sliding_window is None or int(sliding_window) <= 0:
        return (-1, -1)
    left = int(sliding_window) - 1  # a window of `sliding_window` keys, the query's own included
    return (left, 0 if causal else left)


def _padded(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, causal: bool, options: dict) -> Tensor:
    """Attention of (batch, seqlen, heads, dim) tensors under a (batch, keys) padding mask, through
    the variable-length function on the valid keys and, for self-attention, the valid queries."""
    if mask.dtype != torch.bool:
        mask = mask != 0
    batch, seqlen_q, heads, _ = q.shape
    if mask.shape[-1] < k.shape[1]:  # a static cache: the slots past the mask hold no keys yet
        k, v = k[:, : mask.shape[-1]], v[:, : mask.shape[-1]]
    elif mask.shape[-1] > k.shape[1]:
        mask = mask[:, -k.shape[1]:]
    key_lengths = mask.sum(-1, dtype=torch.int32)
    key_rows = mask.nonzero(as_tuple=True)  # (batch index, position) of each valid key, in order
    k_packed, v_packed = k[key_rows], v[key_rows]
    if not causal and options["window_size"] == (-1, -1):
        # Every query row attends to its batch item's valid keys, padded query rows too: a
        # cross-attention's key mask says nothing about which queries are padding.
        out = flash_attn_varlen_func(
            q.reshape(batch * seqlen_q, heads, q.shape[-1]), k_packed, v_packed,
            torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32, device=q.device),
            _offsets(key_lengths), seqlen_q, int(key_lengths.max()), causal=False, **options,
        )  # fmt: skip
        return out.view(batch, seqlen_q, heads, -1)
    # Self-attention (causal, or with a window, which only self-attention has): the queries are
    # the last seqlen_q positions of the keys; only the valid ones are computed, so that each
    # sequence's queries and keys line up (the window and causal diagonal are bottom-right
    # aligned per sequence). Padded query rows are left zero.
    query_mask = mask[:, -seqlen_q:]
    query_lengths = query_mask.sum(-1, dtype=torch.int32)
    query_rows = query_mask.nonzero(as_tuple=True)
    out = flash_attn_varlen_func(
        q[query_rows], k_packed, v_packed, _offsets(query_lengths), _offsets(key_lengths),
        int(query_lengths.max()), int(key_lengths.max()), causal=causal, **options,
    )  # fmt: skip
    return out.new_zeros(batch, seqlen_q, heads, out.shape[-1]).index_put(query_rows, out)


def _packed(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int, max_k: int, causal: bool,
            options: dict) -> Tensor:  # fmt: skip
    """Sequences packed along (batch x seqlen) with their offsets: the variable-length function."""
    batch, seqlen_q = q.shape[:2]
    out = flash_attn_varlen_func(
        q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]),
        cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k), causal=causal, **options,
    )  # fmt: skip
    return out.view(batch, seqlen_q, *out.shape[1:])


def _restarts(position_ids: Optional[Tensor], q: Tensor, k: Tensor) -> Optional[Tensor]:
    """Offsets of the sequences packed into one batch row, where position_ids restart (a position
    that does not follow the previous one by 1 starts a sequence); None if there is one sequence."""
    if position_ids is None or q.shape[0] != 1 or q.shape[1] != k.shape[1] or q.shape[1] < 2:
        return None
    positions = position_ids.reshape(-1)
    if positions.numel() != q.shape[1]:
        return None
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = positions[1:] != positions[:-1] + 1
    if not bool(starts[1:].any()):
        return None
    total = torch.tensor([positions.numel()], dtype=torch.int32, device=positions.device)
    return torch.cat([starts.nonzero().reshape(-1).to(torch.int32), total])


def attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers' attention function on flashattn.

    query (batch, heads, seqlen_q, head_dim); key, value (batch, heads_kv, seqlen_k, head_dim);
    attention_mask: what :func:`padding_mask` made (a bool (batch, keys) mask, or None).
    Returns (attn_output (batch, seqlen_q, heads, head_dim_v), None).
    """
    if dropout and dropout > 0.0:
        raise NotImplementedError(
            f"flashattn: attention dropout {dropout} is not implemented; use model.eval() for inference, or "
            "set config.attention_dropout = 0.0 to train"
        )
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("flashattn: attention sinks (s_aux) are not implemented")
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("flashattn: additive position biases (position_bias) are not implemented")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise NotImplementedError(
            f"flashattn: a {attention_mask.dim()}D attention mask is not supported (only causal, sliding-window and "
            "2D padding masks, which transformers passes as a 2D mask to implementations registered with "
            "flashattn.integrations.transformers.register)"
        )
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    # flashattn's layout: (batch, seqlen, heads, head_dim), as views.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    if scaling is None:
        scaling = head_dim**-0.5
    if head_dim_v != head_dim:  # one head dim for q, k and v: pad with zeros, which change no score
        width = max(head_dim, head_dim_v)
        q, k, v = (torch.nn.functional.pad(x, (0, width - x.shape[-1])) for x in (q, k, v))
    options = {"softmax_scale": float(scaling), "window_size": _window(sliding_window, causal),
               "softcap": float(softcap or 0.0)}  # fmt: skip

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if attention_mask is not None:
        out = _padded(q, k, v, attention_mask, causal, options)
    elif all(x is not None for x in (cu_q, cu_k, max_q, max_k)):
        out = _packed(q, k, v, cu_q, cu_k, max_q, max_k, causal, options)
    elif (offsets := _restarts(kwargs.get("position_ids"), q, k)) is not None:
        longest = int((offsets[1:] - offsets[:-1]).max())
        out = _packed(q, k, v, offsets, offsets, longest, longest, causal, options)
    else:
        out = flash_attn_func(q, k, v, causal=causal, **options)
    if out.shape[-1] != head_dim_v:
        out = out[..., :head_dim_v]
    return out, None


def register(name: str = NAME) -> str:
    """Registers :func:`attention_forward` and :func:`padding_mask` with transformers under
    `name` (done on import for ``"fattn"``); returns the name."""
    if "flash" in name:
        raise ValueError(f"flashattn: name: transformers reserves names containing 'flash' for its flash-attn path, got '{name}'")
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, padding_mask)
    return name


register()
