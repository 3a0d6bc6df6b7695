"""torch.compile(fullgraph=True) traces models that use flashattn.torch without graph breaks, and
the compiled model computes what the eager one does, gradients included."""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

import flashattn  # noqa: E402
from flashattn.torch import flash_attn_func, flash_attn_varlen_func  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and flashattn.built_with_cuda()
# (device, dtype, backend): aot_eager on the CPU (fake tensors and AOT autograd, no code
# generation), inductor on the GPU.
SETUPS = [("cpu", torch.float32, "aot_eager")] + ([("cuda", torch.bfloat16, "inductor")] if HAS_CUDA else [])
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


class Block(nn.Module):
    """A pre-norm transformer block whose attention is flash_attn_func."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).unbind(2)
        y = flash_attn_func(q, k, v, causal=True)
        x = x + self.proj(y.reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


def skip_without_kernels(device, dtype, head_dim):
    q = torch.randn(1, 4, 2, head_dim, device=device, dtype=dtype, requires_grad=True)
    try:
        flash_attn_func(q, q, q).sum().backward()
    except NotImplementedError as e:
        pytest.skip(str(e))


def run_with_grads(model, x):
    x = x.detach().clone().requires_grad_()
    out = model(x)
    out.float().square().mean().backward()
    return out, x.grad, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("setup", SETUPS, ids=[s[0] for s in SETUPS])
def test_compiled_block_matches_eager(setup):
    device, dtype, backend = setup
    skip_without_kernels(device, dtype, 64)
    torch.manual_seed(0)
    block = Block(256, 4).to(device=device, dtype=dtype)
    x = torch.randn(2, 47, 256, device=device, dtype=dtype)
    eager = run_with_grads(block, x)
    block.zero_grad()

    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = run_with_grads(torch.compile(block, backend=counter, fullgraph=True), x)
    assert counter.frame_count == 1, "one graph, no breaks"
    assert "flashattn.forward" in counter.graphs[0].code, "the custom op is in the graph"

    torch.testing.assert_close(compiled[0], eager[0], **TOLERANCE[dtype])
    torch.testing.assert_close(compiled[1], eager[1], **TOLERANCE[dtype])
    for got, want in zip(compiled[2], eager[2]):
        torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_dynamic_shapes_compile_once():
    """Sequence lengths that differ (odd and even) share one compiled graph."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    def attend(q, k, v):
        return flash_attn_func(q, k, v, causal=True, softcap=30.0) * 2

    compiled = torch.compile(attend, backend=counter, fullgraph=True, dynamic=True)
    for seqlen in (33, 47, 64):
        q, k, v = (torch.randn(2, seqlen, 4, 32, requires_grad=True) for _ in range(3))
        out = compiled(q, k, v)
        torch.testing.assert_close(out, attend(q, k, v), rtol=1e-6, atol=1e-6)
        out.sum().backward()
    assert counter.frame_count == 1


def test_compiled_alibi():
    """alibi_slopes is a tensor input of the custom ops: no graph break, no gradient."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])

    def attend(q, k, v):
        return flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes) * 2

    q, k, v = (torch.randn(2, 29, 4, 32, requires_grad=True) for _ in range(3))
    out = torch.compile(attend, backend=counter, fullgraph=True)(q, k, v)
    want = attend(q, k, v)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for g, w in zip(grads, torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    assert counter.frame_count == 1


def test_compiled_varlen():
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    cu = torch.tensor([0, 5, 12, 30], dtype=torch.int32)

    def attend(q, k, v):
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, 18, 18, causal=True, return_attn_probs=True)
        return out, lse

    q, k, v = (torch.randn(30, 4, 32, requires_grad=True) for _ in range(3))
    out, lse = torch.compile(attend, backend=counter, fullgraph=True)(q, k, v)
    want_out, want_lse = attend(q, k, v)
    torch.testing.assert_close(out, want_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    want = torch.autograd.grad(want_out.sum(), (q, k, v))
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    assert counter.frame_count == 1
