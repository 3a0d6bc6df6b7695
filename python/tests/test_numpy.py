"""flashattn's entry points on NumPy arrays (CPU backend) against the float64 NumPy reference."""
import numpy as np
import pytest

import flashattn
from numpy_reference import attention, attention_varlen, rel_err

# Relative error bounds: f32 inputs against float64, and f16 whose outputs round to 11 bits.
TOLERANCE = {np.float32: 1e-5, np.float16: 2e-3}


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def poisoned(shape, dtype):
    return np.full(shape, np.nan, dtype=dtype)


def check_lse(lse, ref, atol=1e-4):
    finite = np.isfinite(ref)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref)), "rows that see no key have LSE -inf"
    np.testing.assert_allclose(lse[finite], ref[finite], rtol=1e-5, atol=atol)


CASES = [
    # batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, options
    (2, 17, 17, 4, 4, 32, {}),
    (1, 1, 1, 1, 1, 8, {}),
    (2, 33, 65, 4, 2, 16, {"causal": True}),
    (1, 9, 4, 2, 1, 16, {"causal": True}),  # seqlen_q > seqlen_k: the first rows see no key
    (2, 20, 31, 6, 2, 24, {"window_size": (5, 3)}),
    (1, 12, 12, 2, 2, 64, {"softcap": 3.0, "softmax_scale": 0.3}),
    (1, 16, 10, 3, 1, 40, {"causal": True, "window_size": (2, -1), "softcap": 8.0}),
    # flash-attn's rule: causal sets the right window to 0 whatever is given
    (1, 20, 25, 2, 2, 16, {"causal": True, "window_size": (6, 9)}),
    # ALiBi: slopes per head or per (batch, head), causal or not, with a window and a softcap
    (2, 17, 30, 4, 2, 32, {"alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625], np.float32)}),
    (2, 30, 17, 4, 4, 32, {"alibi_slopes": np.linspace(0.05, 0.8, 8, dtype=np.float32).reshape(2, 4), "causal": True}),
    (1, 24, 24, 2, 1, 16, {"alibi_slopes": np.array([0.3, 0.7], np.float32), "window_size": (5, 3), "softcap": 4.0}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}_q{}_k{}_h{}-{}_d{}_{}".format(*c[:6], "-".join(c[6])))
def test_forward_and_backward_match_reference(case, dtype):
    b, sq, sk, hq, hk, d, options = case
    rng = np.random.default_rng(sum(case[:6]))
    q, k, v = randn(rng, (b, sq, hq, d), dtype), randn(rng, (b, sk, hk, d), dtype), randn(rng, (b, sk, hk, d), dtype)
    dout = randn(rng, (b, sq, hq, d), dtype)
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = attention(q, k, v, dout=dout, **options)

    out, lse = poisoned(q.shape, dtype), poisoned((b, hq, sq), np.float32)
    flashattn.forward(q, k, v, out, lse, **options)
    assert rel_err(out, ref_out) < TOLERANCE[dtype]
    check_lse(lse, ref_lse)
    seen_none = np.isneginf(ref_lse)  # (b, hq, sq)
    assert np.all(out.transpose(0, 2, 1, 3)[seen_none] == 0), "rows that see no key are 0"

    dq, dk, dv = poisoned(q.shape, dtype), poisoned(k.shape, dtype), poisoned(v.shape, dtype)
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, **options)
    for got, ref in ((dq, ref_dq), (dk, ref_dk), (dv, ref_dv)):
        assert rel_err(got, ref) < 2 * TOLERANCE[dtype]


def varlen_inputs(rng, lengths_q, lengths_k, hq, hk, d):
    """Packed q, k, v, dout (float32) of sequences of these lengths, and their int32 offsets."""
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q = randn(rng, (cu_q[-1], hq, d), np.float32)
    k, v = randn(rng, (cu_k[-1], hk, d), np.float32), randn(rng, (cu_k[-1], hk, d), np.float32)
    return q, k, v, randn(rng, q.shape, np.float32), cu_q, cu_k


def test_varlen_matches_reference():
    rng = np.random.default_rng(7)
    lengths_q, lengths_k = [3, 0, 7, 1, 5], [5, 2, 7, 0, 9]
    q, k, v, dout, cu_q, cu_k = varlen_inputs(rng, lengths_q, lengths_k, hq=4, hk=2, d=32)
    options = dict(causal=True, window_size=(4, -1))
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = attention_varlen(q, k, v, cu_q, cu_k, dout=dout, **options)
    _check_varlen(q, k, v, dout, cu_q, cu_k, lengths_q, lengths_k, options, ref_out, ref_lse, ref_dq, ref_dk, ref_dv)


@pytest.mark.parametrize("slopes_shape", ["heads", "batch_heads"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_alibi_matches_reference(slopes_shape, causal):
    """ALiBi measures distance with each sequence's own lengths."""
    rng = np.random.default_rng(8)
    lengths_q, lengths_k = [3, 0, 7, 9, 5], [5, 2, 7, 4, 9]
    q, k, v, dout, cu_q, cu_k = varlen_inputs(rng, lengths_q, lengths_k, hq=4, hk=2, d=32)
    hq = q.shape[1]
    shape = (hq,) if slopes_shape == "heads" else (len(lengths_q), hq)
    options = dict(causal=causal, alibi_slopes=rng.uniform(0.1, 1.0, shape).astype(np.float32))
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = attention_varlen(q, k, v, cu_q, cu_k, dout=dout, **options)
    _check_varlen(q, k, v, dout, cu_q, cu_k, lengths_q, lengths_k, options, ref_out, ref_lse, ref_dq, ref_dk, ref_dv)


def _check_varlen(q, k, v, dout, cu_q, cu_k, lengths_q, lengths_k, options, ref_out, ref_lse, ref_dq, ref_dk, ref_dv):
    hq = q.shape[1]

    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))
    out, lse = poisoned(q.shape, np.float32), poisoned((hq, q.shape[0]), np.float32)
    flashattn.forward(q, k, v, out, lse, **varlen, **options)
    assert rel_err(out, ref_out) < 1e-5
    check_lse(lse, ref_lse)
    dq, dk, dv = poisoned(q.shape, np.float32), poisoned(k.shape, np.float32), poisoned(v.shape, np.float32)
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, **varlen, **options)
    for got, ref in ((dq, ref_dq), (dk, ref_dk), (dv, ref_dv)):
        assert rel_err(got, ref) < 1e-5


def test_strided_views_are_read_and_written_in_place():
    """(batch, heads, seqlen, dim) memory and a padded output buffer work without copies."""
    rng = np.random.default_rng(3)
    b, s, h, d = 2, 11, 3, 16
    q, k, v = (randn(rng, (b, h, s, d), np.float32).transpose(0, 2, 1, 3) for _ in range(3))
    assert not q.flags.c_contiguous
    buffer = np.full((b, s, h, d + 8), 7.0, dtype=np.float32)  # out is a strided view of it
    out = buffer[..., :d]
    lse = np.empty((b, h, s), np.float32)
    flashattn.forward(q, k, v, out, lse)
    ref_out, ref_lse = attention(q, k, v)
    assert rel_err(out, ref_out) < 1e-5
    check_lse(lse, ref_lse)
    assert np.all(buffer[..., d:] == 7.0), "nothing outside the view is written"


class DLPackOnly:
    """Shows an array through the DLPack protocol alone, as JAX, CuPy and other frameworks do."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_only_objects_are_read_and_written_in_place():
    """Any DLPack producer works without copies: the outputs land in the producer's memory."""
    rng = np.random.default_rng(5)
    b, s, h, d = 2, 13, 2, 32
    q, k, v, dout = (randn(rng, (b, s, h, d), np.float32) for _ in range(4))
    out, lse = poisoned(q.shape, np.float32), poisoned((b, h, s), np.float32)
    flashattn.forward(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), DLPackOnly(out), DLPackOnly(lse), causal=True)
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = attention(q, k, v, dout=dout, causal=True)
    assert rel_err(out, ref_out) < 1e-5
    check_lse(lse, ref_lse)
    dq, dk, dv = (poisoned(x.shape, np.float32) for x in (q, k, v))
    flashattn.backward(*(DLPackOnly(x) for x in (dout, q, k, v, out, lse, dq, dk, dv)), causal=True)
    for got, ref in ((dq, ref_dq), (dk, ref_dk), (dv, ref_dv)):
        assert rel_err(got, ref) < 2e-5


