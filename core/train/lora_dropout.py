"""The adapter's dropout inside the fused LoRA ops (lora_fused, qlora_fused): drawn as a bool
keep-mask outside the op, applied to the adapter's input and, in backward, to its input
gradient; the 1/(1-p) scaling goes on the rank-r products. Backward keeps the mask (1 byte an
element) where peft's layer keeps the mask and the dropped input beside it (3 bytes in bf16)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def dropout_mask(x: Tensor, p: float) -> Tensor:
    """The adapter's dropout as a bool keep-mask (1 byte an element, what backward keeps of
    it; compile fuses its draw into one kernel)."""
    return torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(1.0 - p)


def adapter_in(x: Tensor, a: Tensor, mask: Tensor | None, p: float) -> Tensor:
    """u = D(x)·Aᵀ, D the dropout: the mask applied to x (one pass over it), 1/(1-p) to the
    rank-r product."""
    if mask is None:
        return x @ a.t()
    return ((x * mask) @ a.t()).mul_(1.0 / (1.0 - p))


def adapter_backward(
    dy: Tensor,
    x: Tensor,
    a: Tensor,
    b: Tensor,
    u: Tensor,
    scale: float,
    mask: Tensor | None,
    p: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(t, dA, dB) of the adapter's s·D(x)·Aᵀ·Bᵀ: t = D(s·dy·B·A), its part of dx, a fresh
    tensor the frozen GEMM's part can be accumulated into. 1/(1-p) scales the rank-r
    s·dy·B, so the full-size tensors take one pass each for the mask."""
    g = (dy @ b) * scale  # (N, r) = s·dy·B
    db = (dy.t() @ u) * scale
    if mask is None:
        return g @ a, g.t() @ x, db
    g = g * (1.0 / (1.0 - p))
    return (g @ a).mul_(mask), g.t() @ (x * mask), db


def dropout_p(module: nn.Module) -> float:
    """The adapter's dropout probability; 1.0 for a kind of dropout the fused layers lack."""
    drop = module.lora_dropout["default"]
    if isinstance(drop, nn.Identity):
        return 0.0
    return float(drop.p) if type(drop) is nn.Dropout else 1.0


def active_dropout(module: nn.Module) -> float:
    """dropout_p while the layer trains (peft's nn.Dropout drops nothing in eval mode)."""
    return module._tunedeck_dropout if module.lora_dropout["default"].training else 0.0
