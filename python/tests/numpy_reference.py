"""Attention in float64 NumPy, written independently of the library: the tests' ground truth."""
import numpy as np


def visible(seqlen_q, seqlen_k, causal=False, window_size=(-1, -1)):
    """(seqlen_q, seqlen_k) boolean mask, bottom-right aligned as flash-attn >= 2.1."""
    left, right = window_size
    if causal:
        right = 0
    i = np.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    j = np.arange(seqlen_k)[None, :]
    mask = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        mask &= j >= i - left
    if right >= 0:
        mask &= j <= i + right
    return mask


def alibi_bias(slopes, b, h, seqlen_q, seqlen_k):
    """ALiBi as flash-attn defines it: -slope * |i + seqlen_k - seqlen_q - j| (slopes (hq,) or (b, hq))."""
    slopes = np.asarray(slopes, dtype=np.float64)
    slope = slopes[h] if slopes.ndim == 1 else slopes[b, h]
    i = np.arange(seqlen_q)[:, None] + (seqlen_k - seqlen_q)
    j = np.arange(seqlen_k)[None, :]
    return -slope * np.abs(i - j)


def attention(q, k, v, dout=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
              alibi_slopes=None):
    """Fixed length: q (b, sq, hq, d), k and v (b, sk, hk, d), any float dtype (computed in float64).
    alibi_slopes: None, (hq,) or (b, hq): the ALiBi bias is added after softcap.

    Returns (out, lse) and, with dout, (out, lse, dq, dk, dv). A row that sees no key has out 0
    and lse -inf.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d**-0.5 if softmax_scale is None else softmax_scale
    mask = visible(sq, sk, causal, window_size)
    seen = mask.any(axis=1)
    out = np.zeros_like(q)
    lse = np.full((b, hq, sq), -np.inf)
    grads = None
    if dout is not None:
        dout = np.asarray(dout, dtype=np.float64)
        grads = (np.zeros_like(q), np.zeros_like(k), np.zeros_like(v))
    for bi in range(b):
        for h in range(hq):
            hk_ = h // (hq // hk)
            qh, kh, vh = q[bi, :, h], k[bi, :, hk_], v[bi, :, hk_]
            raw = scale * (qh @ kh.T)
            t = np.tanh(raw / softcap) if softcap > 0 else None
            x = softcap * t if softcap > 0 else raw
            if alibi_slopes is not None:
                x = x + alibi_bias(alibi_slopes, bi, h, sq, sk)
            s = np.where(mask, x, -np.inf)
            m = np.where(seen, s.max(axis=1, initial=-np.inf), 0.0)
            e = np.where(mask, np.exp(s - m[:, None]), 0.0)
            total = e.sum(axis=1)
            p = np.where(seen[:, None], e / np.where(seen, total, 1.0)[:, None], 0.0)
            out[bi, :, h] = p @ vh
            lse[bi, h] = np.where(seen, m + np.log(np.where(seen, total, 1.0)), -np.inf)
            if grads is not None:
                dq, dk, dv = grads
                do = dout[bi, :, h]
                dp = do @ vh.T
                ds = p * (dp - (do * out[bi, :, h]).sum(axis=1, keepdims=True))
                if softcap > 0:
                    ds = ds * (1 - t * t)
                ds *= scale
                dq[bi, :, h] = ds @ kh
                dk[bi, :, hk_] += ds.T @ qh
                dv[bi, :, hk_] += p.T @ do
    if grads is None:
        return out, lse
    return (out, lse) + grads


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, dout=None, alibi_slopes=None, **options):
    """Packed: q (total_q, hq, d), k and v (total_k, hk, d); lse (hq, total_q). Runs each sequence
    (ALiBi with each sequence's own lengths; slopes (hq,) or (batch, hq))."""
    out = np.zeros(q.shape)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(len(cu_seqlens_q) - 1):
        rq = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1])
        rk = slice(cu_seqlens_k[b], cu_seqlens_k[b + 1])
        args = (q[None, rq], k[None, rk], v[None, rk])
        if alibi_slopes is not None:
            slopes = np.asarray(alibi_slopes)
            options["alibi_slopes"] = slopes if slopes.ndim == 1 else slopes[b : b + 1]
        results = attention(*args, dout=None if dout is None else dout[None, rq], **options)
        out[rq], lse[:, rq] = results[0][0], results[1][0]
        if dout is not None:
            dq[rq], dk[rk], dv[rk] = results[2][0], results[3][0], results[4][0]
    return (out, lse) if dout is None else (out, lse, dq, dk, dv)


def rel_err(x, ref):
    """||x - ref|| / ||ref|| in float64 (0 when both are zero)."""
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    norm = np.linalg.norm(ref)
    diff = np.linalg.norm(x - ref)
    return diff / norm if norm > 0 else diff
