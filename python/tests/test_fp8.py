"""The FP8 (e4m3) forward through flashattn.torch and its quantization helpers (flashattn.fp8):
the helpers' transform is orthogonal and their rounding within e4m3's precision (CPU); on a Hopper
GPU, every output element of flash_attn_func / flash_attn_varlen_func on e4m3 inputs within the
bound of P's rounding against float64 attention on the dequantized inputs (tests/support/harness.hpp
derives it), torch.compile, and the errors for what FP8 leaves out."""
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn.fp8 import BLOCK_ROWS, E4M3_MAX, hadamard_signs, quantize_e4m3  # noqa: E402
from flashattn.torch import flash_attn_func, flash_attn_varlen_func  # noqa: E402

HOPPER = (
    torch.cuda.is_available()
    and flashattn.built_with_cuda()
    and torch.cuda.get_device_capability() == (9, 0)
)


def fp8_forward_built() -> bool:
    """Whether this build has e4m3 kernels up to head dim 256 (FLASHATTN_DTYPES has e4m3)."""
    if not HOPPER:
        return False
    x = torch.zeros(1, 1, 1, 256, dtype=torch.float8_e4m3fn, device="cuda")
    try:
        flash_attn_func(x, x, x)
    except NotImplementedError as e:
        if "built" in str(e):
            return False
        raise
    return True


needs_hopper = pytest.mark.skipif(not fp8_forward_built(),
                                  reason="the FP8 forward runs on Hopper, in builds with e4m3 kernels up to head dim 256")


