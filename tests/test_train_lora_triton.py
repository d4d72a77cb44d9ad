"""The Triton LoRA kernel (core/train/lora_triton.py) on the CPU, through Triton's interpreter:
its arithmetic against float64 at shapes that cut every tile, and the fused layers it runs
(TUNEDECK_LORA_EPILOGUE=triton) against peft's. Its speed is measured on the GPU
(bench/lora_triton.py, docs/benchmarks.md).

Triton picks interpreted or compiled kernels when triton.language is first imported, so each
check runs in a fresh interpreter started with TRITON_INTERPRET=1 (the test process keeps
Triton as it found it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from tunedeck.core.train import lora_fused, lora_triton


def _interpreted(check: str, *args) -> None:
    """Run this module's `check(*args)` in a fresh Python under TRITON_INTERPRET=1."""
    here = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(here), *filter(None, sys.path)]),
    }
    code = f"import {Path(__file__).stem} as t; t.{check}(*{args!r})"
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr[-4000:]


def _f64(*ts):
    return [t.double() for t in ts]


@pytest.mark.parametrize("mode", ["loop", "epilogue"])
@pytest.mark.parametrize("r", [4, 6, 16, 20])
def test_kernel_computes_the_lora_linear_and_its_input_gradient(r, mode):
    _interpreted("check_arithmetic", r, mode)


def check_arithmetic(r, mode):
    """y = x·Wᵀ + bias + s·(x·Aᵀ)·Bᵀ and u = x·Aᵀ; dx = dy·W + s·(dy·B)·A, dA, dB: fp32
    within 1e-5 of float64 at sizes no tile divides, ranks below, at and above 16 (the rank
    tile is masked and padded to a power of two)."""
    g = torch.Generator().manual_seed(r)
    n, k, m, s = 70, 90, 50, 1.7
    x, w = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g) / 10
    a, b = torch.randn(r, k, generator=g) / 10, torch.randn(m, r, generator=g) / 10
    bias, dy = torch.randn(m, generator=g), torch.randn(n, m, generator=g)
    y, u = lora_triton.lora_forward(x, w, bias, a, b, s, mode=mode)
    xd, wd, ad, bd, biasd, dyd = _f64(x, w, a, b, bias, dy)
    ud = xd @ ad.t()
    want = xd @ wd.t() + biasd + s * ud @ bd.t()
    assert (y.double() - want).norm() <= 1e-6 * want.norm()
    assert (u.double() - ud).norm() <= 1e-6 * ud.norm()

    dx, da, db = lora_triton.lora_backward(dy, x, w, a, b, u, s, mode=mode)
    gd = s * dyd @ bd
    for got, ref in ((dx, dyd @ wd + gd @ ad), (da, gd.t() @ xd), (db, s * dyd.t() @ ud)):
        assert got.shape == ref.shape
        assert (got.double() - ref).norm() <= 1e-5 * ref.norm()


def test_where_tma_cannot_read_the_layer_runs_cublas_products():
    """Without TMA (here: the CPU, Triton not interpreting) the default mode computes the same
    linear and input gradient with cuBLAS's products, for a lone projection and a group."""
    assert not lora_triton.interpreted()
    check_arithmetic(6, "persistent")
    g = torch.Generator().manual_seed(2)
    n, k, sizes, r, s = 30, 40, [24, 8, 8], 4, 1.5
    x, dy = torch.randn(n, k, generator=g), torch.randn(n, sum(sizes), generator=g)
    w = torch.randn(sum(sizes), k, generator=g) / 10
    a = torch.randn(r * len(sizes), k, generator=g) / 10
    b = torch.randn(sum(sizes), r, generator=g) / 10
    y, u = lora_triton.lora_forward(x, w, None, a, b, s, sizes=sizes)
    dx, da, db = lora_triton.lora_backward(dy, x, w, a, b, u, s, sizes=sizes)
    rows = list(zip(w.split(sizes), a.split(r), b.split(sizes), dy.split(sizes, 1)))
    want_y = torch.cat([x @ wi.t() + s * (x @ ai.t()) @ bi.t() for wi, ai, bi, _ in rows], 1)
    want_dx = sum(dyi @ wi + s * (dyi @ bi) @ ai for wi, ai, bi, dyi in rows)
    want_da = torch.cat([s * (dyi @ bi).t() @ x for _, _, bi, dyi in rows])
    want_db = torch.cat([s * dyi.t() @ (x @ ai.t()) for _, ai, _, dyi in rows])
    for got, want in ((y, want_y), (dx, want_dx), (da, want_da), (db, want_db)):
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_kernel_without_the_adapter_is_the_bare_product_and_reads_strided_operands():
    _interpreted("check_bare")


