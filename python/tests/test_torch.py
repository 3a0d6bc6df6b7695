"""flashattn.torch against PyTorch's attention in float64: outputs, LSE and gradients, on CPU
tensors (CPU backend) and, where there is a GPU and a CUDA build, on CUDA tensors."""
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn.torch import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from torch_reference import attention, rel_err  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and flashattn.built_with_cuda()
# (device, dtype, head dim): what each backend is checked on.
# Head dims between the GPU kernels' widths too: 80 (a multiple of 8, on the width 96) and 59
# (rows only element-aligned; packed qkv of it has no 16-byte strides either).
CONFIGS = [("cpu", torch.float32, 32), ("cpu", torch.bfloat16, 64), ("cpu", torch.float16, 59)]
if HAS_CUDA:
    CONFIGS += [("cuda", dt, hd) for dt in (torch.bfloat16, torch.float16) for hd in (64, 128, 80, 59)]
CONFIG_IDS = [f"{d}-{str(t).removeprefix('torch.')}-d{h}" for d, t, h in CONFIGS]
# Floor under the error bound, for cases where PyTorch's own error happens to be tiny.
FLOOR = {torch.float32: 1e-6, torch.bfloat16: 1e-3, torch.float16: 2e-4}

_probed = {}


def require_kernels(device, dtype, head_dim):
    """Skips when this build has no kernel for the configuration (NotImplementedError)."""
    key = (device, dtype, head_dim)
    if key not in _probed:
        q = torch.randn(1, 4, 2, head_dim, device=device, dtype=dtype, requires_grad=True)
        try:
            flash_attn_func(q, q, q).sum().backward()
            _probed[key] = None
        except NotImplementedError as e:
            _probed[key] = str(e)
    if _probed[key]:
        pytest.skip(_probed[key])


def cu_seqlens(lengths, device):
    """int32 offsets of packed sequences of these lengths: [0, l0, l0 + l1, ...]."""
    return torch.tensor([sum(lengths[:i]) for i in range(len(lengths) + 1)], dtype=torch.int32, device=device)


def make(shape, device, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)


def check_against_pytorch(run, inputs, dout, options, dtype, check_lse=True):
    """run(q, k, v) -> (out, lse); checks out, lse and the gradients against float64 PyTorch, with
    a bound of twice PyTorch's own error in `dtype` (plus a floor)."""
    ours_in = [x.detach().clone().requires_grad_() for x in inputs]
    ref_in = [x.detach().double().requires_grad_() for x in inputs]
    base_in = [x.detach().clone().requires_grad_() for x in inputs]
    out, lse = run(*ours_in)
    ref_out, ref_lse = attention(*ref_in, **options)
    base_out, _ = attention(*base_in, **options)
    grads = torch.autograd.grad(out, ours_in, dout)
    ref_grads = torch.autograd.grad(ref_out, ref_in, dout.double())
    base_grads = torch.autograd.grad(base_out, base_in, dout)
    for name, x, ref, base in [("out", out, ref_out, base_out)] + [
        ("d" + n, g, r, b) for n, g, r, b in zip("qkv", grads, ref_grads, base_grads)
    ]:
        assert x.dtype == dtype and x.shape == ref.shape, name
        err, bound = rel_err(x, ref), 2 * rel_err(base, ref) + FLOOR[dtype]
        assert err <= bound, f"{name}: error {err:.2e} > {bound:.2e} (twice PyTorch's in {dtype})"
    if check_lse:
        assert lse.dtype == torch.float32
        assert torch.equal(lse.isneginf(), ref_lse.isneginf())
        finite = ref_lse.isfinite()
        torch.testing.assert_close(lse[finite].double(), ref_lse[finite], rtol=1e-4, atol=1e-4)


