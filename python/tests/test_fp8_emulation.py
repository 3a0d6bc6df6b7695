"""python/benchmarks/fp8_accuracy.py, the emulation behind docs/kernels/fp8-forward.md: its transform
is orthogonal, its quantization rounds within e4m3's precision, and on outlier data its schemes
order as the document reports. Skipped where torch is missing (as in CI)."""
import math
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import fp8_accuracy as fp8  # noqa: E402


@pytest.mark.parametrize("d", [64, 128])
def test_hadamard_is_orthogonal(d):
    m = fp8.hadamard(d, torch.Generator().manual_seed(d), "cpu")
    assert torch.allclose(m @ m.T, torch.eye(d, dtype=torch.float64), atol=1e-12)
    assert not torch.allclose(m.abs(), m)  # the random signs are there


@pytest.mark.parametrize("block", [0, 16])
def test_quantize_rounds_within_e4m3_precision(block):
    g = torch.Generator().manual_seed(7)
    x = fp8.outlier_normal((2, 40, 3, 32), g, "cpu")  # 40 rows: a partial last block of 16
    values, scale = fp8.quantize(x, block)
    assert values.abs().max() <= fp8.E4M3_MAX
    back = values.double() * scale
    normal = x.abs() >= 2.0**-6 * scale  # e4m3's normal range: relative error <= 2^-4
    assert normal.float().mean() > 0.9
    assert ((back - x).abs() <= 2.0**-4 * x.abs() + 1e-12)[normal].all()
    if block:  # every block's largest value maps to the format's largest
        blocks = values.reshape(2, -1, 3, 32).abs()
        assert torch.isclose(blocks[:, :16].amax(dim=(1, 3)), torch.tensor(fp8.E4M3_MAX)).all()


def test_block_quantization_with_hadamard_beats_per_tensor_on_outliers():
    g = torch.Generator().manual_seed(3)
    q, k, v = (fp8.outlier_normal((1, 256, 2, 64), g, "cpu") for _ in range(3))
    scale = 1 / math.sqrt(64)
    ref = fp8.attention_reference(q, k, v, scale)
    per_tensor = fp8.rmse(fp8.attention_fp8(q, k, v, scale, 0), ref)
    block_hadamard = fp8.rmse(fp8.attention_fp8(q, k, v, scale, 64, fp8.hadamard(64, g, "cpu")), ref)
    bf16 = fp8.rmse(fp8.attention_bf16(q, k, v, scale), ref)
    assert bf16 < block_hadamard < per_tensor
    assert per_tensor / block_hadamard > 1.3


def test_p_shift_cancels_and_transform_on_v_is_undone():
    # With P kept in fp32, scaling it by 2^8 changes nothing (the row sums carry the same factor);
    # the transform applied to V is undone on O (up to the rounding of V).
    g = torch.Generator().manual_seed(5)
    q, k, v = (fp8.outlier_normal((1, 96, 2, 64), g, "cpu") for _ in range(3))
    scale = 1 / math.sqrt(64)
    m = fp8.hadamard(64, g, "cpu")
    plain = fp8.attention_fp8(q, k, v, scale, 32, m, p_dtype=torch.float32)
    shifted = fp8.attention_fp8(q, k, v, scale, 32, m, p_shift=8, p_dtype=torch.float32)
    assert torch.allclose(plain, shifted, rtol=1e-2, atol=1e-3)
    ref = fp8.attention_reference(q, k, v, scale)
    with_v = fp8.attention_fp8(q, k, v, scale, 32, m, transform_v=True, p_dtype=torch.float32)
    assert fp8.rmse(with_v, ref) < 2 * fp8.rmse(plain, ref)