def check_bare():
    """The bare GEMM the bench compares with cuBLAS, on a transposed and a sliced operand."""
    g = torch.Generator().manual_seed(0)
    big = torch.randn(40, 100, generator=g)
    x = big[:, 10:73]  # rows strided by 100
    w = torch.randn(33, 63, generator=g).t()  # (63, 33), column-major
    y, v = lora_triton.lora_mm(x, w, None, None, 2.0)
    assert v is None
    ref = x.double() @ w.double()
    assert (y.double() - ref).norm() <= 1e-6 * ref.norm()


STORES = ((16, 32, 16, 2, 1, 4, 1, False), (16, 32, 16, 2, 1, 4, 2, False))


def test_persistent_kernel_reads_both_weight_layouts_and_adds_the_adapter():
    _interpreted("check_persistent")


def check_persistent():
    """The persistent TMA kernel: y = x·Wᵀ + bias + s·u·Bᵀ from an (N, K) weight and
    dx = dy·W + s·g·A from the same weight read (K, N), against float64, at rows of 16-byte
    multiples (TMA's rule) that no tile divides, with u given or computed in the main loop
    (then returned); bare without u."""
    g = torch.Generator().manual_seed(5)
    n, k, m, r, s = 70, 92, 52, 8, 1.3
    x, w = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g) / 10
    a, b = torch.randn(r, k, generator=g) / 10, torch.randn(m, r, generator=g) / 10
    bias, dy = torch.randn(m, generator=g), torch.randn(n, m, generator=g)
    u, gr = x @ a.t(), dy @ b
    xd, wd, ad, bd, biasd, dyd, ud, grd = _f64(x, w, a, b, bias, dy, u, gr)
    y_ref, dx_ref = xd @ wd.t() + biasd + s * ud @ bd.t(), dyd @ wd + s * grd @ ad
    mm = lora_triton.lora_mm_persistent
    # tiles cut differently; the output stored by TMA, whole and in halves
    for config in (lora_triton.SMALL, (16, 32, 16, 2, 1, 4), *STORES):
        cases = (
            (mm(x, w.t(), u, b.t(), s, bias, config), (y_ref, None)),
            (mm(dy, w, gr, a, s, None, config), (dx_ref, None)),
            (mm(x, w.t(), None, b.t(), s, bias, config, p=a.t()), (y_ref, ud)),
            (mm(dy, w, None, a, s, None, config, p=b), (dx_ref, grd)),
            (mm(x, w.t(), None, None, s, None, config), (xd @ wd.t(), None)),
        )
        for (got, got_xp), (ref, ref_xp) in cases:
            assert got.shape == ref.shape
            assert (got.double() - ref).norm() <= 1e-6 * ref.norm(), config
            if ref_xp is not None:
                assert (got_xp.double() - ref_xp).norm() <= 1e-6 * ref_xp.norm(), config


@pytest.mark.parametrize("mode", ["loop", "epilogue"])
def test_half_precision_kernel_rounds_like_the_default_layer(mode):
    _interpreted("check_half", mode)