CASES = [
    # batch, seqlen_q, seqlen_k, heads_q, heads_kv, options
    (2, 64, 64, 4, 4, {}),
    (2, 37, 100, 4, 2, {"causal": True}),
    (1, 1, 17, 2, 1, {}),
    (1, 40, 9, 2, 2, {"causal": True}),  # the first rows see no key
    (2, 70, 70, 4, 1, {"window_size": (16, 8)}),
    (1, 33, 33, 2, 2, {"softcap": 20.0, "softmax_scale": 0.05, "causal": True}),
    (2, 37, 100, 4, 2, {"alibi_slopes": torch.tensor([0.5, 0.25, 0.125, 0.0625])}),
    (2, 60, 30, 4, 4, {"causal": True, "alibi_slopes": torch.linspace(0.05, 0.6, 8).reshape(2, 4)}),
    (1, 70, 70, 2, 1, {"window_size": (16, 8), "alibi_slopes": torch.tensor([0.3, 0.9]), "softcap": 10.0}),
]


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}_q{}_k{}_h{}-{}_{}".format(*c[:5], "-".join(c[5])))
def test_flash_attn_func(config, case):
    device, dtype, d = config
    b, sq, sk, hq, hk, options = case
    options = {n: x.to(device) if isinstance(x, torch.Tensor) else x for n, x in options.items()}
    require_kernels(device, dtype, d)
    seed = sum(case[:5]) + d
    q, k, v = make((b, sq, hq, d), device, dtype, seed), make((b, sk, hk, d), device, dtype, seed + 1), make(
        (b, sk, hk, d), device, dtype, seed + 2
    )
    dout = make((b, sq, hq, d), device, dtype, seed + 3)

    def run(q, k, v):
        out, lse, probs = flash_attn_func(q, k, v, return_attn_probs=True, **options)
        assert probs is None and lse.shape == (b, hq, sq)
        return out, lse

    check_against_pytorch(run, (q, k, v), dout, options, dtype)


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_flash_attn_varlen_func(config):
    device, dtype, d = config
    require_kernels(device, dtype, d)
    lengths_q, lengths_k = [5, 0, 33, 1, 17], [9, 3, 33, 0, 40]
    cu_q, cu_k = cu_seqlens(lengths_q, device), cu_seqlens(lengths_k, device)
    offsets_q, offsets_k = cu_q.tolist(), cu_k.tolist()
    hq, hk = 4, 2
    q = make((sum(lengths_q), hq, d), device, dtype, 11)
    k, v = make((sum(lengths_k), hk, d), device, dtype, 12), make((sum(lengths_k), hk, d), device, dtype, 13)
    dout = make(q.shape, device, dtype, 14)
    options = {"causal": True}

    def per_sequence(fn):
        # The packed problem as one attention() per sequence, concatenated.
        def run(q, k, v):
            outs, lses = [], []
            for b in range(len(lengths_q)):
                rq, rk = slice(offsets_q[b], offsets_q[b + 1]), slice(offsets_k[b], offsets_k[b + 1])
                out, lse = fn(q[None, rq], k[None, rk], v[None, rk])
                outs.append(out[0])
                lses.append(lse[0])
            return torch.cat(outs), torch.cat(lses, dim=-1)

        return run

    def run(q, k, v):
        out, lse, _ = flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), return_attn_probs=True, **options
        )
        assert lse.shape == (hq, q.shape[0])
        return out, lse

    # Ground truth and baseline per sequence; ours packed.
    ours_in = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out, lse = run(*ours_in)
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref_out, ref_lse = per_sequence(lambda *a: attention(*a, **options))(*ref_in)
    assert rel_err(out, ref_out) < {torch.float32: 1e-5}.get(dtype, 1e-2)
    torch.testing.assert_close(lse[ref_lse.isfinite()].double(), ref_lse[ref_lse.isfinite()], rtol=1e-4, atol=1e-4)
    assert torch.equal(lse.isneginf(), ref_lse.isneginf())
    grads = torch.autograd.grad(out, ours_in, dout)
    ref_grads = torch.autograd.grad(ref_out, ref_in, dout.double())
    for g, r in zip(grads, ref_grads):
        assert rel_err(g, r) < {torch.float32: 1e-5}.get(dtype, 2e-2)


@pytest.mark.parametrize("config", CONFIGS[:1] + CONFIGS[2:3], ids=(CONFIG_IDS[:1] + CONFIG_IDS[2:3]))
def test_packed_variants_match_unpacked(config):
    device, dtype, d = config
    require_kernels(device, dtype, d)
    qkv = make((2, 19, 3, 4, d), device, dtype, 21)
    q, k, v = qkv.unbind(2)
    expected = flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(flash_attn_qkvpacked_func(qkv, causal=True), expected)
    torch.testing.assert_close(flash_attn_kvpacked_func(q, qkv[:, :, 1:], causal=True), expected)
    packed = qkv.flatten(0, 1)
    cu = torch.tensor([0, 19, 38], dtype=torch.int32, device=device)
    out = flash_attn_varlen_qkvpacked_func(packed, cu, 19, causal=True)
    torch.testing.assert_close(out, expected.flatten(0, 1))


