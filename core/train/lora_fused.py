"""LoRA linear layers with the adapter folded into the frozen matmul's memory passes.

peft computes y = x·Wᵀ and, separately, l = s·(x·Aᵀ)·Bᵀ, then adds them: the full-size output
is written twice, read twice and written again; its backward likewise writes the adapter's
input gradient in full and adds it to the base one. On a 7B model these passes over
8192 × 18944 tensors are most of what is left once compile has fused the rest (profile in
docs/benchmarks.md). Here the adapter's product enters the frozen GEMM as its C operand
(addmm: read once in the epilogue), and the backward accumulates the adapter's input gradient
into the base one in place (addmm_). Same math, same parameters and state dict as peft.
"""

from __future__ import annotations

import os
import types

import torch
from torch import nn


class _LoraLinear(torch.autograd.Function):
    """y = x·Wᵀ + bias + s·(x·Aᵀ)·Bᵀ for 2-d x in one dtype; W and bias frozen."""

    @staticmethod
    def forward(ctx, x, weight, bias, a, b, scale):
        u = x @ a.t()                                   # (N, r)
        bs = b.t() * scale                              # (r, out)
        c = torch.addmm(bias, u, bs) if bias is not None else u @ bs
        y = torch.addmm(c, x, weight.t())               # c read once, in the GEMM's epilogue
        ctx.save_for_backward(x, weight, a, bs, u)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, a, bs, u = ctx.saved_tensors
        g = dy @ bs.t()                                 # (N, r) = s·dy·B
        dx = dy @ weight
        dx.addmm_(g, a)                                 # += s·dy·B·A, in place
        da = g.t() @ x                                  # (r, in)
        db = (dy.t() @ u) * ctx.scale                   # (out, r)
        return dx, None, None, da, db, None


def _fused_forward(self, x, *args, **kwargs):
    """forward of a peft LoRA Linear (one adapter, no dropout, not merged), fused."""
    if self.disable_adapters or self.merged or list(self.active_adapters) != ["default"]:
        return self._tunedeck_peft_forward(x, *args, **kwargs)
    base = self.base_layer
    dev = x.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else base.weight.dtype
    a = self.lora_A["default"].weight
    b = self.lora_B["default"].weight
    shape = x.shape
    with torch.autocast(dev, enabled=False):
        w = base.weight if base.weight.dtype == dt else base.weight.to(dt)
        bias = None if base.bias is None else base.bias.to(dt)
        y = _LoraLinear.apply(x.reshape(-1, shape[-1]).to(dt), w, bias, a.to(dt),
                                    b.to(dt), float(self.scaling["default"]))
    return y.view(*shape[:-1], y.shape[-1])


def eligible(module: nn.Module) -> bool:
    """A peft LoRA Linear this module can run: a plain nn.Linear base, the one adapter
    'default', no dropout, no DoRA, no magnitude vector, not fan_in_fan_out."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return False
    if type(module) is not LoraLinear or type(module.base_layer) is not nn.Linear:
        return False
    if list(module.lora_A.keys()) != ["default"] or getattr(module, "fan_in_fan_out", False):
        return False
    if module.use_dora.get("default", False):
        return False
    drop = module.lora_dropout["default"]
    return isinstance(drop, nn.Identity) or (isinstance(drop, nn.Dropout) and drop.p == 0)


def fuse_lora(model: nn.Module, device: torch.device | None = None) -> int:
    """Switch every eligible LoRA Linear of `model` to the fused forward; how many.

    On by default on CUDA, where it was measured under compile (7B, one H200: +2.2 % tokens/s
    and 1.5 GiB less reserved, docs/benchmarks.md); CPU runs keep peft's layers.
    TUNEDECK_FUSED_LORA=0 turns it off anywhere, =1 on anywhere."""
    forced = os.environ.get("TUNEDECK_FUSED_LORA", "")
    on = forced == "1" or (forced != "0" and device is not None and device.type == "cuda")
    if not on:
        return 0
    n = 0
    for m in model.modules():
        if eligible(m):
            m._tunedeck_peft_forward = m.forward
            m.forward = types.MethodType(_fused_forward, m)
            n += 1
    return n