def check_half(mode):
    """In 16-bit the kernel's output, u and input gradient stay within the dtype's rounding of
    the default fused layer's (lora_fused.adapter_linear). fp16: the interpreter computes in
    numpy, which has no bf16; bf16 is compared with the default layer on the GPU
    (bench/lora_triton.py's err columns)."""
    g = torch.Generator().manual_seed(3)
    n, k, m, r, s = 64, 96, 80, 8, 2.0
    x, dy = torch.randn(n, k, generator=g).half(), torch.randn(n, m, generator=g).half()
    w, a = (
        (torch.randn(m, k, generator=g) / 10).half(),
        (torch.randn(r, k, generator=g) / 10).half(),
    )
    b = (torch.randn(m, r, generator=g) / 10).half()
    y, u = lora_triton.lora_forward(x, w, None, a, b, s, mode=mode)
    y_op, u_op, _ = lora_fused.adapter_linear(x, w, None, a, b, s, False, 0.0)
    dx = lora_triton.lora_backward(dy, x, w, a, b, u, s, mode=mode)[0]
    dx_op = lora_fused.adapter_linear_backward(dy, x, w, a, b, u_op, s, False, None, 0.0)[0]
    for got, ref in ((y, y_op), (u, u_op), (dx, dx_op)):
        assert got.dtype == torch.float16
        assert (got.float() - ref.float()).norm() <= 2e-3 * ref.float().norm()


@pytest.mark.parametrize("rank", ["cublas", "dy", "triton"])
def test_triton_layers_equal_peft_and_leave_dropout_to_the_op(rank):
    _interpreted("check_layers", rank)


def check_layers(rank="cublas"):
    """TUNEDECK_LORA_EPILOGUE=triton: every linear of a tiny Qwen2 (biased q/k/v too) runs the
    kernel, eager and compiled, with peft's loss and gradients, its rank-r products by cuBLAS
    or by lora_rank's kernels (TUNEDECK_LORA_RANK); a layer with dropout runs the default op
    instead, as does an fp8 base."""
    from lora_replay import loss_and_grads, tiny_peft

    from tunedeck.core.train import lora_rank

    os.environ["TUNEDECK_FUSED_LORA"] = "1"
    os.environ["TUNEDECK_LORA_EPILOGUE"] = "triton"
    os.environ["TUNEDECK_LORA_RANK"] = rank
    ref_loss, ref_g = loss_and_grads(tiny_peft())
    calls, passes = [], []
    real, real_pass = lora_triton.lora_forward, lora_rank.dy_pass
    lora_triton.lora_forward = lambda *a, **k: calls.append(1) or real(*a, **k)
    lora_rank.dy_pass = lambda *a, **k: passes.append(1) or real_pass(*a, **k)
    for compiled in (False, True):
        m = tiny_peft()
        assert lora_fused.fuse_lora(m) == 14
        if compiled:
            m = torch.compile(m, backend="eager")
        calls.clear()
        passes.clear()
        loss, g = loss_and_grads(m)
        assert len(calls) == 14
        assert len(passes) == (0 if rank == "cublas" else 14)
        assert torch.allclose(loss, ref_loss, rtol=1e-5), (compiled, loss, ref_loss)
        g = {k.removeprefix("_orig_mod."): v for k, v in g.items()}
        assert g.keys() == ref_g.keys()
        for k in ref_g:
            assert (g[k] - ref_g[k]).norm() <= 1e-5 * ref_g[k].norm(), k

    m = tiny_peft(dropout=0.1)
    assert lora_fused.fuse_lora(m) == 14
    ways = {mod._tunedeck_epilogue for mod in m.modules() if hasattr(mod, "_tunedeck_epilogue")}
    assert ways == {"op"}
    assert lora_fused.layer_epilogue("triton-loop", tiny_peft().base_model, fp8=True) == "op"


@pytest.mark.parametrize("r", [4, 16, 20])
def test_rank_kernels_make_the_adapters_products_and_gradients(r):
    _interpreted("check_rank", r)


