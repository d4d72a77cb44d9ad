"""The MLP's LoRA adapters as extra K columns of its frozen GEMMs (TUNEDECK_LORA_EPILOGUE=kcat).

    xc = [x | s·x·A_gᵀ | s·x·A_uᵀ]    [gate | up] = xc·[[W_g, B_g, 0], [W_u, 0, B_u]]ᵀ
    hc = [h | s·h·A_dᵀ], h = act(gate)·up           y = hc·[W_d | B_d]ᵀ

The wide operands are built by `torch.cat` inside the compiled layer, so the kernels that make x
(the norm) and h (SwiGLU) write them where they go, and the frozen GEMMs read no C operand (on an
H100 cuBLAS's beta-add GEMMs take ~15 % more than bare ones, K-extended ones within 4 %:
bench/lora_kcat.py). gate and up are one GEMM, so backward needs no sum of their input
gradients either (the compiler makes that sum another beta-add GEMM). Each weight block is one
buffer whose first columns are the frozen weights (the base layers' weights become views of it:
no second copy) and whose B blocks are copied in before each forward (`fill`, from a forward
pre-hook on the decoder stack, outside any compiled region; B stays the fp32 parameter peft
made). Backward: one N-extended GEMM gives [dy·W | dy·B]; dB = dyᵀ·(s·u) from the saved wide
operand; the adapter's part of dx, (s·dy·B)·A, is a traced rank-r product. An MLP whose projections have dropout, a bias or unequal ranks or
scales keeps the per-linear ops (lora_fused), as do the attention projections.

As first built (ff4d0f6) this widened each linear inside its opaque op, copying x and dy into
the wide operands: 7 % slower than "op" on the 7B preset (docs/benchmarks.md)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tunedeck.core.train.lora_dropout import dropout_p

PROJ = ("gate_proj", "up_proj", "down_proj")
# MLPs whose forward is down(act(gate(x)) · up(x)), the one wide_forward computes
GATED = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP")


class _Wide(torch.autograd.Function):
    """y = xc·wᵀ for a wide operand xc and weight block w; blocks[i] = (first row, last row,
    first column) of the B block in w whose gradient goes to bs[i] (passed only to receive it)."""

    @staticmethod
    def forward(ctx, xc: Tensor, w: Tensor, blocks: tuple, *bs: Tensor) -> Tensor:
        ctx.save_for_backward(xc, w)
        ctx.blocks, ctx.r = blocks, bs[0].shape[1]
        return xc @ w.t()

    @staticmethod
    def backward(ctx, dy):
        xc, w = ctx.saved_tensors
        r = ctx.r
        dbs = [dy[:, lo:hi].t() @ xc[:, c : c + r] for lo, hi, c in ctx.blocks]  # s·dyᵀ·u
        return dy @ w, None, None, *dbs


def _ab(proj: nn.Module) -> tuple[Tensor, Tensor]:
    return proj.lora_A["default"].weight, proj.lora_B["default"].weight


def widens(mlp: nn.Module, eligible) -> bool:
    """Whether `mlp` is one of the GATED MLPs and its three projections are eligible peft LoRA
    Linears without dropout or bias, of one rank and one scale."""
    projs = [getattr(mlp, name, None) for name in PROJ]
    if type(mlp).__name__ not in GATED or not all(p is not None and eligible(p) for p in projs):
        return False
    return (
        all(dropout_p(p) == 0 and p.base_layer.bias is None for p in projs)
        and len({_ab(p)[0].shape[0] for p in projs}) == 1
        and len({float(p.scaling["default"]) for p in projs}) == 1
    )


def widen(mlp: nn.Module) -> None:
    """Give the MLP its two weight buffers ([[W_g, B_g, 0], [W_u, 0, B_u]] and [W_d | B_d]) and
    make the base weights views of them."""
    gate, up, down = (getattr(mlp, name) for name in PROJ)
    r = _ab(gate)[0].shape[0]
    wg, wu, wd = (p.base_layer.weight for p in (gate, up, down))
    (m, k), kd = wg.shape, wd.shape[1]
    gu = torch.zeros(2 * m, k + 2 * r, dtype=wg.dtype, device=wg.device)
    dn = torch.zeros(wd.shape[0], kd + r, dtype=wd.dtype, device=wd.device)
    with torch.no_grad():
        gu[:m, :k].copy_(wg)
        gu[m:, :k].copy_(wu)
        dn[:, :kd].copy_(wd)
    gate.base_layer.weight = nn.Parameter(gu[:m, :k], requires_grad=False)
    up.base_layer.weight = nn.Parameter(gu[m:, :k], requires_grad=False)
    down.base_layer.weight = nn.Parameter(dn[:, :kd], requires_grad=False)
    mlp.register_buffer("_tunedeck_w_gu", gu, persistent=False)
    mlp.register_buffer("_tunedeck_w_down", dn, persistent=False)
    fill(mlp)


def _blocks(mlp: nn.Module):
    """(buffer, B, its first row, its first column) of gate, up and down."""
    gate, up, down = (getattr(mlp, name) for name in PROJ)
    (m, k), r = gate.base_layer.weight.shape, _ab(gate)[0].shape[0]
    gu, dn = mlp._tunedeck_w_gu, mlp._tunedeck_w_down
    return (
        (gu, _ab(gate)[1], 0, k),
        (gu, _ab(up)[1], m, k + r),
        (dn, _ab(down)[1], 0, down.base_layer.weight.shape[1]),
    )


def fill(mlp: nn.Module) -> None:
    """Copy the MLP's B blocks into its buffers. Every forward: fused AdamW (the CUDA default)
    updates B in place without bumping its version counter, so no cheaper test tells when."""
    with torch.no_grad():
        for buf, b, row, col in _blocks(mlp):
            buf[row : row + b.shape[0], col : col + b.shape[1]].copy_(b)


def stack(model: nn.Module, mlps: list[nn.Module]) -> nn.Module:
    """The module whose forward runs every one of `mlps` and is itself outside the compiled
    layers: the parent of the ModuleList of decoder layers (the trainer calls that stack, not
    the peft wrapper), else `model`."""
    names = {id(m): n for n, m in model.named_modules()}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and all(
            names[id(m)].startswith(name + ".") for m in mlps
        ):
            return model.get_submodule(name.rpartition(".")[0])
    return model


def adapter_on(proj: nn.Module) -> bool:
    """A peft LoRA layer runs its one adapter, 'default', unmerged (what the fused paths run)."""
    return not (proj.disable_adapters or proj.merged) and list(proj.active_adapters) == ["default"]


def wide_forward(self, x: Tensor) -> Tensor:
    """forward of a widened gated MLP (peft's layers' own path where an adapter is off)."""
    gate, up, down = (getattr(self, name) for name in PROJ)
    if not all(adapter_on(p) for p in (gate, up, down)):
        return self._tunedeck_mlp_forward(x)
    dev = x.device.type
    gu, dn = self._tunedeck_w_gu, self._tunedeck_w_down
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else gu.dtype
    (_, bg, _, cg), (_, bu, m, cu), (_, bd, _, cd) = _blocks(self)
    s = float(gate.scaling["default"])
    shape = x.shape

    def w(buf: Tensor) -> Tensor:
        return buf if buf.dtype == dt else buf.to(dt)

    with torch.autocast(dev, enabled=False):
        x2 = x.reshape(-1, shape[-1]).to(dt)
        a = torch.cat([_ab(gate)[0], _ab(up)[0]]).to(dt)  # (2r, k)
        xc = torch.cat([x2, (x2 @ a.t()) * s], 1)
        y = _Wide.apply(xc, w(gu), ((0, m, cg), (m, 2 * m, cu)), bg.to(dt), bu.to(dt))
        h = self.act_fn(y[:, :m]) * y[:, m:]
        hc = torch.cat([h, (h @ _ab(down)[0].to(dt).t()) * s], 1)
        y = _Wide.apply(hc, w(dn), ((0, dn.shape[0], cd),), bd.to(dt))
    return y.view(*shape[:-1], y.shape[-1])
