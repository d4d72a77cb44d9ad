"""The adapter's dropout inside the fused LoRA ops (lora_fused, qlora_fused): drawn as a bool
keep-mask outside the op, applied to the adapter's input and, in backward, to its input
gradient. Backward keeps the mask (1 byte an element) where peft's layer keeps the mask and
the dropped input beside it (3 bytes in bf16)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def dropout_mask(x: Tensor, p: float) -> Tensor:
    """The adapter's dropout as a bool keep-mask (1 byte an element, what backward keeps of
    it; compile fuses its draw into one kernel)."""
    return torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(1.0 - p)


def dropped(t: Tensor, mask: Tensor | None, p: float, in_place: bool = False) -> Tensor:
    """t with the adapter's dropout applied (kept elements scaled by 1/(1-p)); t if none."""
    if mask is None:
        return t
    t = t.mul_(mask) if in_place else t * mask
    return t.mul_(1.0 / (1.0 - p))


def dropout_p(module: nn.Module) -> float:
    """The adapter's dropout probability; 1.0 for a kind of dropout the fused layers lack."""
    drop = module.lora_dropout["default"]
    if isinstance(drop, nn.Identity):
        return 0.0
    return float(drop.p) if type(drop) is nn.Dropout else 1.0


def active_dropout(module: nn.Module) -> float:
    """dropout_p while the layer trains (peft's nn.Dropout drops nothing in eval mode)."""
    return module._tunedeck_dropout if module.lora_dropout["default"].training else 0.0
