"""The fp8 scaling schemes' arithmetic (core/train/fp8_scaling.py) against float64 references
written out element by element; CPU only."""

from __future__ import annotations

import math

import pytest
import torch

from tunedeck.core.train import fp8_scaling as fs


def e4m3_round(v: float) -> float:
    """Nearest e4m3 value (ties to even mantissa), by hand: 3 mantissa bits, exponent ≥ -6,
    subnormals below 2^-6 in steps of 2^-9, largest 448."""
    a = abs(v)
    if a == 0:
        return 0.0
    e = max(math.floor(math.log2(a)), -6)
    step = 2.0 ** (e - 3)
    q = round(a / step) * step  # Python's round: ties to even
    return math.copysign(min(q, 448.0), v)


def test_quantize_matches_a_float64_reference_per_group():
    g = torch.Generator().manual_seed(3)
    t = torch.randn(4, 256, generator=g, dtype=torch.float64) * torch.logspace(-3, 3, 4)[:, None]
    t[1, 7] = 5e4  # a massive value in one tile of one row
    for group in ((1, 0), (1, 128), (2, 128)):
        q, inv = fs.quantize(t, group)
        gr, gc = group[0], group[1] or 256
        assert inv.shape == (4 // gr, 256 // gc)
        for i in range(4):
            for j in range(256):
                block = t[i - i % gr : i - i % gr + gr, j - j % gc : j - j % gc + gc]
                amax = float(block.abs().max())
                want = e4m3_round(float(t[i, j]) * 448.0 / amax)
                assert float(q[i, j]) == want, (group, i, j)
                assert float(inv[i // gr, j // gc]) == pytest.approx(amax / 448.0, rel=1e-15)
        back = fs.dequantize(q, inv)
        # each group's largest value comes back exactly-ish, the rest within e4m3's half step
        assert ((back - t).abs() <= t.abs() * 2**-4 + 2**-10 * inv.max()).all()


def test_finer_groups_protect_a_row_from_its_massive_channel():
    """e4m3 spans ~2^17 (448 down to 2^-9): one channel 10,000x the rest leaves the row's other
    values in range under a per-row scale; at 10^6x they flush to zero, while 1x128 tiles keep
    them outside the massive value's tile."""
    g = torch.Generator().manual_seed(0)
    t = torch.randn(1, 1024, generator=g, dtype=torch.float64)
    rest = torch.ones(1024, dtype=torch.bool)
    rest[:128] = False
    err = {}
    for massive in (1e4, 1e6):
        t[0, 3] = massive
        for group in ((1, 0), (1, 128)):
            back = fs.fake_quant(t, group)
            err[massive, group] = float((back[0, rest] - t[0, rest]).norm() / t[0, rest].norm())
    assert err[1e4, (1, 0)] < 0.1  # coarser steps (subnormal-near), not lost
    assert err[1e6, (1, 0)] > 0.9  # the rest of the row is gone
    assert err[1e4, (1, 128)] < 0.05 and err[1e6, (1, 128)] < 0.05


def test_product_is_an_fp32_accumulated_gemm_of_dequantized_operands():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(8, 256, generator=g, dtype=torch.float64)
    b = torch.randn(128, 256, generator=g, dtype=torch.float64)
    a[:, 5] *= 300.0  # an outlier input channel
    exact = a @ b.t()
    for scheme in fs.SCHEMES:
        got = fs.product(a, b, scheme)
        aq = fs.fake_quant(a.masked_fill(_keep(a, scheme), 0), scheme.a_group)
        bq = fs.fake_quant(b.masked_fill(_keep(a, scheme), 0), scheme.b_group)
        want = aq @ bq.t() + (a * _keep(a, scheme)) @ (b * _keep(a, scheme)).t()
        # fp32 accumulation and the bf16 output: within bf16's half ulp of the float64 product
        assert torch.allclose(got, want, rtol=2**-8, atol=1e-3 * float(want.abs().max()))
        assert float((got - exact).norm() / exact.norm()) < 0.1
    # bf16 (scheme None) is far closer to the exact product than any fp8 scheme
    e_bf16 = float((fs.product(a, b, None) - exact).norm() / exact.norm())
    assert e_bf16 < 0.01
    assert e_bf16 < min(
        float((fs.product(a, b, s) - exact).norm() / exact.norm()) for s in fs.SCHEMES
    )
    # keeping the outlier channel in bf16 beats plain per-row scaling on this input
    err = {s: float((fs.product(a, b, s) - exact).norm() / exact.norm()) for s in fs.SCHEMES}
    assert err[fs.ROWS_OUTLIERS] < err[fs.ROWS]


def _keep(a: torch.Tensor, scheme: fs.Scheme) -> torch.Tensor:
    keep = torch.zeros(a.shape[1], dtype=torch.bool)
    if scheme.outliers:
        keep[a.abs().amax(dim=0).topk(scheme.outliers).indices] = True
    return keep


def test_quantize_names_a_group_that_does_not_tile():
    with pytest.raises(ValueError, match="128x128 do not tile a 100x256"):
        fs.quantize(torch.zeros(100, 256), (128, 128))