def check_rank(r):
    """lora_rank's kernels against float64, at sizes no tile divides, split over several row
    and column programs (partial sums added afterwards): u = x·Aᵀ, g = dy·B with
    dB = s·dyᵀ·u from one pass, dA = s·gᵀ·x; the same bits when run again (the partial sums
    are added in a fixed order). Then a layer's forward and backward with each
    TUNEDECK_LORA_RANK choice, beside the persistent kernel, against float64."""
    from tunedeck.core.train import lora_rank

    g = torch.Generator().manual_seed(r)
    k, s = 44, 1.7
    for n, m in ((75, 132), (150, 20)):  # rows of 16-byte multiples (the persistent kernel)
        x, dy = torch.randn(n, k, generator=g), torch.randn(n, m, generator=g)
        a, b = torch.randn(r, k, generator=g) / 10, torch.randn(m, r, generator=g) / 10
        u = lora_rank.rows(x, a)
        gr, db = lora_rank.dy_pass(dy, b, u, s)
        da = lora_rank.tn(gr, x, s)
        xd, dyd, ad, bd = _f64(x, dy, a, b)
        ud = xd @ ad.t()
        grd = dyd @ bd
        for got, ref in ((u, ud), (gr, grd), (db, s * dyd.t() @ ud), (da, s * grd.t() @ xd)):
            assert got.shape == ref.shape and got.dtype == torch.float32
            assert (got.double() - ref).norm() <= 1e-6 * ref.norm(), (n, m)
        again = lora_rank.dy_pass(dy, b, u, s)
        assert torch.equal(again[0], gr) and torch.equal(again[1], db)

    w, bias = torch.randn(m, k, generator=g) / 10, torch.randn(m, generator=g)
    wd, biasd = _f64(w, bias)
    for rank in ("dy", "triton"):
        os.environ["TUNEDECK_LORA_RANK"] = rank
        assert lora_triton.rank_kernels(x, w.t(), r, lora_triton.MODE, None) == rank
        assert lora_triton.rank_kernels(x, w.t(), r, lora_triton.MODE, [12, m - 12]) is None
        y, u = lora_triton.lora_forward(x, w, bias, a, b, s)
        dx, da, db = lora_triton.lora_backward(dy, x, w, a, b, u, s)
        refs = (
            (y, xd @ wd.t() + biasd + s * ud @ bd.t()),
            (u, ud),
            (dx, dyd @ wd + s * grd @ ad),
            (da, s * grd.t() @ xd),
            (db, s * dyd.t() @ ud),
        )
        for got, ref in refs:
            assert got.shape == ref.shape
            assert (got.double() - ref).norm() <= 1e-5 * ref.norm(), rank
    os.environ["TUNEDECK_LORA_RANK"] = "cublas"
    assert lora_triton.rank_kernels(x, w.t(), r, lora_triton.MODE, None) is None


def test_the_triton_kernel_is_the_default_only_on_hopper(monkeypatch):
    """Measured faster on Hopper only, so a CPU (and any GPU but compute capability 9.x) keeps
    the cuBLAS "op" layers unless TUNEDECK_LORA_EPILOGUE asks; an empty variable is unset."""
    from lora_replay import tiny_peft  # peft (and bitsandbytes) before CUDA is faked below

    cuda = torch.device("cuda", 0)
    if not torch.cuda.is_available():  # a CUDA device named where there is none to ask
        assert lora_fused.default_epilogue(cuda) == "op"

    def on_gpu(capability: tuple[int, int]) -> str:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
        return lora_fused.default_epilogue(cuda)

    assert on_gpu((9, 0)) == "triton"
    assert [on_gpu(c) for c in [(8, 0), (8, 9), (10, 0), (12, 0)]] == ["op"] * 4
    assert lora_fused.default_epilogue(torch.device("cpu")) == "op"
    assert lora_fused.default_epilogue(None) == "op"
    monkeypatch.setattr(lora_fused.lora_triton, "available", lambda: False)
    assert on_gpu((9, 0)) == "op"
    monkeypatch.undo()

    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", "")
    m = tiny_peft()
    assert lora_fused.fuse_lora(m, torch.device("cpu")) == 14
    ways = {mod._tunedeck_epilogue for mod in m.modules() if hasattr(mod, "_tunedeck_epilogue")}
    assert ways == {"op"}


def test_fp8_kernel_scales_the_product_and_adds_the_adapter():
    _interpreted("check_fp8_kernel")


