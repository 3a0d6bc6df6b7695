"""Dropout's random stream in torch ops, and flash-attn's ``S_dmask`` (return_attn_probs=True).

The stream is the one of the C++ library (src/common/philox.hpp): element (b, h, i, j) of the
score matrix (sequence b, query head h, query row i and key j from the sequence's start) lies in
16 x 32 block (i // 16, j // 32) and belongs to lane (i % 8) * 4 + (j % 8) // 2 of it; the lane's
Philox4x32-7 call (key = seed, counter = (offset + (b * nheads + h) * 32 + lane as two 32-bit
words, i // 16, j // 32)) gives 16 bytes, byte (i % 16 // 8) * 2 + j % 2 of word j % 32 // 8 being
the element's; it is kept iff byte >= round(p * 256) (at most 255). Written again here, in
vectorized int64 arithmetic on any device, so that Python can decode the mask the kernels applied
(and tests can check the two against each other).
"""
import math
from typing import Optional

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_CALLS_AT_ONCE = 1 << 21  # Philox calls decoded at a time by attn_probs (16 int64 bytes each: 256 MB)
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85


def _mulhilo(a: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """(high, low) 32-bit words of a * m for 32-bit a (int64 tensor) and constant m, exactly."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    m_lo, m_hi = m & 0xFFFF, m >> 16
    p0, p1, p2, p3 = a_lo * m_lo, a_lo * m_hi, a_hi * m_lo, a_hi * m_hi  # each < 2^32
    middle = p1 + p2  # < 2^33
    low = (p0 + ((middle & 0xFFFF) << 16)) & _MASK32
    high = p3 + ((middle + (p0 >> 16)) >> 16)
    return high & _MASK32, low


ROUNDS = 7  # dropout's stream: Philox4x32-7


def philox4x32(seed: int, c0: Tensor, c1: Tensor, c2: Tensor, c3: Tensor, rounds: int = ROUNDS) -> tuple[Tensor, ...]:
    """Philox4x32-`rounds` of counters (c0, c1, c2, c3) (int64 tensors of 32-bit values) under `seed`."""
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


def threshold(dropout_p: float) -> int:
    """The 8-bit keep threshold of dropout_p, from its float32 value as the C++ API holds it."""
    p32 = torch.tensor(dropout_p, dtype=torch.float32).item()
    return min(255, int(math.floor(p32 * 256.0 + 0.5)))


def keep_masks(seed: int, offset: int, streams: Tensor, rows: int, cols: int, dropout_p: float) -> Tensor:
    """(len(streams), rows, cols) bool: the entries that dropout keeps in each stream
    s = batch_index * nheads + head (an int64 tensor on the device to compute on)."""
    n, device = streams.numel(), streams.device
    i16, j32 = (rows + 15) // 16, (cols + 31) // 32
    lane = torch.arange(32, dtype=torch.int64, device=device).view(1, 1, 1, 32)
    linear = offset + streams.view(n, 1, 1, 1) * 32 + lane  # < 2^63: offsets are drawn < 2^62
    shape = (n, i16, j32, 32)
    c0 = (linear & _MASK32).expand(shape)
    c1 = (linear >> 32).expand(shape)
    c2 = torch.arange(i16, dtype=torch.int64, device=device).view(1, i16, 1, 1).expand(shape)
    c3 = torch.arange(j32, dtype=torch.int64, device=device).view(1, 1, j32, 1).expand(shape)
    words = torch.stack(philox4x32(seed, c0, c1, c2, c3), dim=-1)  # (S, I16, J32, 32, word)
    shifts = torch.arange(0, 32, 8, dtype=torch.int64, device=device)
    bytes_ = (words.unsqueeze(-1) >> shifts) & 0xFF  # (S, I16, J32, 32, word, byte)
    # lane = a * 4 + t; byte = row half * 2 + column parity; element (a + 8 * row half, 8 * word + 2t + parity).
    values = bytes_.view(n, i16, j32, 8, 4, 4, 2, 2)  # (S, I16, J32, a, t, word, row half, parity)
    values = values.permute(0, 1, 6, 3, 2, 5, 4, 7).reshape(n, i16 * 16, j32 * 32)
    return (values >= threshold(dropout_p))[:, :rows, :cols]


def keep_mask(seed: int, offset: int, batch_index: int, nheads: int, head: int, rows: int, cols: int,
              dropout_p: float, device) -> Tensor:  # fmt: skip
    """(rows, cols) bool: the entries of (batch_index, head) that dropout keeps."""
    stream = torch.tensor([batch_index * nheads + head], dtype=torch.int64, device=device)
    return keep_masks(seed, offset, stream, rows, cols, dropout_p)[0]


def _flash_attn_block_n(head_dim: int) -> int:
    """The key-block width of flash-attn 2's forward kernel with dropout, whose running max the
    S_dmask it returns is relative to (its tests decode S_dmask with the same widths)."""
    if head_dim <= 32:
        return 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        return 32
    return 64


def attn_probs(q: Tensor, k: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
               max_seqlen_q: int, max_seqlen_k: int, dropout_p: float, softmax_scale: Optional[float], causal: bool,
               window_size, softcap: float, rng_state: Tensor,
               alibi_slopes: Optional[Tensor] = None) -> Tensor:  # fmt: skip
    """flash-attn's S_dmask: (batch, nheads, seqlen_q rounded to 128, seqlen_k rounded to 128),
    exp(score - running max of flash-attn's key blocks), dropped entries negated, 0 outside."""
    varlen = cu_seqlens_q is not None
    nheads, head_dim = q.shape[-2], q.shape[-1]
    group = nheads // k.shape[-2]
    scale = softmax_scale if softmax_scale is not None else head_dim**-0.5
    seed, offset = (int(x) for x in rng_state.tolist())
    if varlen:
        starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        batch = len(starts_q) - 1
        spans = [(starts_q[b], starts_q[b + 1], starts_k[b], starts_k[b + 1]) for b in range(batch)]
        rows_max, cols_max = max_seqlen_q, max_seqlen_k
    else:
        batch, rows_max, cols_max = q.shape[0], q.shape[1], k.shape[1]
        spans = [None] * batch
    rounded = lambda n: (n + 127) // 128 * 128  # noqa: E731
    out = torch.zeros(batch, nheads, rounded(rows_max), rounded(cols_max), dtype=q.dtype, device=q.device)
    left, right = window_size
    if causal:
        right = 0
    block_n = _flash_attn_block_n(head_dim)
    # Sequences in groups: one at a time under variable length; for fixed length, as many as keep
    # a group's Philox calls under _CALLS_AT_ONCE. One (sequence, head) at a time cost a few dozen
    # small kernels each, which ran flash-attn's race-condition test (250 calls of 60 sequences x
    # 4 heads) into its time limit.
    calls_per_head = ((rows_max + 15) // 16) * ((cols_max + 31) // 32) * 32
    group_size = 1 if varlen else max(1, _CALLS_AT_ONCE // (calls_per_head * nheads))
    for b0 in range(0, batch, group_size):
        b1 = min(batch, b0 + group_size)
        if varlen:
            q0, q1, k0, k1 = spans[b0]
            qb, kb = q[q0:q1].unsqueeze(0), k[k0:k1].unsqueeze(0)
        else:
            qb, kb = q[b0:b1], k[b0:b1]
        rows, cols = qb.shape[1], kb.shape[1]
        if rows == 0 or cols == 0:
            continue
        kb = kb.repeat_interleave(group, dim=2) if group > 1 else kb
        scores = torch.einsum("bihd,bjhd->bhij", qb.float(), kb.float()) * scale  # (B, h, rows, cols)
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        i = torch.arange(rows, device=q.device).view(rows, 1)
        j = torch.arange(cols, device=q.device).view(1, cols)
        diag = i + cols - rows
        if alibi_slopes is not None:  # after softcap, as the kernels add it
            slopes = alibi_slopes[b0:b1] if alibi_slopes.dim() == 2 else alibi_slopes.expand(b1 - b0, nheads)
            scores = scores - slopes.float().view(b1 - b0, nheads, 1, 1) * (diag - j).abs()
        visible = torch.ones(rows, cols, dtype=torch.bool, device=q.device)
        if 0 <= left < cols:  # flash-attn's rule: a size >= seqlen_k is unbounded
            visible &= j >= diag - left
        if 0 <= right < cols:
            visible &= j <= diag + right
        scores = scores.masked_fill(~visible, float("-inf"))
        # Running max from the last key block down to each block, as flash-attn's kernel walks.
        blocks = scores.split(block_n, dim=-1)
        block_max = torch.stack([blk.amax(dim=-1) for blk in blocks], dim=-1)
        running = torch.cummax(block_max.flip(-1), dim=-1).values.flip(-1)
        running = torch.where(torch.isinf(running), torch.zeros_like(running), running)
        probs = torch.cat([torch.exp(blk - running[..., n : n + 1]) for n, blk in enumerate(blocks)], dim=-1)
        streams = (torch.arange(b0, b1, dtype=torch.int64, device=q.device).view(-1, 1) * nheads +
                   torch.arange(nheads, dtype=torch.int64, device=q.device)).view(-1)
        per_head = ((rows + 15) // 16) * ((cols + 31) // 32) * 32
        chunk = max(1, _CALLS_AT_ONCE // per_head)
        keep = torch.cat([keep_masks(seed, offset, streams[c : c + chunk], rows, cols, dropout_p)
                          for c in range(0, streams.numel(), chunk)]).view(b1 - b0, nheads, rows, cols)
        out[b0:b1, :, :rows, :cols] = torch.where(keep, probs, -probs).to(q.dtype)
    return out
