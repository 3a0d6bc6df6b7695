"""Dropout in flashattn.torch: against a float64 PyTorch attention that drops the same entries,
reproducibility from torch.manual_seed, flash-attn's S_dmask (return_attn_probs=True), the Python
and C++ random streams against each other, torch.compile; on CUDA tensors where there is a GPU (the
GPU must drop exactly what the CPU drops for the same seed and offset)."""
import math

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import _dropout  # noqa: E402
from flashattn.torch import (  # noqa: E402
    flash_attn_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
)
from torch_reference import rel_err, visible  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and flashattn.built_with_cuda()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
DTYPE = {"cpu": torch.float32, "cuda": torch.bfloat16}
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def make(shape, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(device=device, dtype=DTYPE[device])


def drawn_state(seed, device):
    """The (seed, offset) a call draws after torch.manual_seed(seed) (flashattn/torch.py)."""
    torch.manual_seed(seed)
    return [int(x) for x in torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device).tolist()]


def keep_masks(state, batch, nheads, rows, cols, p, device):
    """(batch, nheads, rows, cols) bool from the Python stream."""
    return torch.stack(
        [
            torch.stack([_dropout.keep_mask(state[0], state[1], b, nheads, h, rows, cols, p, device) for h in range(nheads)])
            for b in range(batch)
        ]
    )


