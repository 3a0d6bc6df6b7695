"""flashattn.torch.flash_attn_with_kvcache and paged flash_attn_varlen_func against attention in
float64 built here from the logical cache: contiguous and paged caches, append + rotary in one
call, cache_batch_idx, cache_leftpad, masks, GQA, ALiBi; CPU tensors always, CUDA tensors where
there is a GPU and a CUDA build."""
import math

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn.torch import KvCacheBoundsError, flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: E402
from torch_reference import attention, rel_err  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and flashattn.built_with_cuda()
CONFIGS = [("cpu", torch.float32), ("cpu", torch.bfloat16)]
if HAS_CUDA:
    CONFIGS += [("cuda", torch.bfloat16), ("cuda", torch.float16)]
CONFIG_IDS = [f"{d}-{str(t).removeprefix('torch.')}" for d, t in CONFIGS]
FLOOR = {torch.float32: 1e-6, torch.bfloat16: 1e-3, torch.float16: 2e-4}


def rotate(x, cos, sin, positions, interleaved):
    """x (b, s, h, d) rotated at positions (b, s) by tables (seqlen_ro, rotary_dim / 2): ours."""
    rd = cos.shape[1] * 2
    c = cos.float()[positions][:, :, None, :]  # (b, s, 1, rd/2)
    s = sin.float()[positions][:, :, None, :]
    xf = x.float()
    if interleaved:
        x0, x1 = xf[..., 0:rd:2], xf[..., 1:rd:2]
        r0, r1 = x0 * c - x1 * s, x0 * s + x1 * c
        rot = torch.stack((r0, r1), dim=-1).flatten(-2)
    else:
        x0, x1 = xf[..., : rd // 2], xf[..., rd // 2 : rd]
        rot = torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return torch.cat((rot, xf[..., rd:]), dim=-1).to(x.dtype)


def paged(k_logical, page, extra_pages=3, generator=None):
    """(b, n, h, d) -> pages (num_blocks, page, h, d) in a shuffled order and the block table."""
    b, n, h, d = k_logical.shape
    per_seq = n // page
    num_blocks = b * per_seq + extra_pages
    order = torch.randperm(num_blocks, generator=generator)[: b * per_seq]
    pages = torch.randn(num_blocks, page, h, d, dtype=k_logical.dtype).to(k_logical.device)
    pages[order.to(k_logical.device)] = k_logical.reshape(b * per_seq, page, h, d)
    return pages, order.reshape(b, per_seq).to(torch.int32).to(k_logical.device)


def paged_kv(k_log, v_log, page, generator):
    """Both logical caches paged into the same shuffled pages: (k pool, v pool, block_table)."""
    k_cache, table = paged(k_log, page, generator=generator)
    v_cache = torch.empty_like(k_cache)
    v_cache[table.long().flatten()] = v_log.reshape(-1, *k_cache.shape[1:])
    return k_cache, v_cache, table


def cache_in_layout(k_log, v_log, page, batch_idx, generator, kwargs):
    """The logical caches (b, n, hk, d; b = 3 with batch_idx) as a call takes them: paged (pages of `page` rows in a
    shuffled pool, the block table into kwargs), inside a pool of 5 sequences picked by
    cache_batch_idx (into kwargs), or as they are."""
    _, n, hk, d = k_log.shape
    if page:
        k_cache, v_cache, kwargs["block_table"] = paged_kv(k_log, v_log, page, generator)
        return k_cache, v_cache
    if batch_idx:
        idx = torch.tensor([4, 0, 2], dtype=torch.int32, device=k_log.device)
        k_cache = torch.randn(5, n, hk, d, generator=generator).to(k_log.device, k_log.dtype)
        v_cache = torch.randn(5, n, hk, d, generator=generator).to(k_log.device, k_log.dtype)
        k_cache[idx.long()] = k_log
        v_cache[idx.long()] = v_log
        kwargs["cache_batch_idx"] = idx
        return k_cache, v_cache
    return k_log.clone(), v_log.clone()


def gather(pages, table):
    b, per_seq = table.shape
    return pages[table.long().flatten()].reshape(b, per_seq * pages.shape[1], *pages.shape[2:])


@pytest.mark.parametrize("device,dtype", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize(
    "page,seqlen_q,seqlen_new,causal,window,rotary_dim,interleaved,leftpad,batch_idx",
    [
        (None, 1, 0, False, (-1, -1), 0, False, False, False),  # decoding
        (16, 1, 1, True, (-1, -1), 32, False, False, False),  # decoding step with append + rotary
        (16, 4, 4, True, (-1, -1), 64, True, False, False),  # speculative decoding
        (256, 3, 2, False, (-1, -1), 16, False, False, False),  # non-causal rotary: q at cache_seqlens
        (48, 17, 17, True, (20, 0), 32, False, False, False),  # chunked prefill, window, page 48
        (None, 2, 2, True, (-1, -1), 32, False, True, True),  # leftpad + cache_batch_idx
    ],
)
def test_kvcache(device, dtype, page, seqlen_q, seqlen_new, causal, window, rotary_dim, interleaved, leftpad,
                 batch_idx):  # fmt: skip
    g = torch.Generator().manual_seed(0)
    b, hq, hk, d, n = 3, 8, 2, 64, 768
    q = torch.randn(b, seqlen_q, hq, d, generator=g).to(device, dtype)
    k_log = torch.randn(b, n, hk, d, generator=g).to(device, dtype)
    v_log = torch.randn(b, n, hk, d, generator=g).to(device, dtype)
    cache_seqlens = torch.tensor([0, 100, n - max(seqlen_new, seqlen_q)], dtype=torch.int32, device=device)
    k_new = torch.randn(b, seqlen_new, hk, d, generator=g).to(device, dtype) if seqlen_new else None
    v_new = torch.randn(b, seqlen_new, hk, d, generator=g).to(device, dtype) if seqlen_new else None
    cos = sin = None
    if rotary_dim:
        angle = torch.rand(n, rotary_dim // 2, generator=g) * 2 * math.pi
        cos, sin = angle.cos().to(device, dtype), angle.sin().to(device, dtype)
    pad = torch.tensor([0, 7, 30], dtype=torch.int32, device=device) if leftpad else None
    if leftpad:
        cache_seqlens[0] = 5
    kwargs = dict(k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=cache_seqlens, causal=causal,
                  window_size=window, rotary_interleaved=interleaved, cache_leftpad=pad, return_softmax_lse=True)
    k_cache, v_cache = cache_in_layout(k_log, v_log, page, batch_idx, g, kwargs)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)

    # The logical cache after the append, and the rotated queries: built here.
    local = causal or window != (-1, -1)
    pos_k = cache_seqlens.long()[:, None] + torch.arange(seqlen_new, device=device)[None, :]
    k_exp, v_exp = k_log.clone(), v_log.clone()
    if seqlen_new:
        k_rot = rotate(k_new, cos, sin, pos_k, interleaved) if rotary_dim else k_new
        for i in range(b):
            k_exp[i, pos_k[i]] = k_rot[i]
            v_exp[i, pos_k[i]] = v_new[i]
    pos_q = cache_seqlens.long()[:, None] + (torch.arange(seqlen_q, device=device)[None, :] if local else 0)
    q_rot = rotate(q, cos, sin, pos_q.expand(b, seqlen_q), interleaved) if rotary_dim else q
    if page:
        table = kwargs["block_table"]
        k_got, v_got = gather(k_cache, table), gather(v_cache, table)
    elif batch_idx:
        idx = kwargs["cache_batch_idx"].long()
        k_got, v_got = k_cache[idx], v_cache[idx]
    else:
        k_got, v_got = k_cache, v_cache
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(k_got.float(), k_exp.float(), atol=tol, rtol=tol)
    assert torch.equal(v_got, v_exp)

    for i in range(b):
        start = int(pad[i]) if leftpad else 0
        end = int(cache_seqlens[i]) + seqlen_new
        ks, vs = k_exp[i : i + 1, start:end], v_exp[i : i + 1, start:end]
        ref, ref_lse = attention(q_rot[i : i + 1].double(), ks.double(), vs.double(), causal=causal, window_size=window)
        base, _ = attention(q_rot[i : i + 1], ks, vs, causal=causal, window_size=window)
        seen = torch.isfinite(ref_lse)
        ref = torch.where(seen.transpose(1, 2)[..., None], ref, torch.zeros_like(ref))
        base = torch.where(seen.transpose(1, 2)[..., None], base, torch.zeros_like(base))
        assert rel_err(out[i : i + 1], ref) <= 2 * rel_err(base, ref) + FLOOR[dtype]
        assert torch.allclose(lse[i][seen[0]].double(), ref_lse[0][seen[0]], atol=1e-3, rtol=1e-3)


def test_kvcache_int_seqlens_and_full_cache():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 1, 4, 32, generator=g)
    kc, vc = torch.randn(2, 50, 2, 32, generator=g), torch.randn(2, 50, 2, 32, generator=g)
    out_int = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=50)
    out_none = flash_attn_with_kvcache(q, kc, vc)
    ref, _ = attention(q.double(), kc.double(), vc.double())
    assert torch.equal(out_int, out_none)
    assert rel_err(out_int, ref) < 1e-5


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if HAS_CUDA else []))
def test_block_table_bounds(device):
    """Too few pages for a sequence: KvCacheBoundsError (a ValueError and a RuntimeError, as
    flash-attn raises), naming block_table; nothing written."""
    q = torch.randn(1, 1, 1, 64, dtype=torch.float16, device=device)
    kc = torch.randn(4, 256, 1, 64, dtype=torch.float16, device=device)
    vc = torch.randn_like(kc)
    table = torch.zeros(1, 1, dtype=torch.int32, device=device)
    kn = torch.randn(1, 1, 1, 64, dtype=torch.float16, device=device)
    full = torch.full((1,), 256, dtype=torch.int32, device=device)
    kc0 = kc.clone()
    with pytest.raises(RuntimeError, match="block_table"):
        flash_attn_with_kvcache(q, kc, vc, k=kn, v=kn, cache_seqlens=full, block_table=table)
    with pytest.raises(ValueError, match="block_table"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=full + 1, block_table=table)
    with pytest.raises(KvCacheBoundsError, match="block_table"):  # an int: checked on the host
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=257, block_table=table)
    with pytest.raises(KvCacheBoundsError, match="block_table"):
        flash_attn_with_kvcache(q, kc, vc, k=kn, v=kn, cache_seqlens=256, block_table=table)
    assert torch.equal(kc, kc0)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=full, block_table=table)
    assert not out.isnan().any()


