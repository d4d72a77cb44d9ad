"""QLoRA linear layers (a 4-bit bitsandbytes base) with the adapter folded in, as
lora_fused does for a 16-bit base.

peft's 4-bit LoRA layer clones the base's output and adds the adapter's product to the copy.
In a compiled 7B QLoRA step both full-size tensors were alive at the peak: bitsandbytes'
own F.linear outputs took 12.9 GiB beside peft's copies (allocator trace, docs/benchmarks.md).
Here one opaque op dequantizes the weight, runs the frozen GEMM with the adapter's product as
its C operand and returns (y, u): backward keeps the input and the rank-r u, as the fused
16-bit layer does, and dequantizes the weight again (bitsandbytes' own backward does too).
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from tunedeck.core.train.lora_dropout import active_dropout, dropout_p
from tunedeck.core.train.lora_fused import (
    adapter_linear,
    adapter_linear_backward,
    fake_outputs,
)


def dequantize(
    packed: Tensor, quant: list[Tensor], meta: list[int], quant_type: str, dtype: torch.dtype
) -> Tensor:
    """The (out, in) weight in `dtype` from bitsandbytes' packed 4-bit data; `quant` holds
    absmax, or for double quantization its 8-bit codes, their absmax, code book and offset;
    `meta` is (out, in, blocksize, the nested blocksize or 0). See quant_args."""
    from bitsandbytes.functional import QuantState, dequantize_4bit

    out_f, in_f, block, block2 = meta
    state2, offset = None, None
    if len(quant) == 4:
        state2 = QuantState(absmax=quant[1], code=quant[2], blocksize=block2, dtype=torch.float32)
        offset = quant[3]
    qs = QuantState(
        absmax=quant[0],
        shape=torch.Size((out_f, in_f)),
        blocksize=block,
        quant_type=quant_type,
        dtype=dtype,
        offset=offset,
        state2=state2,
    )
    return dequantize_4bit(packed, qs)


@torch.library.custom_op("tunedeck::qlora_linear", mutates_args=())
def qlora_linear(
    x: Tensor,
    packed: Tensor,
    quant: list[Tensor],
    meta: list[int],
    quant_type: str,
    bias: Tensor | None,
    a: Tensor,
    b: Tensor,
    scale: float,
    p: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, u, state): y = x·Wᵀ + bias + s·u·Bᵀ with u = D(x)·Aᵀ and W dequantized here, the
    adapter's product the frozen GEMM's C operand; D the adapter's dropout, `state` what
    backward draws it again from (lora_dropout).
    Opaque: the dequantized W and the GEMM's own output never reach the compiler, so nothing
    can keep them for backward."""
    w = dequantize(packed, quant, meta, quant_type, x.dtype)
    return adapter_linear(x, w, bias, a, b, scale, False, p)


@qlora_linear.register_fake
def _(x, packed, quant, meta, quant_type, bias, a, b, scale, p):
    return fake_outputs(x, meta[0], a, p)


@torch.library.custom_op("tunedeck::qlora_linear_backward", mutates_args=())
def qlora_linear_backward(
    dy: Tensor,
    x: Tensor,
    packed: Tensor,
    quant: list[Tensor],
    meta: list[int],
    quant_type: str,
    a: Tensor,
    b: Tensor,
    u: Tensor,
    scale: float,
    state: Tensor,
    p: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dA, dB) of qlora_linear: dx = dy·W + D(s·dy·B·A) accumulated in place."""
    w = dequantize(packed, quant, meta, quant_type, dy.dtype)
    return adapter_linear_backward(dy, x, w, a, b, u, scale, False, state, p)


@qlora_linear_backward.register_fake
def _(dy, x, packed, quant, meta, quant_type, a, b, u, scale, state, p):
    return torch.empty_like(x), torch.empty_like(a), torch.empty_like(b)


def _setup(ctx, inputs, output):
    x, packed, quant, meta, quant_type, _bias, a, b, scale, p = inputs
    ctx.save_for_backward(x, packed, a, b, output[1], output[2], *quant)
    ctx.meta, ctx.quant_type, ctx.scale, ctx.p = meta, quant_type, scale, p


def _backward(ctx, dy, _du, _dstate):
    x, packed, a, b, u, state, *quant = ctx.saved_tensors
    dx, da, db = qlora_linear_backward(
        dy, x, packed, quant, ctx.meta, ctx.quant_type, a, b, u, ctx.scale, state, ctx.p
    )
    return dx, None, [None] * len(quant), None, None, None, da, db, None, None


qlora_linear.register_autograd(_backward, setup_context=_setup)


def quant_args(weight) -> tuple[list[Tensor], list[int], str]:
    """qlora_linear's (quant, meta, quant_type) for a bitsandbytes Params4bit."""
    qs = weight.quant_state
    out_f, in_f = qs.shape
    if qs.nested:
        offset = torch.as_tensor(qs.offset, dtype=torch.float32, device=qs.absmax.device)
        quant = [qs.absmax, qs.state2.absmax, qs.state2.code, offset]
        return quant, [out_f, in_f, qs.blocksize, qs.state2.blocksize], qs.quant_type
    return [qs.absmax], [out_f, in_f, qs.blocksize, 0], qs.quant_type


def eligible_4bit(module: nn.Module) -> bool:
    """A peft 4-bit LoRA Linear this module can run: a bitsandbytes Linear4bit base with its
    quantization state in the training layout, the one adapter 'default', plain dropout below
    1 or none, no DoRA."""
    if "bitsandbytes" not in sys.modules:  # nothing is 4-bit; and a 16-bit run never imports it
        return False
    try:
        from bitsandbytes.nn import Linear4bit
        from peft.tuners.lora.bnb import Linear4bit as LoraLinear4bit
    except ImportError:
        return False
    if type(module) is not LoraLinear4bit or type(module.base_layer) is not Linear4bit:
        return False
    qs = getattr(module.base_layer.weight, "quant_state", None)
    if qs is None or getattr(qs, "packing_format_for_cpu", False) or len(qs.shape) != 2:
        return False
    if list(module.lora_A.keys()) != ["default"] or module.use_dora.get("default", False):
        return False
    return dropout_p(module) < 1.0


def fused_forward_4bit(self, x, *args, **kwargs):
    """forward of a peft 4-bit LoRA Linear (one adapter, not merged), fused."""
    if (
        self.disable_adapters
        or self.merged
        or list(self.active_adapters) != ["default"]
        or kwargs.get("adapter_names") is not None
    ):
        return self._tunedeck_peft_forward(x, *args, **kwargs)
    base = self.base_layer
    dev = x.device.type
    dt = (
        torch.get_autocast_dtype(dev)
        if torch.is_autocast_enabled(dev)
        else (base.compute_dtype or x.dtype)
    )
    quant, meta, quant_type = self._tunedeck_quant
    shape = x.shape
    with torch.autocast(dev, enabled=False):
        y, _, _ = qlora_linear(
            x.reshape(-1, shape[-1]).to(dt),
            base.weight.data,
            quant,
            meta,
            quant_type,
            None if base.bias is None else base.bias.to(dt),
            self.lora_A["default"].weight.to(dt),
            self.lora_B["default"].weight.to(dt),
            float(self.scaling["default"]),
            active_dropout(self),
        )
    return y.view(*shape[:-1], y.shape[-1])