def check_fp8_kernel():
    """The fp8 base's product through the persistent kernel: (sx·x8)·(w8·sw)ᵀ + bias + u·v
    against float64 of the de-quantized operands, at sizes no tile divides, the weight read
    from (N, K) rows (as both passes of the layer read theirs) and from (K, N) rows; in fp16
    within the dtype's rounding of cuBLAS's two-pass scaled_mm_add (the interpreter has no
    bf16)."""
    g = torch.Generator().manual_seed(7)
    n, k, m, r = 70, 96, 48, 8
    x = torch.randn(n, k, generator=g)
    x[:, 5] *= 300  # an outlier channel: its rows' scales differ by orders of magnitude
    w = torch.randn(m, k, generator=g) / 10
    (x8, sx), (w8, sw) = lora_fused.quant_rows(x), lora_fused.quant_rows(w)
    u, v = torch.randn(n, r, generator=g), torch.randn(r, m, generator=g) / 10
    bias = torch.randn(m, generator=g)
    deq = lambda q, inv: q.double() * inv.double()  # noqa: E731
    lora = u.double() @ v.double()
    for w_op, sw_op, w_ref in (
        (w8.t(), sw.t().contiguous(), deq(w8, sw).t()),  # (N, K) row-major, read transposed
        (w8.t().contiguous(), sw.t().contiguous(), deq(w8, sw).t()),  # (K, N) row-major
    ):
        want = deq(x8, sx) @ w_ref + bias.double() + lora
        for config in (lora_triton.SMALL, (16, 32, 16, 2, 1, 4)):
            y = lora_triton.lora_mm_persistent(
                x8, w_op, u, v, 1.0, bias, config, scales=(sx, sw_op)
            )[0]
            assert y.dtype == torch.float32
            assert (y.double() - want).norm() <= 1e-6 * want.norm(), config
    uh, vh, bh = u.half(), v.half(), bias.half()
    y = lora_triton.scaled_lora_mm(x8, sx, w8.t(), sw.t().contiguous(), bh, uh, vh)
    ref = lora_fused.scaled_mm_add(x8, sx, w8.t(), sw.t().contiguous(), bh, uh, vh)
    assert y.dtype == torch.float16
    assert (y.float() - ref.float()).norm() <= 2e-3 * ref.float().norm()


def test_fp8_triton_layers_equal_the_fp8_op():
    _interpreted("check_fp8_layers")


def check_fp8_layers():
    """TUNEDECK_LORA_EPILOGUE=triton with method.fp8_base: every linear's fp8 product and
    adapter run as the kernel, forward and input gradient, eager and compiled, with the loss
    and gradients of the default fp8 layers ("op", cuBLAS's product and a second pass)."""
    from lora_replay import loss_and_grads, tiny_peft

    os.environ["TUNEDECK_FUSED_LORA"] = "1"
    os.environ["TUNEDECK_LORA_EPILOGUE"] = "op"
    ref = tiny_peft()
    assert lora_fused.fuse_lora(ref, fp8=True) == 14
    ref_loss, ref_g = loss_and_grads(ref)
    os.environ["TUNEDECK_LORA_EPILOGUE"] = "triton"
    calls = []
    real = lora_triton.lora_mm_persistent
    lora_triton.lora_mm_persistent = lambda *a, **k: calls.append(1) or real(*a, **k)
    for compiled in (False, True):
        m = tiny_peft()
        assert lora_fused.fuse_lora(m, fp8=True) == 14
        if compiled:
            m = torch.compile(m, backend="eager")
        calls.clear()
        loss, g = loss_and_grads(m)
        assert len(calls) == 28  # 14 linears, forward and input gradient
        assert torch.allclose(loss, ref_loss, rtol=1e-5), (compiled, loss, ref_loss)
        g = {k.removeprefix("_orig_mod."): v for k, v in g.items()}
        assert g.keys() == ref_g.keys()
        for k in ref_g:
            assert (g[k] - ref_g[k]).norm() <= 1e-4 * ref_g[k].norm(), k


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")
def test_an_unknown_store_setting_is_named_when_layers_fuse(monkeypatch):
    """TUNEDECK_LORA_GEMM picks the persistent kernel's configs; a name it does not know stops
    fuse_lora with the variable and the known names, before any forward runs."""
    from lora_replay import tiny_peft

    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", "triton")
    monkeypatch.setenv("TUNEDECK_LORA_GEMM", "tma-stores")
    with pytest.raises(ValueError, match="TUNEDECK_LORA_GEMM='tma-stores': expected one of poi"):
        lora_fused.fuse_lora(tiny_peft())
    monkeypatch.setenv("TUNEDECK_LORA_GEMM", "tma")
    assert lora_fused.fuse_lora(tiny_peft()) == 14


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")
def test_triton_switch_without_triton_is_named(monkeypatch):
    """Asked for the Triton layers where Triton is missing, fuse_lora says which setting needs
    what instead of failing at the first forward."""
    from lora_replay import tiny_peft

    monkeypatch.setenv("TUNEDECK_FUSED_LORA", "1")
    monkeypatch.setenv("TUNEDECK_LORA_EPILOGUE", "triton-loop")
    monkeypatch.setattr(lora_triton, "available", lambda: False)
    with pytest.raises(RuntimeError, match="TUNEDECK_LORA_EPILOGUE=triton-loop: the triton"):
        lora_fused.fuse_lora(tiny_peft())