def test_read_only_inputs_and_optional_lse():
    rng = np.random.default_rng(4)
    q, k, v = (randn(rng, (1, 5, 2, 8), np.float32) for _ in range(3))
    for x in (q, k, v):
        x.flags.writeable = False
    out = poisoned(q.shape, np.float32)
    flashattn.forward(q, k, v, out)
    assert rel_err(out, attention(q, k, v)[0]) < 1e-5


def test_reference_entry_points_agree():
    rng = np.random.default_rng(5)
    q, k, v, dout = (randn(rng, (1, 6, 2, 8), np.float32) for _ in range(4))
    out, lse = poisoned(q.shape, np.float32), poisoned((1, 2, 6), np.float32)
    flashattn.reference_forward(q, k, v, out, lse, causal=True)
    ref = attention(q, k, v, dout=dout, causal=True)
    assert rel_err(out, ref[0]) < 1e-6
    dq, dk, dv = (poisoned(q.shape, np.float32) for _ in range(3))
    flashattn.reference_backward(dout, q, k, v, out, lse, dq, dk, dv, causal=True)
    for got, want in zip((dq, dk, dv), ref[2:]):
        assert rel_err(got, want) < 1e-6


@pytest.mark.parametrize("shape_q,shape_k", [((0, 4, 2, 8), (0, 4, 2, 8)), ((2, 0, 2, 8), (2, 5, 2, 8))])
def test_empty_problems_are_no_ops(shape_q, shape_k):
    q = np.zeros(shape_q, np.float32)
    k = v = np.ones(shape_k, np.float32)
    out = np.empty_like(q)
    flashattn.forward(q, k, v, out, np.empty((shape_q[0], 2, shape_q[1]), np.float32))