@pytest.mark.parametrize("config", CONFIGS[:1] + CONFIGS[2:3], ids=(CONFIG_IDS[:1] + CONFIG_IDS[2:3]))
def test_layouts_without_and_with_copies(config):
    """(batch, heads, seqlen, dim) memory is used in place; a non-contiguous last dim is copied."""
    device, dtype, d = config
    require_kernels(device, dtype, d)
    bhsd = [make((2, 4, 23, d), device, dtype, 30 + i) for i in range(3)]
    q, k, v = (x.transpose(1, 2) for x in bhsd)
    expected = flash_attn_func(*(x.contiguous() for x in (q, k, v)))
    torch.testing.assert_close(flash_attn_func(q, k, v), expected)
    strided_last = [x.transpose(-1, -2).contiguous().transpose(-1, -2) for x in (q, k, v)]
    assert strided_last[0].stride(-1) != 1
    torch.testing.assert_close(flash_attn_func(*strided_last), expected)


def test_no_grad_and_inference():
    q = make((1, 9, 2, 32), "cpu", torch.float32, 40).requires_grad_()
    with torch.no_grad():
        out = flash_attn_func(q, q, q)  # computes no LSE
        assert out.grad_fn is None
        with_lse, lse, _ = flash_attn_func(q, q, q, return_attn_probs=True)
        torch.testing.assert_close(out, with_lse, rtol=0, atol=0)
        assert lse.shape == (1, 2, 9) and lse.is_contiguous()
    with torch.inference_mode():
        assert flash_attn_func(q.detach(), q.detach(), q.detach()).shape == q.shape
    assert flash_attn_func(q, q, q).grad_fn is not None