def test_errors():
    q = torch.randn(2, 1, 4, 32)
    kc = torch.randn(2, 16, 2, 32)
    with pytest.raises(ValueError, match="alibi_slopes.shape"):
        flash_attn_with_kvcache(q, kc, kc, alibi_slopes=torch.ones(3, 4))
    with pytest.raises(TypeError, match="alibi_slopes.dtype"):
        flash_attn_with_kvcache(q, kc, kc, alibi_slopes=torch.ones(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="alibi_slopes"):
        flash_attn_with_kvcache(q, kc, kc, alibi_slopes=[0.5] * 4)
    with pytest.raises(ValueError, match="page_size"):
        flash_attn_with_kvcache(q, torch.randn(3, 24, 2, 32), torch.randn(3, 24, 2, 32),
                                block_table=torch.zeros(2, 1, dtype=torch.int32))  # fmt: skip
    with pytest.raises(ValueError, match="cache_seqlens"):
        flash_attn_with_kvcache(q, kc, kc, k=torch.randn(2, 1, 2, 32), v=torch.randn(2, 1, 2, 32),
                                cache_seqlens=torch.tensor([16, 3], dtype=torch.int32))  # fmt: skip
    with pytest.raises(TypeError, match="k_cache.dtype"):
        flash_attn_with_kvcache(q, kc.half(), kc.half())


@pytest.mark.parametrize("device,dtype", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("page", [16, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_paged(device, dtype, page, causal):
    g = torch.Generator().manual_seed(2)
    lens_q, lens_k = [3, 1, 40], [300, 1, 512]
    hq, hk, d = 4, 2, 64
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(device, dtype)
    k_log = torch.randn(3, 512, hk, d, generator=g).to(device, dtype)
    v_log = torch.randn(3, 512, hk, d, generator=g).to(device, dtype)
    k_cache, v_cache, table = paged_kv(k_log, v_log, page, g)
    cu_q = torch.tensor([0, 3, 4, 44], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 300, 301, 813], dtype=torch.int32, device=device)
    out = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 40, 512, causal=causal, block_table=table)
    for i in range(3):
        qs = q[cu_q[i] : cu_q[i + 1]][None]
        ks, vs = k_log[i : i + 1, : lens_k[i]], v_log[i : i + 1, : lens_k[i]]
        ref, _ = attention(qs.double(), ks.double(), vs.double(), causal=causal)
        base, _ = attention(qs, ks, vs, causal=causal)
        assert rel_err(out[cu_q[i] : cu_q[i + 1]][None], ref) <= 2 * rel_err(base, ref) + FLOOR[dtype]


def test_varlen_forward_internal_num_splits():
    """flash-attn's _flash_attn_varlen_forward (its tests call it): num_splits 0 = default,
    more than 1 rejected (a RuntimeError, as flash-attn's)."""
    from flashattn.torch import _flash_attn_varlen_forward

    g = torch.Generator().manual_seed(3)
    k_log = torch.randn(2, 512, 2, 64, generator=g)
    k_cache, table = paged(k_log, 256, generator=g)
    q = torch.randn(2, 4, 64, generator=g)
    cu_q = torch.arange(3, dtype=torch.int32)
    used = torch.tensor([300, 512], dtype=torch.int32)
    cu_k = torch.tensor([0, 300, 812], dtype=torch.int32)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=1, max_seqlen_k=512, dropout_p=0.0,
              softmax_scale=0.125, causal=False, window_size_left=-1, window_size_right=0,
              block_table=table, seqused_k=used)  # fmt: skip
    a = _flash_attn_varlen_forward(q, k_cache, k_cache, **kw)[0]
    b = _flash_attn_varlen_forward(q, k_cache, k_cache, **kw, num_splits=0)[0]
    assert torch.equal(a, b) and not a.isnan().any()
    with pytest.raises(RuntimeError, match="num_splits > 1 is not supported"):
        _flash_attn_varlen_forward(q, k_cache, k_cache, **kw, num_splits=2)


def test_cache_is_never_copied():
    """A cache whose last dimension is strided is rejected, not copied (the append would be lost)."""
    q = torch.randn(1, 1, 2, 32)
    kc = torch.randn(1, 16, 2, 64)[..., ::2]
    with pytest.raises(ValueError, match="k_cache.stride"):
        flash_attn_with_kvcache(q, kc, kc, cache_seqlens=4)


def kv_alibi_reference(q, k_cache, v_cache, start, end, slopes, causal, window, softcap):
    """One sequence of a KV-cache call with ALiBi, as flash-attn's test states it, in q's dtype (and
    float64 for float64 inputs): q (sq, hq, d) against the whole logical cache (n, hk, d), keys
    counted from cache row 0; the sequence sees rows [start, end) (start = cache_leftpad, end =
    cache_seqlens + seqlen_new). Query i's diagonal is row i + end - sq: causal and windows cut
    around it and the bias is -slope * |i + end - sq - j|. Returns (out (sq, hq, d), lse (hq, sq)),
    rows that see no key 0 and -inf."""
    sq, hq, d = q.shape
    n, hk = k_cache.shape[0], k_cache.shape[1]
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(n)[None, :]
    diag = i + end - sq
    seen = (j >= start) & (j < end)
    if left >= 0:
        seen = seen & (j >= diag - left)
    if right >= 0:
        seen = seen & (j <= diag + right)
    seen = seen.expand(sq, n)
    seen = seen.to(q.device)
    kt = k_cache.repeat_interleave(hq // hk, dim=1).transpose(0, 1)  # (hq, n, d)
    vt = v_cache.repeat_interleave(hq // hk, dim=1).transpose(0, 1)
    s = (q.transpose(0, 1) @ kt.transpose(1, 2)) / math.sqrt(d)  # (hq, sq, n)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    distance = (diag - j).abs().to(device=q.device, dtype=s.dtype)
    s = s - slopes.to(s.dtype)[:, None, None] * distance
    s = s.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(s.double(), dim=-1)
    any_seen = seen.any(dim=1)  # (sq,)
    p = torch.softmax(s.masked_fill(~any_seen[:, None], 0.0), dim=-1) * any_seen[:, None]
    return (p @ vt).transpose(0, 1), lse


@pytest.mark.parametrize("device,dtype", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize(
    "page,seqlen_q,seqlen_new,causal,window,softcap,leftpad,batch_idx,per_sequence,head_dim,num_splits",
    [
        (None, 1, 0, False, (-1, -1), 0.0, False, False, False, 64, 0),  # decoding; sequence 0: no key
        (16, 1, 1, True, (-1, -1), 0.0, True, False, True, 64, 3),  # decoding step, leftpad, split keys
        (256, 4, 4, True, (-1, -1), 0.0, False, False, True, 64, 0),  # speculative decoding
        (48, 17, 17, True, (20, 0), 5.0, False, False, False, 64, 0),  # chunked prefill, window, softcap
        (None, 3, 2, False, (-1, -1), 0.0, True, True, True, 59, 0),  # leftpad + cache_batch_idx, odd d
        (None, 7, 0, False, (5, 3), 0.0, True, False, False, 96, 2),  # two-sided window
        (16, 5, 0, True, (-1, -1), 0.0, True, False, True, 32, 0),  # more queries than keys: masked rows
    ],
)
def test_kvcache_alibi(device, dtype, page, seqlen_q, seqlen_new, causal, window, softcap, leftpad, batch_idx,
                       per_sequence, head_dim, num_splits):  # fmt: skip
    """ALiBi in flash_attn_with_kvcache: the bias counts from the cache's last row after the append
    (cache_seqlens + seqlen_new), keys from cache row 0 (cache_leftpad only hides rows), slopes of
    (batch, nheads) by sequence, not by cache batch; every layout of the cache."""
    g = torch.Generator().manual_seed(4)
    b, hq, hk, d, n = 3, 8, 2, head_dim, 768  # n: whole pages of 16, 48 and 256
    q = torch.randn(b, seqlen_q, hq, d, generator=g).to(device, dtype)
    k_log = torch.randn(b, n, hk, d, generator=g).to(device, dtype)
    v_log = torch.randn(b, n, hk, d, generator=g).to(device, dtype)
    k_new = torch.randn(b, seqlen_new, hk, d, generator=g).to(device, dtype) if seqlen_new else None
    v_new = torch.randn(b, seqlen_new, hk, d, generator=g).to(device, dtype) if seqlen_new else None
    slopes = (torch.rand((b, hq) if per_sequence else (hq,), generator=g) * 0.5 + 0.05).to(device)
    cache_seqlens = torch.tensor([0, 100, n - max(seqlen_new, seqlen_q)], dtype=torch.int32, device=device)
    pad = None
    if leftpad:  # sequence 0: 2 keys before the append (fewer than the queries of the last case)
        cache_seqlens[0] = 5
        pad = torch.tensor([3, 7, 130], dtype=torch.int32, device=device)
    kwargs = dict(k=k_new, v=v_new, cache_seqlens=cache_seqlens, causal=causal, window_size=window, softcap=softcap,
                  cache_leftpad=pad, alibi_slopes=slopes, num_splits=num_splits, return_softmax_lse=True)  # fmt: skip
    k_cache, v_cache = cache_in_layout(k_log, v_log, page, batch_idx, g, kwargs)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)

    k_exp, v_exp = k_log.clone(), v_log.clone()
    for i in range(b):
        rows = slice(int(cache_seqlens[i]), int(cache_seqlens[i]) + seqlen_new)
        if seqlen_new:
            k_exp[i, rows], v_exp[i, rows] = k_new[i], v_new[i]
    masked_rows = 0
    for i in range(b):
        start = int(pad[i]) if leftpad else 0
        end = int(cache_seqlens[i]) + seqlen_new
        slope = slopes[i] if per_sequence else slopes
        args = (start, end, slope, causal, window, softcap)
        ref, ref_lse = kv_alibi_reference(q[i].double(), k_exp[i].double(), v_exp[i].double(), *args)
        base, _ = kv_alibi_reference(q[i], k_exp[i], v_exp[i], *args)
        assert rel_err(out[i], ref) <= 2 * rel_err(base, ref) + FLOOR[dtype]
        seen = torch.isfinite(ref_lse)
        assert torch.allclose(lse[i][seen].double(), ref_lse[seen], atol=1e-3, rtol=1e-3)
        # Rows that see no key: out exactly 0, LSE -inf.
        assert torch.all(lse[i][~seen] == float("-inf"))
        assert torch.all(out[i].transpose(0, 1)[~seen] == 0)
        masked_rows += int((~seen).sum())
    if not leftpad and seqlen_new == 0:
        assert masked_rows > 0  # sequence 0's empty cache
    if (page, seqlen_q) == (16, 5):
        assert masked_rows == 3 * hq  # sequence 0: 2 keys, 5 causal queries


@pytest.mark.parametrize("device,dtype", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqused", [False, True])
def test_varlen_paged_alibi(device, dtype, causal, seqused):
    """ALiBi over a paged cache in the varlen forward: seqlen_k is each sequence's keys in use
    (seqused_k[b] when given)."""
    g = torch.Generator().manual_seed(5)
    lens_q, lens_k, page, hq, hk, d = [3, 1, 40], [300, 1, 512], 16, 4, 2, 64
    used = [250, 0, 37] if seqused else lens_k  # sequence 1 sees no key; 2 sees fewer than it has queries
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(device, dtype)
    k_log = torch.randn(3, 512, hk, d, generator=g).to(device, dtype)
    v_log = torch.randn(3, 512, hk, d, generator=g).to(device, dtype)
    k_cache, v_cache, table = paged_kv(k_log, v_log, page, g)
    slopes = (torch.rand(3, hq, generator=g) * 0.5 + 0.05).to(device)
    cu_q = torch.tensor([0, 3, 4, 44], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 300, 301, 813], dtype=torch.int32, device=device)
    extra = dict(seqused_k=torch.tensor(used, dtype=torch.int32, device=device)) if seqused else {}
    out, lse, *_ = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 40, 512, causal=causal,
                                          block_table=table, alibi_slopes=slopes, return_attn_probs=True,
                                          **extra)  # fmt: skip
    for i in range(3):
        qs = q[cu_q[i] : cu_q[i + 1]]
        args = (0, used[i], slopes[i], causal, (-1, -1), 0.0)
        ref, ref_lse = kv_alibi_reference(qs.double(), k_log[i].double(), v_log[i].double(), *args)
        base, _ = kv_alibi_reference(qs, k_log[i], v_log[i], *args)
        got = out[cu_q[i] : cu_q[i + 1]]
        assert rel_err(got, ref) <= 2 * rel_err(base, ref) + FLOOR[dtype]
        seen = torch.isfinite(ref_lse)
        got_lse = lse[:, cu_q[i] : cu_q[i + 1]]
        assert torch.allclose(got_lse[seen].double(), ref_lse[seen], atol=1e-3, rtol=1e-3)
        assert torch.all(got_lse[~seen] == float("-inf"))
        assert torch.all(got.transpose(0, 1)[~seen] == 0)