def test_seqlen_k_zero_gives_zero_rows():
    q = np.ones((1, 3, 2, 8), np.float32)
    k = v = np.ones((1, 0, 2, 8), np.float32)
    out, lse = poisoned(q.shape, np.float32), poisoned((1, 2, 3), np.float32)
    flashattn.forward(q, k, v, out, lse)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


# ---- errors: the library's message, the right Python type, nothing written ----------------------


def _arrays():
    rng = np.random.default_rng(6)
    q, k, v = (randn(rng, (2, 5, 4, 8), np.float32) for _ in range(3))
    return q, k, v, poisoned(q.shape, np.float32), poisoned((2, 4, 5), np.float32)


ERRORS = [
    # what to change, the exception, a piece of its message
    (lambda a: a.update(k=a["k"][:, :, :3]), ValueError, "heads"),
    (lambda a: a.update(v=a["v"][:, :4]), ValueError, "v.shape[1] (seqlen_k)"),
    (lambda a: a.update(q=a["q"][0]), ValueError, "q: expected 4 dimensions"),
    (lambda a: a.update(q=a["q"][None]), ValueError, "q: expected 1 to 4 dimensions"),
    (lambda a: a.update(lse=a["lse"][:, :, :4]), ValueError, "lse.shape"),
    (lambda a: a.update(q=a["q"].astype(np.float64)), TypeError, "q.dtype: expected f32, f16 or bf16, got float64"),
    (lambda a: a.update(k=a["k"].astype(np.float16)), TypeError, "k.dtype"),
    (lambda a: a.update(lse=a["lse"].astype(np.float16)), TypeError, "lse.dtype: expected f32"),
    (lambda a: a.update(q=a["q"].tolist()), TypeError, "q: expected a tensor"),
    (lambda a: a.update(softcap=-1.0), ValueError, "softcap"),
    (lambda a: a.update(window_size=(-2, 2)), ValueError, "window_left"),
    (lambda a: a.update(alibi_slopes=np.ones(3, np.float32)), ValueError, "alibi_slopes.shape"),
    (lambda a: a.update(alibi_slopes=np.ones(4, np.float16)), TypeError, "alibi_slopes"),
    (lambda a: a.update(alibi_slopes=np.ones((2, 4, 1), np.float32)), ValueError, "alibi_slopes"),
    (lambda a: a.update(q=np.zeros((2, 5, 4, 1032), np.float32)), NotImplementedError, "head_dim"),
]


@pytest.mark.parametrize("change,error,message", ERRORS, ids=[e[2] for e in ERRORS])
def test_bad_arguments_raise_and_write_nothing(change, error, message):
    q, k, v, out, lse = _arrays()
    args = dict(q=q, k=k, v=v, out=out, lse=lse)
    change(args)  # q, k and v are checked before out, so out may keep q's old shape
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        flashattn.forward(**args)
    assert np.isnan(args["out"]).all() and np.isnan(lse).all(), "nothing is written on error"


def test_read_only_output_is_a_type_error():
    q, k, v, out, lse = _arrays()
    out.flags.writeable = False
    with pytest.raises(TypeError, match="out: expected a writable tensor"):
        flashattn.forward(q, k, v, out, lse)


def test_bad_offsets_are_value_errors():
    q = np.ones((6, 2, 8), np.float32)
    out = poisoned(q.shape, np.float32)
    cu = np.array([0, 4, 2, 6], np.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flashattn.forward(q, q, q, out, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=6, max_seqlen_k=6)
    with pytest.raises(TypeError, match="cu_seqlens_q.dtype: expected i32"):
        flashattn.forward(q, q, q, out, cu_seqlens_q=cu.astype(np.int64), cu_seqlens_k=cu, max_seqlen_q=6)
    assert np.isnan(out).all()


def test_build_information():
    assert isinstance(flashattn.__version__, str) and flashattn.__version__.count(".") == 2
    assert isinstance(flashattn.built_with_cuda(), bool)
    assert flashattn.cuda_available() in (False, True)
    if not flashattn.built_with_cuda():
        assert not flashattn.cuda_available()