def test_gradient_is_once_differentiable():
    q = make((1, 8, 2, 32), "cpu", torch.float32, 41).requires_grad_()
    (dq,) = torch.autograd.grad(flash_attn_func(q, q, q).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        dq.sum().backward()


# ---- errors ------------------------------------------------------------------------------------


def test_bad_block_table_and_dropout_raise_value_error():
    q = make((1, 8, 2, 32), "cpu", torch.float32, 50)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    # Paged K/V is built (test_kvcache.py); packed (not paged) K with a block_table is an error.
    with pytest.raises(ValueError, match="block_table"):
        flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8, block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_func(q, q, q, dropout_p=1.5)


@pytest.mark.parametrize(
    "options,error,message",
    [
        ({"alibi_slopes": torch.ones(3)}, ValueError, r"alibi_slopes.shape: expected \(heads_q,\)"),
        ({"alibi_slopes": torch.ones(2, 2)}, ValueError, r"alibi_slopes.shape: expected \(batch, heads_q\)"),
        ({"alibi_slopes": torch.ones(2, dtype=torch.float64)}, TypeError, "alibi_slopes.dtype"),
        ({"alibi_slopes": [0.5, 0.5]}, TypeError, "alibi_slopes: expected a torch.Tensor"),
        ({"alibi_slopes": torch.tensor([0.5, float("nan")])}, ValueError, "finite"),
        ({"window_size": (1, 2, 3)}, ValueError, "window_size"),
        ({"window_size": (1.5, 2)}, TypeError, r"window_size\[0\]"),
        ({"window_size": (torch.tensor(1.0), 2)}, TypeError, r"window_size\[0\]"),
    ],
    ids=["alibi-heads", "alibi-batch", "alibi-dtype", "alibi-list", "alibi-nan", "window-len", "window-float",
         "window-float-tensor"],
)
def test_bad_options_raise(options, error, message):
    q = make((1, 8, 2, 32), "cpu", torch.float32, 52)
    with pytest.raises(error, match=message):
        flash_attn_func(q, q, q, **options)


@pytest.mark.parametrize("config", CONFIGS[:1] + CONFIGS[2:3], ids=(CONFIG_IDS[:1] + CONFIG_IDS[2:3]))
def test_flash_attn_window_rules(config):
    """flash-attn's window arguments: causal sets the right size to 0 whatever is given; a size that
    is negative or >= seqlen_k is unbounded; sizes may be 0-d tensors (its tests pass
    torch.randint(0, seqlen, (2,)), unpacked)."""
    device, dtype, d = config
    require_kernels(device, dtype, d)
    q = make((2, 40, 4, d), device, dtype, 53)
    k, v = make((2, 25, 2, d), device, dtype, 54), make((2, 25, 2, d), device, dtype, 55)
    same = dict(rtol=0, atol=0)
    causal_left = flash_attn_func(q, k, v, causal=True, window_size=(7, 0))
    torch.testing.assert_close(flash_attn_func(q, k, v, causal=True, window_size=(7, 11)), causal_left, **same)
    torch.testing.assert_close(flash_attn_func(q, k, v, causal=True, window_size=(7, -1)), causal_left, **same)
    window = torch.tensor([7, 11])
    torch.testing.assert_close(flash_attn_func(q, k, v, causal=True, window_size=window), causal_left, **same)
    left, right = torch.tensor(7), torch.tensor(3)
    torch.testing.assert_close(
        flash_attn_func(q, k, v, window_size=(left, right)), flash_attn_func(q, k, v, window_size=(7, 3)), **same
    )
    full = flash_attn_func(q, k, v)
    # seqlen_q 40 > seqlen_k 25: a right size of 25 would cut the first rows, but flash-attn
    # calls every size >= seqlen_k unbounded.
    for w in [(-1, 25), (25, 30), (-5, -2), (2**40, 2**40)]:
        torch.testing.assert_close(flash_attn_func(q, k, v, window_size=w), full, **same)


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_alibi_against_pytorch(config, causal):
    """ALiBi with variable length: each sequence's own lengths; slopes (batch, heads)."""
    device, dtype, d = config
    require_kernels(device, dtype, d)
    lengths_q, lengths_k = [5, 0, 33, 20, 17], [9, 3, 33, 7, 40]
    cu_q, cu_k = cu_seqlens(lengths_q, device), cu_seqlens(lengths_k, device)
    offsets_q, offsets_k = cu_q.tolist(), cu_k.tolist()
    hq, hk = 4, 2
    slopes = torch.rand(len(lengths_q), hq, generator=torch.Generator().manual_seed(5)).to(device)
    q = make((sum(lengths_q), hq, d), device, dtype, 15).requires_grad_()
    k, v = (make((sum(lengths_k), hk, d), device, dtype, 16 + i).requires_grad_() for i in range(2))
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                 alibi_slopes=slopes)  # fmt: skip
    dout = make(out.shape, device, dtype, 18)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    outs = []
    for b in range(len(lengths_q)):
        rq, rk = slice(offsets_q[b], offsets_q[b + 1]), slice(offsets_k[b], offsets_k[b + 1])
        o, _ = attention(ref_in[0][None, rq], ref_in[1][None, rk], ref_in[2][None, rk], causal=causal,
                         alibi_slopes=slopes[b : b + 1])  # fmt: skip
        outs.append(o[0])
    ref_out = torch.cat(outs)
    ref_grads = torch.autograd.grad(ref_out, ref_in, dout.double())
    assert rel_err(out, ref_out) < {torch.float32: 1e-5}.get(dtype, 1e-2)
    for g, r in zip(grads, ref_grads):
        assert rel_err(g, r) < {torch.float32: 1e-5}.get(dtype, 2e-2)
    assert slopes.grad is None


