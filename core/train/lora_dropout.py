"""The adapter's dropout inside the fused LoRA ops (lora_fused, qlora_fused), kept as nothing.

Forward draws D(x) = x·m/(1-p) inside the op (one fused kernel) and returns the random
generator's state from before the draw; backward sets that state, draws the same m again from
x and puts the generator back, so nothing of m is kept (at 1 byte an element the masks would be
8.6 GiB of the 7B QLoRA recipe at 4 × 2048 tokens; peft's layer keeps them and the dropped
input). On CUDA the draw is counter-based (Philox: a seed and an offset), so the same state,
shape and kernel give the same mask; the kernel (vectorized or not) follows the input's
alignment, the same for the saved x and for a copy the compiled layer recomputes (allocator
buffers are aligned alike). torch.utils.checkpoint restores the state before it recomputes a
forward, so a recomputed forward draws the same mask too."""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn


def _generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index or 0]
    return torch.default_generator


@functools.cache
def _state_numel(device_type: str) -> int:
    # read from a real generator: the ops' fake impls ask while the compiler traces them
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _generator(torch.device(device_type)).get_state().numel()


def state_bytes(device: torch.device, p: float) -> int:
    """The size of the state `dropped` returns for a tensor on `device` (0 without dropout):
    16 bytes on CUDA (Philox's seed and offset), 5,056 on the CPU (Mersenne Twister's)."""
    return _state_numel(device.type) if p else 0


def no_state() -> Tensor:
    return torch.empty(0, dtype=torch.uint8)


def dropped(x: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """(D(x), the generator's state before the draw), D scaled by 1/(1-p)."""
    state = _generator(x.device).get_state()
    return torch.native_dropout(x, p, True)[0], state


def redrawn(x: Tensor, p: float, state: Tensor) -> tuple[Tensor, Tensor]:
    """(D(x), its keep-mask) drawn again from `state`; the generator is left as it was."""
    gen = _generator(x.device)
    now = gen.get_state()
    gen.set_state(state)
    try:
        return torch.native_dropout(x, p, True)
    finally:
        gen.set_state(now)


def adapter_in(x: Tensor, a: Tensor, p: float) -> tuple[Tensor, Tensor]:
    """(u, state): u = D(x)·Aᵀ, D the dropout; the state to draw D again from (empty
    without dropout)."""
    if not p:
        return x @ a.t(), no_state()
    xd, state = dropped(x, p)
    return xd @ a.t(), state


def adapter_backward(
    dy: Tensor,
    x: Tensor,
    a: Tensor,
    b: Tensor,
    u: Tensor,
    scale: float,
    state: Tensor,
    p: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(t, dA, dB) of the adapter's s·D(x)·Aᵀ·Bᵀ: t = D(s·dy·B·A), its part of dx, a fresh
    tensor the frozen GEMM's part can be accumulated into. 1/(1-p) scales the rank-r s·dy·B,
    so the full-size t takes one pass for the mask."""
    g = (dy @ b) * scale  # (N, r) = s·dy·B
    db = (dy.t() @ u) * scale
    if not p:
        return g @ a, g.t() @ x, db
    xd, mask = redrawn(x, p, state)
    return ((g * (1.0 / (1.0 - p))) @ a).mul_(mask), g.t() @ xd, db


def dropout_p(module: nn.Module) -> float:
    """The adapter's dropout probability; 1.0 for a kind of dropout the fused layers lack."""
    drop = module.lora_dropout["default"]
    if isinstance(drop, nn.Identity):
        return 0.0
    return float(drop.p) if type(drop) is nn.Dropout else 1.0


def active_dropout(module: nn.Module) -> float:
    """dropout_p while the layer trains (peft's nn.Dropout drops nothing in eval mode)."""
    return module._tunedeck_dropout if module.lora_dropout["default"].training else 0.0