def test_wide_triton_runs_each_group_as_one_kernel_and_trains_as_peft():
    _interpreted("check_wide_layers")


def check_wide_layers():
    """TUNEDECK_LORA_EPILOGUE=triton-wide: q/k/v (biased) and gate/up each run as one kernel
    call whose K step holds the group's adapters, o and down as one call each; the buffers hold
    only the frozen weights, of which the base layers' are views; eager and compiled, peft's
    loss and gradients; with the adapters off, peft's own path; fused-AdamW steps give peft's
    losses and state dict (B is read where the optimizer updates it). triton-wide-mlp widens
    only the MLPs."""
    from lora_replay import loss_and_grads, tiny_peft, train_alike

    os.environ["TUNEDECK_FUSED_LORA"] = "1"
    os.environ["TUNEDECK_LORA_EPILOGUE"] = "triton-wide"
    ref_loss, ref_g = loss_and_grads(tiny_peft())
    calls = []
    real = lora_triton.lora_forward
    lora_triton.lora_forward = lambda *a, **k: calls.append(k.get("sizes")) or real(*a, **k)
    for compiled in (False, True):
        m = tiny_peft()
        assert lora_fused.fuse_lora(m) == 14
        attns = [b for b in m.modules() if hasattr(b, "_tunedeck_w_q_proj")]
        assert len(attns) == 2
        for at in attns:
            qkv = at._tunedeck_w_q_proj
            assert qkv.shape == (128, 64)  # q 64 + k 32 + v 32 rows, no B columns
            assert at.k_proj.base_layer.weight.data_ptr() == qkv[64:].data_ptr()
        if compiled:
            m = torch.compile(m, backend="eager")
        calls.clear()
        loss, g = loss_and_grads(m)
        assert sorted(map(str, calls)) == sorted(
            map(str, [[64, 32, 32], [64], [128, 128], [64]] * 2)
        )
        assert torch.allclose(loss, ref_loss, rtol=1e-5), (compiled, loss, ref_loss)
        g = {k.removeprefix("_orig_mod."): v for k, v in g.items()}
        for k in ref_g:
            assert (g[k] - ref_g[k]).norm() <= 1e-5 * ref_g[k].norm(), k

    ref, fused = tiny_peft(), tiny_peft()
    lora_fused.fuse_lora(fused)
    x = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), fused.disable_adapter(), ref.disable_adapter():  # peft's own path
        assert torch.allclose(fused(input_ids=x).logits, ref(input_ids=x).logits, atol=1e-5)
    train_alike(ref, fused, 2)

    os.environ["TUNEDECK_LORA_EPILOGUE"] = "triton-wide-mlp"
    lora_fused.fuse_lora(mlp_only := tiny_peft())
    assert sum(hasattr(b, "_tunedeck_w_gate_proj") for b in mlp_only.modules()) == 2
    assert not any(hasattr(b, "_tunedeck_w_q_proj") for b in mlp_only.modules())


def test_swiglu_kernels_make_the_gated_mlp_and_its_gradients():
    _interpreted("check_swiglu_kernels")


