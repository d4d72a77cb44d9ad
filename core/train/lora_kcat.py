"""The adapter as r extra K columns of the frozen GEMM (TUNEDECK_LORA_EPILOGUE=kcat).

    y  = [x | s·D(x)·Aᵀ] · [W | B]ᵀ      dx = [dy | s·dy·B] · [W ; A]

Both weight blocks are views of one (out + r) × (in + r) buffer per layer, [[W, B], [A, 0]]:
the frozen weight becomes a view of it (no second copy), and the adapter's A and B are copied
into it before each forward that follows an optimizer step (`fill`, from a forward pre-hook on
the model, outside any compiled region). The big GEMMs then read no C operand (cuBLAS runs
its beta-add GEMMs well below bare ones: docs/benchmarks.md), at the price of copying x (and,
in backward, dy) into the wider operand. With dropout the backward keeps lora_fused's way
(the mask sits between the adapter's input gradient and the sum)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tunedeck.core.train.lora_dropout import adapter_backward, adapter_in


def widen(module: nn.Module, dtype: torch.dtype) -> None:
    """Give a peft LoRA Linear its [[W, B], [A, 0]] buffer (`_tunedeck_wc`, in `dtype`) and make
    its frozen weight a view of it."""
    base = module.base_layer
    r = module.lora_A["default"].weight.shape[0]
    m, k = base.weight.shape
    wc = torch.zeros(m + r, k + r, dtype=dtype, device=base.weight.device)
    with torch.no_grad():
        wc[:m, :k].copy_(base.weight)
    base.weight = nn.Parameter(wc[:m, :k], requires_grad=False)
    module.register_buffer("_tunedeck_wc", wc, persistent=False)
    module._tunedeck_seen = None
    fill(module)


def fill(module: nn.Module) -> None:
    """Copy the layer's A and B into its buffer unless they are what it last copied."""
    a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
    seen = (a._version, b._version, a.data_ptr(), b.data_ptr())
    if module._tunedeck_seen == seen:
        return
    wc = module._tunedeck_wc
    m, k = module.base_layer.weight.shape
    with torch.no_grad():
        wc[:m, k:].copy_(b)
        wc[m:, :k].copy_(a)
    module._tunedeck_seen = seen


def kcat_forward(x, wc, bias, a, scale, p) -> tuple[Tensor, Tensor, Tensor]:
    k, r = x.shape[1], a.shape[0]
    m = wc.shape[0] - r
    u, state = adapter_in(x, a, p)
    xc = x.new_empty(x.shape[0], k + r)
    xc[:, :k].copy_(x)
    torch.mul(u, scale, out=xc[:, k:])
    w = wc[:m].t()
    return (torch.addmm(bias, xc, w) if bias is not None else xc @ w), u, state


def kcat_backward(dy, x, wc, a, b, u, scale, state, p) -> tuple[Tensor, Tensor, Tensor]:
    k, r = x.shape[1], a.shape[0]
    m = wc.shape[0] - r
    if p:
        t, da, db = adapter_backward(dy, x, a, b, u, scale, state, p)
        return t.addmm_(dy, wc[:m, :k]), da, db
    dyc = dy.new_empty(dy.shape[0], m + r)
    dyc[:, :m].copy_(dy)
    torch.mul(dy @ b, scale, out=dyc[:, m:])  # s·dy·B
    return dyc @ wc[:, :k], dyc[:, m:].t() @ x, (dy.t() @ u) * scale


@torch.library.custom_op("tunedeck::lora_kcat", mutates_args=())
def lora_kcat(
    x: Tensor, wc: Tensor, bias: Tensor | None, a: Tensor, b: Tensor, scale: float, p: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, u, state) of lora_fused.lora_linear with the adapter as extra K columns; `b` only
    for autograd (the forward reads B from wc)."""
    return kcat_forward(x, wc, bias, a, scale, p)


@lora_kcat.register_fake
def _(x, wc, bias, a, b, scale, p):
    from tunedeck.core.train.lora_fused import fake_outputs

    return fake_outputs(x, b.shape[0], a, p)


@torch.library.custom_op("tunedeck::lora_kcat_backward", mutates_args=())
def lora_kcat_backward(
    dy: Tensor,
    x: Tensor,
    wc: Tensor,
    a: Tensor,
    b: Tensor,
    u: Tensor,
    scale: float,
    state: Tensor,
    p: float,
) -> tuple[Tensor, Tensor, Tensor]:
    return kcat_backward(dy, x, wc, a, b, u, scale, state, p)


@lora_kcat_backward.register_fake
def _(dy, x, wc, a, b, u, scale, state, p):
    return torch.empty_like(x), torch.empty_like(a), torch.empty_like(b)


def _setup(ctx, inputs, output):
    x, wc, _bias, a, b, scale, p = inputs
    ctx.save_for_backward(x, wc, a, b, output[1], output[2])
    ctx.scale, ctx.p = scale, p


def _backward(ctx, dy, _du, _dstate):
    x, wc, a, b, u, state = ctx.saved_tensors
    dx, da, db = lora_kcat_backward(dy, x, wc, a, b, u, ctx.scale, state, ctx.p)
    return dx, None, None, da, db, None, None


lora_kcat.register_autograd(_backward, setup_context=_setup)