def normal(shape, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(device)


def hadamard(signs):
    """H diag(signs) / sqrt(d) as a float64 matrix (Sylvester's construction)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < signs.numel():
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h * signs.double().cpu()[:, None]) / signs.numel() ** 0.5


@pytest.mark.parametrize("head_dim", [16, 64, 256])
def test_incoherent_quantization(head_dim):
    """The transform is the orthogonal H diag(signs) / sqrt(d): QK^T is unchanged, and the e4m3
    values times their factors are x M within e4m3's rounding."""
    q, k = normal((2, 5, 4, head_dim), 1), normal((2, 7, 4, head_dim), 2)
    signs = hadamard_signs(head_dim, seed=3)
    m = hadamard(signs)
    assert torch.allclose(m @ m.T, torch.eye(head_dim, dtype=torch.float64), atol=1e-12)
    (q8, qd), (k8, kd) = quantize_e4m3(q, signs=signs), quantize_e4m3(k, signs=signs)
    for x, x8, d in ((q, q8, qd), (k, k8, kd)):
        exact = x.double() @ m
        back = x8.double() * d.double()[:, None, :, None]
        assert ((back - exact).abs() <= 2.0**-4 * exact.abs() + 2.0**-9 * d.double().amax() + 1e-5).all()
    with pytest.raises(ValueError, match="power of two"):
        hadamard_signs(80)


@pytest.mark.parametrize("scales", ["per_head", "per_tensor", "per_block"])
def test_quantize_rounds_within_e4m3_precision(scales):
    x = normal((2, BLOCK_ROWS + 9, 8, 32), 4) * 3
    x[1, BLOCK_ROWS + 3, 5, 7] = 300.0  # an outlier in the second block: only its factor follows it
    x8, descale = quantize_e4m3(x, heads_kv=2, per_tensor=scales == "per_tensor", per_block=scales == "per_block")
    assert x8.dtype == torch.float8_e4m3fn and descale.dtype == torch.float32
    assert descale.shape == {"per_tensor": (1,), "per_head": (2, 2), "per_block": (2, 2, 2)}[scales]
    if scales == "per_block":
        assert descale[1, 1, 1] > 10 * descale[1, 1, 0]
    factor = factors(descale, x.shape)
    back = x8.float() * factor
    normal_range = x.abs() >= 2.0**-6 * factor  # e4m3's normals: relative error <= 2^-4
    assert ((back - x).abs() <= 2.0**-4 * x.abs() + 1e-7)[normal_range].all()
    assert (x8.float().abs().amax() <= E4M3_MAX) and (x8.float().abs().amax() >= E4M3_MAX * 0.9)


def reference(q, k, v, causal, softmax_scale=None):
    """float64 attention (batch, seqlen, heads, d), GQA by repeating K/V heads, bottom-right causal."""
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        nq, nk = q.shape[1], k.shape[1]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees no key: output 0
    return torch.einsum("bhqk,bkhd->bqhd", p, v), torch.einsum("bhqk,bkhd->bqhd", p, v.abs())


def factors(descale, shape):
    """The factor of every element of a (batch, seqlen, heads, d) tensor, broadcastable to it."""
    if descale.numel() == 1:
        return descale.reshape(1, 1, 1, 1)
    per_head = descale.repeat_interleave(shape[2] // descale.shape[1], dim=1)  # (batch, heads[, blocks])
    if descale.dim() == 2:
        return per_head[:, None, :, None]
    rows = per_head.repeat_interleave(BLOCK_ROWS, dim=2)[:, :, : shape[1]]  # (batch, heads, seqlen)
    return rows.permute(0, 2, 1)[..., None]


def dequantized(x8, descale, heads):
    return x8.double() * factors(descale.double(), x8.shape)


def within_bound(out, q8, k8, v8, descales, causal):
    """Every element within (2^-4 + 1e-3) * sum_j p_j |v_j| + 2^-8 |ref| (harness.hpp's bound)."""
    heads = q8.shape[2]
    q, k, v = (dequantized(t, d, t.shape[2]) for t, d in zip((q8, k8, v8), descales))
    ref, weight = reference(q, k, v, causal)
    bound = (2.0**-4 + 1e-3) * weight + 2.0**-8 * ref.abs()
    err = (out.double() - ref).abs()
    assert heads == out.shape[2]
    assert (err[bound == 0] == 0).all()  # rows that see no key are exactly 0
    return (err[bound > 0] / bound[bound > 0]).max().item()


@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("scales", ["per_head", "per_tensor", "per_block"])
def test_fp8_forward_matches_float64(causal, head_dim, scales):
    q, k, v = normal((2, 333, 8, head_dim), 5, "cuda"), normal((2, 300, 2, head_dim), 6, "cuda"), normal((2, 300, 2, head_dim), 7, "cuda")
    per_tensor, per_block = scales == "per_tensor", scales == "per_block"  # V: no blocks
    (q8, qd), (k8, kd), (v8, vd) = (quantize_e4m3(q, heads_kv=2, per_tensor=per_tensor, per_block=per_block),
                                    quantize_e4m3(k, per_tensor=per_tensor, per_block=per_block),
                                    quantize_e4m3(v, per_tensor=per_tensor))
    out, lse, _ = flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd,
                                  return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and lse.shape == (2, 8, 333)
    assert within_bound(out, q8, k8, v8, (qd, kd, vd), causal) <= 1.0


@needs_hopper
def test_fp8_varlen_and_incoherent_processing():
    lens = [100, 1, 257]
    cu = torch.tensor([0, 100, 101, 358], dtype=torch.int32, device="cuda")
    q, k, v = (normal((358, 4, 128), s, "cuda") for s in (8, 9, 10))
    signs = hadamard_signs(128, seed=1, device="cuda")
    # Per-tensor scales over the packed tensors: the helper's (batch, seqlen, ...) view with batch 1.
    (q8, qd), (k8, kd), (v8, vd) = (quantize_e4m3(q[None], signs=signs, per_tensor=True),
                                    quantize_e4m3(k[None], signs=signs, per_tensor=True),
                                    quantize_e4m3(v[None], per_tensor=True))
    out = flash_attn_varlen_func(q8[0], k8[0], v8[0], cu, cu, max(lens), max(lens), causal=True,
                                 q_descale=qd, k_descale=kd, v_descale=vd)
    # Against float64 attention on what the e4m3 values stand for (the transformed Q and K: the
    # transform leaves the attention unchanged: test_incoherent_quantization).
    qf, kf, vf = (t[0].double() * d.double() for t, d in ((q8, qd), (k8, kd), (v8, vd)))
    for start, n in zip([0, 100, 101], lens):
        rows = slice(start, start + n)
        ref, weight = reference(qf[None, rows], kf[None, rows], vf[None, rows], True)
        bound = (2.0**-4 + 1e-3) * weight + 2.0**-8 * ref.abs()
        assert ((out[None, rows].double() - ref).abs() <= bound).all(), (start, n)


@needs_hopper
def test_fp8_varlen_per_block():
    """Block quantization of packed sequences: each sequence quantized on its own, its blocks
    counted from its first row, in a (batch, heads_kv, blocks of the longest) descale."""
    lens, starts = [100, 1, 257], [0, 100, 101]
    cu = torch.tensor([0, 100, 101, 358], dtype=torch.int32, device="cuda")
    q, k, v = (normal((358, 4, 128), s, "cuda") for s in (17, 18, 19))
    blocks = (max(lens) + BLOCK_ROWS - 1) // BLOCK_ROWS
    q8, k8 = torch.empty_like(q, dtype=torch.float8_e4m3fn), torch.empty_like(k, dtype=torch.float8_e4m3fn)
    qd, kd = (torch.full((3, 4, blocks), float("nan"), device="cuda") for _ in range(2))  # unused blocks: NaN
    for b, (start, n) in enumerate(zip(starts, lens)):
        for x, x8, d in ((q, q8, qd), (k, k8, kd)):
            part8, part_d = quantize_e4m3(x[None, start : start + n], per_block=True)
            x8[start : start + n], d[b, :, : part_d.shape[2]] = part8[0], part_d[0]
    v8, vd = quantize_e4m3(v[None], per_tensor=True)
    out = flash_attn_varlen_func(q8, k8, v8[0], cu, cu, max(lens), max(lens), causal=True,
                                 q_descale=qd, k_descale=kd, v_descale=vd)
    for b, (start, n) in enumerate(zip(starts, lens)):
        rows = slice(start, start + n)
        qf, kf = (dequantized(x8[None, rows], d[b : b + 1, :, : (n + BLOCK_ROWS - 1) // BLOCK_ROWS], 4)
                  for x8, d in ((q8, qd), (k8, kd)))
        ref, weight = reference(qf, kf, v8[:, rows].double() * vd.double(), True)
        bound = (2.0**-4 + 1e-3) * weight + 2.0**-8 * ref.abs()
        assert ((out[None, rows].double() - ref).abs() <= bound).all(), (start, n)


@pytest.mark.skipif(not torch.cuda.is_available() or not flashattn.built_with_cuda(), reason="needs a CUDA build and GPU")
@pytest.mark.parametrize("per_tensor,per_block,transform",
                         [(False, False, False), (True, False, True), (False, False, True), (False, True, True)])
def test_quantize_gives_the_same_bits_on_cpu_and_cuda(per_tensor, per_block, transform):
    x = (normal((3, 277, 8, 128), 16) * 5).to(torch.bfloat16)
    signs = hadamard_signs(128, seed=2) if transform else None
    cpu = quantize_e4m3(x, heads_kv=2, signs=signs, per_tensor=per_tensor, per_block=per_block)
    gpu = quantize_e4m3(x.cuda(), heads_kv=2, signs=None if signs is None else signs.cuda(), per_tensor=per_tensor,
                        per_block=per_block)
    assert torch.equal(cpu[1], gpu[1].cpu())
    assert torch.equal(cpu[0].view(torch.uint8), gpu[0].cpu().view(torch.uint8))


@needs_hopper
def test_fp8_compiles_without_graph_breaks():
    q8, qd = quantize_e4m3(normal((1, 256, 4, 128), 11, "cuda"))
    k8, kd = quantize_e4m3(normal((1, 256, 4, 128), 12, "cuda"))
    v8, vd = quantize_e4m3(normal((1, 256, 4, 128), 13, "cuda"))
    f = torch.compile(lambda *a: flash_attn_func(*a[:3], causal=True, q_descale=a[3], k_descale=a[4], v_descale=a[5]),
                      fullgraph=True)
    eager = flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    assert torch.equal(f(q8, k8, v8, qd, kd, vd), eager)


def test_fp8_errors():
    q = normal((1, 16, 2, 64), 14).to(torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="CUDA backend"):
        flash_attn_func(q, q, q)  # CPU tensors
    with pytest.raises(NotImplementedError, match="dropout"):
        flash_attn_func(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="e4m3"):
        x = normal((1, 16, 2, 64), 15)
        flash_attn_func(x, x, x, q_descale=torch.ones(1))
