"""method.fp8_base: LoRA on e4m3 copies of the frozen weights. torch runs the same row-wise
scaled fp8 products on CPU as on a Hopper GPU, so the layer and a real 2-rank torchrun are
checked here; the speed is measured on the H200 (docs/benchmarks.md)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_run_dir
from tests.test_train import (
    DATA,
    _assert_loads_with_peft,
    _steps,
    _torchrun,
    _wait,
    tiny_cache,  # noqa: F401  (a fixture)
    tiny_model,  # noqa: F401  (a fixture)
)

H, LAYERS, V = 64, 2, 97


def _model(seed=0):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        hidden_size=H,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=V,
    )
    torch.manual_seed(seed)
    return get_peft_model(
        AutoModelForCausalLM.from_config(cfg),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False),
    )


def _loss_and_grads(m, x):
    loss = m(input_ids=x, labels=x).loss
    loss.backward()
    return loss.detach(), {k: p.grad for k, p in m.named_parameters() if p.requires_grad}


def test_quant_rows_keeps_each_row_within_e4m3():
    from tunedeck.core.train.lora_fused import quant_rows

    t = torch.randn(8, 300) * torch.logspace(-6, 4, 8)[:, None]  # rows 10 decades apart
    q, inv = quant_rows(t)
    assert q.dtype == torch.float8_e4m3fn and inv.shape == (8, 1)
    back = q.float() * inv
    rel = (back - t).norm(dim=1) / t.norm(dim=1)
    assert (rel < 0.05).all(), rel  # 3 mantissa bits: ~2-3 % a row, whatever its scale
    assert (q.float().abs().amax(dim=1) == 448).all()  # each row spans e4m3's whole range


@pytest.mark.parametrize("add", ["0", "op"])
def test_fp8_lora_linear_computes_what_it_says(add):
    """The layer against the same math written out: products of the de-quantized e4m3
    operands (forward: x and W, backward: dy and W's second copy), the adapter in full
    precision. Equal up to float rounding, so only the quantization differs from bf16;
    the same whether the adapter is added out of place or inside the opaque op."""
    from tunedeck.core.train.lora_fused import _LoraLinearFP8, quant_rows

    g = torch.Generator().manual_seed(3)
    n, k, out, r, s = 24, 256, 96, 8, 2.0
    x = torch.randn(n, k, generator=g, requires_grad=True)
    w = torch.randn(out, k, generator=g) * 0.05
    bias = torch.randn(out, generator=g)
    a = (torch.randn(r, k, generator=g) * 0.1).requires_grad_()
    b = (torch.randn(out, r, generator=g) * 0.1).requires_grad_()
    dy = torch.randn(n, out, generator=g)
    w8, sw = quant_rows(w)
    wt8, swt = quant_rows(w.t())
    y = _LoraLinearFP8.apply(
        x, w8, sw.t().contiguous(), wt8, swt.t().contiguous(), bias, a, b, s, add
    )
    y.backward(dy)

    deq = lambda q, inv: q.float() * inv  # noqa: E731
    xd = x.detach()
    want_y = (
        deq(*quant_rows(xd)) @ deq(w8, sw).t() + bias + s * (xd @ a.detach().t()) @ b.detach().t()
    )
    gu = s * dy @ b.detach()  # (n, r)
    want_dx = deq(*quant_rows(dy)) @ deq(wt8, swt).t() + gu @ a.detach()
    assert torch.allclose(y.detach(), want_y, rtol=1e-4, atol=1e-4)
    assert torch.allclose(x.grad, want_dx, rtol=1e-4, atol=1e-4)
    assert torch.allclose(a.grad, gu.t() @ xd, rtol=1e-4, atol=1e-4)
    assert torch.allclose(b.grad, s * dy.t() @ (xd @ a.detach().t()), rtol=1e-4, atol=1e-4)
    # and the quantization's own cost: ~4 % of the frozen product, not more
    exact = xd @ w.t()
    lora = s * (xd @ a.detach().t()) @ b.detach().t()
    assert (y.detach() - bias - lora - exact).norm() < 0.06 * exact.norm()


def test_fp8_base_swaps_every_lora_linear_and_frees_the_bf16_weights():
    from tunedeck.core.train.lora_fused import base_numel, fuse_lora

    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    ref = _model()
    n_before = base_numel(ref)
    ref_loss, ref_g = _loss_and_grads(ref, x)

    m = _model()
    assert fuse_lora(m, torch.device("cpu"), fp8=True) == 7 * LAYERS
    assert base_numel(m) == n_before  # FLOP accounting still sees the whole model
    swapped = [mod for mod in m.modules() if hasattr(mod, "_tunedeck_fp8")]
    assert len(swapped) == 7 * LAYERS
    assert all(mod.base_layer.weight.numel() == 0 for mod in swapped)
    # cuBLASLt's fp8 products take only row-major copies (CPU's take any layout)
    assert all(t.is_contiguous() for mod in swapped for t in mod._tunedeck_fp8)
    fp8_bytes = sum(t.numel() * t.element_size() for mod in swapped for t in mod._tunedeck_fp8[::2])
    assert fp8_bytes == 2 * sum(mod.in_features * mod.out_features for mod in swapped)
    loss, g = _loss_and_grads(m, x)
    assert loss != ref_loss and abs(loss - ref_loss) <= 0.02 * ref_loss, (loss, ref_loss)
    # every adapter gets a gradient (their size differs from fp32's: this 2-layer random
    # model amplifies rounding ~8x, bf16's too, so the values are checked per layer above)
    assert set(g) == set(ref_g) and all(
        torch.isfinite(t).all() and t.norm() > 0 for t in g.values()
    )
    assert set(m.state_dict()) == set(ref.state_dict())  # the adapters save like peft's
    with m.disable_adapter(), pytest.raises(RuntimeError, match="fp8 copies"):
        m(input_ids=x)  # peft's own forward would have met the emptied weight


def test_an_fp8_base_needs_fp8_units(monkeypatch):
    from tunedeck.core.train.lora_fused import fp8_problem

    assert fp8_problem(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100-SXM4-80GB")
    why = fp8_problem(torch.device("cuda", 0))
    assert "method.fp8_base" in why and "A100" in why and "8.0" in why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    assert fp8_problem(torch.device("cuda", 0)) is None
    why = fp8_problem(torch.device("cuda", 0), torch.float16)
    assert "bf16" in why and "float16" in why and "model.dtype" in why
    assert fp8_problem(torch.device("cpu"), torch.float32) is None  # CPU: any float


@pytest.mark.parametrize(
    "values, words",
    [
        ({"method.type": "qlora"}, "method.type lora, not qlora"),
        ({"parallel.strategy": "fsdp2"}, "parallel.strategy ddp"),
        ({"method.lora_dropout": 0.05}, "method.lora_dropout = 0"),
        ({"model.dtype": "float16"}, "model.dtype is float16"),
    ],
)
def test_fp8_base_combinations_that_cannot_run_are_named(values, words):
    from tunedeck.core.spec import RunSpec, cross_checks, set_values

    spec = set_values(RunSpec(name="f"), {"data.path": str(DATA), "method.fp8_base": True})
    assert not [p for p in cross_checks(spec) if "fp8" in p]
    problems = cross_checks(set_values(spec, values))
    assert any(p.startswith("method.fp8_base") and words in p for p in problems), problems


@pytest.mark.slow
def test_torchrun_trains_with_an_fp8_base(tmp_path, tiny_model):  # noqa: F811 (fixture)
    steps = 20
    run = make_run_dir(
        tmp_path / "run", train__max_steps=steps, train__save_steps=steps, method__fp8_base=True
    )
    log = tmp_path / "torchrun.log"
    _wait(_torchrun(run, log), log)
    s0, s1 = _steps(run, 0), _steps(run, 1)
    assert [e["loss"] for e in s0] == [e["loss"] for e in s1]
    first = sum(e["loss"] for e in s0[:3]) / 3
    last = sum(e["loss"] for e in s0[-3:]) / 3
    assert last < first - 0.5, (first, last)
    _assert_loads_with_peft(run / "output" / f"checkpoint-{steps}", tiny_model)
    # the start event counts the frozen weights that moved to fp8 (FLOPs and MFU use it)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tests.test_train import read_events

    start = next(e for e in read_events(run / "events" / "rank0.jsonl") if e["kind"] != "phase")
    bf16 = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model),
        LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"),
    )
    assert start["kind"] == "start"
    assert start["total_params"] == sum(p.numel() for p in bf16.parameters())


def test_fp8_layer_with_the_adapter_inside_the_op_compiles_to_the_same_gradients():
    """An earlier fp8 layer lost every gradient once compiled (the adapter added in place
    into an opaque op's output, outside it). The in-place add now happens inside the op on
    its own buffer: compiled with Inductor it gives eager's loss and gradients."""
    import shutil

    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("Inductor on CPU needs a C++ compiler")
    import torch._dynamo

    from tunedeck.core.train.lora_fused import _LoraLinearFP8, quant_rows

    g = torch.Generator().manual_seed(3)
    n, k, out, r, s = 32, 256, 96, 8, 2.0
    x0 = torch.randn(n, k, generator=g)
    w = torch.randn(out, k, generator=g) * 0.05
    bias = torch.randn(out, generator=g)
    a0, b0 = torch.randn(r, k, generator=g) * 0.1, torch.randn(out, r, generator=g) * 0.1
    (w8, sw), (wt8, swt) = quant_rows(w), quant_rows(w.t())

    def f(x, a, b):
        # pointwise work on both sides, for the compiler to fuse around the op
        y = _LoraLinearFP8.apply(
            torch.nn.functional.silu(x),
            w8,
            sw.t().contiguous(),
            wt8,
            swt.t().contiguous(),
            bias,
            a,
            b,
            s,
            "op",
        )
        return (torch.nn.functional.gelu(y) ** 2).sum()

    got = []
    torch._dynamo.reset()
    try:
        for fn in (f, torch.compile(f, backend="inductor")):
            x, a, b = (t.clone().requires_grad_() for t in (x0, a0, b0))
            loss = fn(x, a, b)
            loss.backward()
            got.append((loss.detach(), x.grad, a.grad, b.grad))
    finally:
        torch._dynamo.reset()
    (eager, compiled) = got
    assert compiled[1].norm() > 0 and compiled[2].norm() > 0 and compiled[3].norm() > 0
    for e, c in zip(eager, compiled):
        assert torch.allclose(e, c, rtol=1e-4, atol=1e-4)