def check_swiglu_kernels():
    """swiglu_triton: y = down(silu(gate(x))·up(x)), each projection with its adapter, and
    every gradient (x, A and B of all three), against float64 autograd, at sizes no tile
    divides; the saved [g | u] is the two projections' outputs."""
    from tunedeck.core.train import swiglu_triton

    gen = torch.Generator().manual_seed(7)
    m, k, n, r, s = 70, 48, 56, 8, 1.5
    t = lambda *shape, sd=0.2: torch.randn(*shape, generator=gen) * sd  # noqa: E731
    x, w_gu, a_gu, b_gu = t(m, k, sd=1.0), t(2 * n, k), t(2 * r, k), t(2 * n, r)
    w_d, a_d, b_d, dy = t(k, n), t(r, n), t(k, r), t(m, k, sd=1.0)
    # rows of 16-byte multiples in 16-bit floats (TMA's rule): not a rank 4 or a width of 50
    assert swiglu_triton.fits(k, n, r, x)
    assert not swiglu_triton.fits(k, n, 4, x) and not swiglu_triton.fits(k, 50, r, x)
    y, gu, u1, u2 = swiglu_triton.mlp_forward(x, w_gu, a_gu, b_gu, w_d, a_d, b_d, s)
    grads = swiglu_triton.mlp_backward(dy, x, gu, u1, u2, w_gu, a_gu, b_gu, w_d, a_d, b_d, s)

    xd, ag, bg, ad, bd = (v.double().requires_grad_() for v in (x, a_gu, b_gu, a_d, b_d))
    wg, wd = w_gu.double(), w_d.double()
    lin = lambda v, w, a, b: v @ w.t() + s * (v @ a.t()) @ b.t()  # noqa: E731
    g = lin(xd, wg[:n], ag[:r], bg[:n])
    u = lin(xd, wg[n:], ag[r:], bg[n:])
    yd = lin(torch.nn.functional.silu(g) * u, wd, ad, bd)
    yd.backward(dy.double())
    close = lambda got, ref: (got.double() - ref).norm() <= 1e-5 * ref.norm()  # noqa: E731
    assert close(y, yd.detach())
    assert close(gu, torch.cat([g, u], 1).detach())
    for got, ref, name in zip(grads, (xd, ag, bg, ad, bd), ("x", "A_gu", "B_gu", "A_d", "B_d")):
        assert got.shape == ref.shape, name
        assert close(got, ref.grad), name


def test_swiglu_layers_run_the_mlp_as_one_op_and_train_as_peft():
    _interpreted("check_swiglu_layers")


def check_swiglu_layers():
    """TUNEDECK_LORA_EPILOGUE=triton-swiglu: each gated MLP runs as one swiglu_mlp call, eager
    and compiled, with peft's loss and gradients; fused-AdamW steps give peft's losses and
    state dict; a rank the kernels cannot take (r=4: 8-byte rows in bf16) runs triton-wide-mlp's
    path, with the same result."""
    from lora_replay import loss_and_grads, tiny_peft, train_alike
    from torch._dynamo.utils import counters

    from tunedeck.core.train import swiglu_triton

    os.environ["TUNEDECK_FUSED_LORA"] = "1"
    os.environ["TUNEDECK_LORA_EPILOGUE"] = "triton-swiglu"
    calls = []
    real = swiglu_triton.mlp_forward
    swiglu_triton.mlp_forward = lambda *a: calls.append(a[0].shape) or real(*a)
    for r, runs in ((8, 2), (4, 0)):
        ref_loss, ref_g = loss_and_grads(tiny_peft(r=r))
        for compiled in (False, True):
            m = tiny_peft(r=r)
            assert lora_fused.fuse_lora(m) == 14
            mlps = [b for b in m.modules() if hasattr(b, "_tunedeck_w_gate_proj")]
            assert len(mlps) == 2 and all(b._tunedeck_swiglu == bool(runs) for b in mlps)
            if compiled:
                torch._dynamo.reset()
                counters.clear()
                m = torch.compile(m, backend="eager")
            calls.clear()
            loss, g = loss_and_grads(m)
            assert len(calls) == runs, (r, calls)
            # the choice is made once: nothing inside the compiled model breaks its graph
            assert not compiled or not counters["graph_break"], dict(counters["graph_break"])
            assert torch.allclose(loss, ref_loss, rtol=1e-5), (r, compiled, loss, ref_loss)
            g = {k.removeprefix("_orig_mod."): v for k, v in g.items()}
            for k in ref_g:
                assert (g[k] - ref_g[k]).norm() <= 1e-5 * ref_g[k].norm(), (r, k)
    ref, fused = tiny_peft(r=8), tiny_peft(r=8)
    lora_fused.fuse_lora(fused)
    train_alike(ref, fused, 2)