def reference(q, k, v, keep, p, causal=False, window_size=(-1, -1)):
    """float64 attention with dropout mask `keep` (b, h, sq, sk); differentiable."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.transpose(1, 2).repeat_interleave(hq // hk, dim=1)
    vt = v.transpose(1, 2).repeat_interleave(hq // hk, dim=1)
    mask = visible(sq, sk, causal, window_size, q.device)
    raw = ((qt @ kt.transpose(-1, -2)) / math.sqrt(d)).masked_fill(~mask, float("-inf"))
    seen = mask.any(dim=1)
    prob = torch.softmax(raw.masked_fill(~seen[:, None], 0.0), dim=-1) * seen[:, None]
    out = (prob * keep / (1 - p)) @ vt
    return out.transpose(1, 2)


CASES = [
    dict(batch=2, sq=70, sk=90, hq=4, hk=2, causal=False, window_size=(-1, -1), p=0.17),
    dict(batch=1, sq=129, sk=64, hq=2, hk=2, causal=True, window_size=(-1, -1), p=0.3),
    dict(batch=1, sq=100, sk=150, hq=3, hk=1, causal=False, window_size=(20, 5), p=0.5),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=["gqa", "causal-q>k", "window-mqa"])
def test_matches_reference_with_the_same_mask(device, case):
    d = 64
    q = make((case["batch"], case["sq"], case["hq"], d), device, 1).requires_grad_()
    k = make((case["batch"], case["sk"], case["hk"], d), device, 2).requires_grad_()
    v = make((case["batch"], case["sk"], case["hk"], d), device, 3).requires_grad_()
    dout = make(q.shape, device, 4)
    p = case["p"]
    torch.manual_seed(1234)
    out = flash_attn_func(q, k, v, dropout_p=p, causal=case["causal"], window_size=case["window_size"])
    grads = torch.autograd.grad(out, (q, k, v), dout)
    keep = keep_masks(drawn_state(1234, device), case["batch"], case["hq"], case["sq"], case["sk"], p, "cpu")
    ref_in = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    ref_out = reference(*ref_in, keep, p, case["causal"], case["window_size"])
    ref_grads = torch.autograd.grad(ref_out, ref_in, dout.cpu().double())
    tol = TOL[DTYPE[device]]
    assert rel_err(out.cpu(), ref_out) < tol
    for g, r in zip(grads, ref_grads):
        assert rel_err(g.cpu(), r) < 2 * tol


@pytest.mark.parametrize("device", DEVICES)
def test_manual_seed_reproduces_a_run(device):
    q, k, v = (make((2, 50, 2, 32), device, s) for s in (5, 6, 7))
    torch.manual_seed(7)
    a = flash_attn_func(q, k, v, dropout_p=0.2)
    b = flash_attn_func(q, k, v, dropout_p=0.2)  # the generator moved on: another mask
    torch.manual_seed(7)
    c = flash_attn_func(q, k, v, dropout_p=0.2)
    assert torch.equal(a, c)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_attn_probs_decode_as_flash_attn_tests_do(device):
    """S_dmask: sign = the mask; magnitude * exp(running block max - LSE) = P (flash-attn's tests
    normalize it so); the dropped fraction is about p."""
    batch, s, h, d, p = 2, 300, 2, 64, 0.17
    qkv = make((batch, s, 3, h, d), device, 8)
    torch.manual_seed(99)
    out, lse, s_dmask = flash_attn_qkvpacked_func(qkv, dropout_p=p, causal=True, return_attn_probs=True)
    assert s_dmask.shape == (batch, h, 384, 384)
    keep = keep_masks(drawn_state(99, device), batch, h, s, s, p, "cpu")
    sd = s_dmask[:, :, :s, :s].float().cpu()
    causal = visible(s, s, causal=True)
    assert torch.equal((sd >= 0) | ~causal, keep | ~causal)  # masked entries are 0 (counted as kept)
    dropped = (~keep & causal).sum().item() / (causal.sum().item() * batch * h)
    assert abs(dropped - p) < 0.01
    # Normalized magnitudes are the softmax.
    q, k = qkv[:, :, 0].float().cpu(), qkv[:, :, 1].float().cpu()
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~causal, float("-inf"))
    block_n = _dropout._flash_attn_block_n(d)
    blocks = scores.split(block_n, dim=-1)
    bmax = torch.stack([x.amax(-1) for x in blocks], -1)
    running = torch.cummax(bmax.flip(-1), -1).values.flip(-1)
    lse_ref = torch.logsumexp(scores, -1)
    norm = torch.cat([a * torch.exp(m[..., None] - lse_ref[..., None])
                      for a, m in zip(sd.abs().split(block_n, -1), running.unbind(-1))], -1)  # fmt: skip
    assert rel_err(norm, torch.softmax(scores, -1)) < (1e-5 if device == "cpu" else 1e-2)
    assert rel_err(lse.cpu(), lse_ref) < 1e-5


def test_without_dropout_attn_probs_are_none():
    q = make((1, 8, 2, 32), "cpu", 9)
    assert flash_attn_func(q, q, q, return_attn_probs=True)[2] is None


def test_python_stream_matches_the_cpu_backend():
    """q = 0 (uniform weights) and V row j = e_j: out[b, i, h, j] != 0 iff key j is kept."""
    batch, sq, sk, h, p = 2, 40, 50, 3, 0.4
    q = torch.zeros(batch, sq, h, 64)
    k = make((batch, sk, 1, 64), "cpu", 10)
    v = torch.eye(sk, 64).view(1, sk, 1, 64).expand(batch, sk, 1, 64).contiguous()
    out = torch.empty_like(q)
    seed, offset = 0xDEADBEEF12345, 2**32 - 64  # the counter's low word carries within the call
    flashattn.forward(q, k, v, out, dropout_p=p, dropout_seed=seed, dropout_offset=offset)
    kept = out[..., :sk].permute(0, 2, 1, 3) != 0
    assert torch.equal(kept, keep_masks((seed, offset), batch, h, sq, sk, p, "cpu"))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU and a CUDA build of flashattn")
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_drops_what_the_cpu_drops(causal):
    batch, sq, sk, h, p = 2, 300, 120, 3, 0.17
    q = torch.zeros(batch, sq, h, 128, dtype=torch.bfloat16)
    k = make((batch, sk, 1, 128), "cpu", 11).to(torch.bfloat16)
    v = torch.eye(sk, 128).view(1, sk, 1, 128).expand(batch, sk, 1, 128).contiguous().to(torch.bfloat16)
    state = torch.tensor([0x1234567, 2**33 + 5], dtype=torch.int64)
    outs = []
    for device in ("cpu", "cuda"):
        out = torch.empty_like(q, device=device)
        flashattn.forward(q.to(device), k.to(device), v.to(device), out, causal=causal, dropout_p=p,
                          dropout_state=state.to(device))  # fmt: skip
        outs.append((out[..., :sk] != 0).cpu())
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_matches_reference(device):
    lens_q, lens_k, h, d, p = [17, 0, 40], [30, 5, 40], 2, 32, 0.25
    cu_q = torch.tensor([0, 17, 17, 57], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 30, 35, 75], dtype=torch.int32, device=device)
    q = make((57, h, d), device, 12)
    k, v = make((75, h, d), device, 13), make((75, h, d), device, 14)
    torch.manual_seed(5)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 40, 40, dropout_p=p, causal=True)
    seed, offset = drawn_state(5, device)
    for b in range(3):
        q0, q1, k0, k1 = cu_q[b].item(), cu_q[b + 1].item(), cu_k[b].item(), cu_k[b + 1].item()
        if q1 == q0:
            continue
        keep = torch.stack([_dropout.keep_mask(seed, offset, b, h, hh, q1 - q0, k1 - k0, p, "cpu") for hh in range(h)])
        ref = reference(*(x.cpu().double()[None] for x in (q[q0:q1], k[k0:k1], v[k0:k1])), keep[None], p, causal=True)
        assert rel_err(out[q0:q1].cpu(), ref[0]) < TOL[DTYPE[device]]


def test_compiled_matches_eager_on_the_cpu():
    """aot_eager draws the (seed, offset) from the same generator as eager: the same mask."""
    q, k, v = (make((2, 30, 2, 32), "cpu", s).requires_grad_() for s in (15, 16, 17))

    def f(q, k, v):
        return flash_attn_func(q, k, v, dropout_p=0.3, causal=True)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.manual_seed(3)
    eager = f(q, k, v)
    g_eager = torch.autograd.grad(eager.sum(), (q, k, v))
    torch.manual_seed(3)
    ours = compiled(q, k, v)
    g_ours = torch.autograd.grad(ours.sum(), (q, k, v))
    assert torch.equal(eager, ours)
    for a, b in zip(g_eager, g_ours):
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU and a CUDA build of flashattn")
def test_cuda_graph_replays_draw_new_masks():
    q, k, v = (make((1, 64, 2, 64), "cuda", s) for s in (18, 19, 20))
    static_out = flash_attn_func(q, k, v, dropout_p=0.5)  # warm-up (kernels loaded)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attn_func(q, k, v, dropout_p=0.5)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = flash_attn_func(q, k, v, dropout_p=0.5)
    graph.replay()
    first = static_out.clone()
    graph.replay()
    assert torch.isfinite(first.float()).all()
    assert not torch.equal(first, static_out)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU and a CUDA build of flashattn")
def test_cuda_dropout_with_softcap_is_not_implemented():
    q = make((1, 16, 2, 64), "cuda", 21)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attn_func(q, q, q, dropout_p=0.1, softcap=5.0)


def test_bad_dropout_arguments():
    q = make((1, 8, 2, 32), "cpu", 22)
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_func(q, q, q, dropout_p=1.0)
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_func(q, q, q, dropout_p=-0.1)
    with pytest.raises(TypeError, match="dropout_p"):
        flash_attn_func(q, q, q, dropout_p="0.1")
    out = torch.empty_like(q)
    with pytest.raises(TypeError, match="dropout_state.dtype"):
        flashattn.forward(q, q, q, out, dropout_p=0.1, dropout_state=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="dropout_state.shape"):
        flashattn.forward(q, q, q, out, dropout_p=0.1, dropout_state=torch.zeros(3, dtype=torch.int64))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU and a CUDA build of flashattn")
def test_compiled_on_the_gpu_is_reproducible():
    """inductor draws the (seed, offset) with its own random ops: not eager's numbers, but the same
    for the same torch.manual_seed, and fullgraph (no graph break)."""
    q, k, v = (make((2, 100, 4, 64), "cuda", s).requires_grad_() for s in (23, 24, 25))

    def f(q, k, v):
        return flash_attn_func(q, k, v, dropout_p=0.2, causal=True)

    compiled = torch.compile(f, fullgraph=True)
    runs = []
    for _ in range(2):
        torch.manual_seed(11)
        out = compiled(q, k, v)
        runs.append((out, *torch.autograd.grad(out.float().sum(), (q, k, v))))
    for a, b in zip(*runs):
        assert torch.isfinite(a.float()).all()
        assert torch.equal(a, b)