@pytest.mark.parametrize("config", CONFIGS[:1] + CONFIGS[2:3], ids=(CONFIG_IDS[:1] + CONFIG_IDS[2:3]))
def test_alibi_in_every_function(config):
    """The packed variants pass alibi_slopes through (and the slopes get no gradient)."""
    device, dtype, d = config
    require_kernels(device, dtype, d)
    qkv = make((2, 19, 3, 4, d), device, dtype, 22)
    q, k, v = qkv.unbind(2)
    slopes = torch.tensor([0.1, 0.2, 0.4, 0.8], device=device, requires_grad=True)
    expected = flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    assert not torch.equal(expected, flash_attn_func(q, k, v, causal=True)), "the slopes change the result"
    torch.testing.assert_close(flash_attn_qkvpacked_func(qkv, causal=True, alibi_slopes=slopes), expected)
    torch.testing.assert_close(flash_attn_kvpacked_func(q, qkv[:, :, 1:], causal=True, alibi_slopes=slopes), expected)
    packed = qkv.flatten(0, 1)
    cu = torch.tensor([0, 19, 38], dtype=torch.int32, device=device)
    out = flash_attn_varlen_qkvpacked_func(packed, cu, 19, causal=True, alibi_slopes=slopes)
    torch.testing.assert_close(out, expected.flatten(0, 1))
    kv = packed[:, 1:]
    out = flash_attn_varlen_kvpacked_func(packed[:, 0], kv, cu, cu, 19, 19, causal=True, alibi_slopes=slopes)
    torch.testing.assert_close(out, expected.flatten(0, 1))
    qkv.requires_grad_()
    flash_attn_qkvpacked_func(qkv, causal=True, alibi_slopes=slopes).sum().backward()
    assert qkv.grad is not None and slopes.grad is None


@pytest.mark.parametrize(
    "make_args,error,message",
    [
        (lambda q: (q[0], q[0], q[0]), ValueError, "q: expected 4 dimensions"),
        (lambda q: (q, q[:, :, :1], q), ValueError, r"v.shape\[2\] \(heads_kv\)"),
        (lambda q: (q, q[:, :5], q), ValueError, "seqlen_k"),
        (lambda q: (q.double(), q, q), TypeError, "q.dtype: expected f32, f16 or bf16, got torch.float64"),
        (lambda q: (q, q.half(), q.half()), TypeError, "k.dtype"),
        (lambda q: (q, q.numpy(), q), TypeError, "k: expected a torch.Tensor"),
        (lambda q: (q.to_sparse(), q, q), TypeError, "q.layout"),
    ],
    ids=["rank", "heads", "seqlen", "dtype", "dtype-mismatch", "not-a-tensor", "sparse"],
)
def test_bad_input_raises_the_library_message(make_args, error, message):
    q = make((1, 8, 2, 32), "cpu", torch.float32, 51)
    with pytest.raises(error, match=message):
        flash_attn_func(*make_args(q))


def test_opcheck():
    """torch.library's own checks of the custom ops: schema, fake tensors, autograd, AOT dispatch."""
    ops = torch.ops.flashattn
    q, k, v = (make((2, 9, 4, 16), "cpu", torch.float32, 60 + i).requires_grad_() for i in range(3))
    for slopes in (None, torch.tensor([0.5, 0.25, 0.125, 0.0625])):
        args = (q, k, v, None, None, None, slopes, 0, 0, 0.0, None, True, -1, 0, 0.0, False)
        torch.library.opcheck(ops.forward.default, args)
        out, lse = ops.forward(*args)
        tensors = (torch.randn_like(out), q, k, v, out, lse)  # the backward op has no gradient itself
        torch.library.opcheck(ops.backward.default, tuple(t.detach() for t in tensors) + args[3:])


# ---- CUDA specifics --------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU and a CUDA build of flashattn")
def test_cuda_lse_is_contiguous_for_odd_seqlens():
    """The LSE is written element by element: an odd seqlen_q needs no padded rows."""
    require_kernels("cuda", torch.bfloat16, 64)
    q = make((2, 9, 3, 64), "cuda", torch.bfloat16, 71)
    _, lse, _ = flash_attn_func(q, q, q, return_attn_probs=True)
    assert lse.shape == (2, 3, 9) and lse.is_contiguous()


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU and a CUDA build of flashattn")
def test_cuda_runs_on_the_current_stream():
    """Work queued on a side stream before the call must be seen: the call runs on that stream."""
    require_kernels("cuda", torch.bfloat16, 64)
    q = make((2, 128, 4, 64), "cuda", torch.bfloat16, 70)
    expected = flash_attn_func(q, q, q)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    fresh = torch.empty_like(q)
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # keeps the side stream busy before it writes `fresh`
        fresh.copy_(q)
        out = flash_attn_func(fresh, fresh, fresh)
    side.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available() or flashattn.built_with_cuda(), reason="needs a CPU-only build on a GPU machine")
def test_cuda_tensors_without_cuda_build():
    q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="no CUDA backend"):
        flash_attn_func(q, q, q)
