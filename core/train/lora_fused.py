"""LoRA linear layers with the adapter folded into the frozen matmul's memory passes.

peft computes y = x·Wᵀ and, separately, l = s·(x·Aᵀ)·Bᵀ, then adds them: the full-size output
is written twice, read twice and written again; its backward likewise writes the adapter's
input gradient in full and adds it to the base one. On a 7B model these passes over
8192 × 18944 tensors are most of what is left once compile has fused the rest (profile in
docs/benchmarks.md). Here the adapter's product enters the frozen GEMM as its C operand
(addmm: read once in the epilogue), and the backward accumulates the adapter's input gradient
into the base one in place (addmm_). Same math, same parameters and state dict as peft.

How the adapter meets the frozen GEMM (TUNEDECK_LORA_EPILOGUE, a measurement switch):
"op" runs the GEMM and the adapter's add as opaque ops that accumulate in place into their
own output; "after" likewise, but the rank-r product is added into the big GEMM's output by a
second in-place GEMM, so the big one reads no C (unmeasured); "1" traces addmm, for which the
compiler hands ATen a fresh output, so ATen first copies the full-size C operand into it
(80 ms a step of the 7B preset in bf16, 40 ms in fp8, where the compiler makes an addmm of the
out-of-place sum); "0" adds out of place; "kcat" runs the gated MLPs and the attention blocks
with their adapters as extra K columns of the frozen GEMMs (lora_kcat), "kcat-mlp" the MLPs only,
and the other linears as "op"; "triton" runs each linear as one Triton GEMM kernel that takes
the adapter as one more K step (lora_triton: +2.7–3.1 % on H100s, not yet measured on the H200;
"triton-loop" also computes x·Aᵀ in that kernel, −13.7 %; "triton-wide" runs each group of a
block's projections, q/k/v and gate/up, as one such kernel, "triton-wide-mlp" only gate/up, the
other linears as "triton", on an H100 no faster than "triton"; "triton-swiglu" runs the gated
MLPs as triton-wide-mlp does with their SwiGLU inside the GEMMs around it (swiglu_triton);
layers with dropout run "op").
In fp8 "1" and "0" add out of place, "after", the kcats and "triton-loop" are "op", and the
other Tritons run each fp8 product and its adapter as one Triton kernel. The default is what
was measured (default_epilogue): "triton" on Hopper GPUs (H100s: +2.7–3.1 % tokens/s in bf16,
+11.9–13.3 % with the fp8 base), "op" elsewhere ("op": +3 % against "1" in bf16 and +3.7 % in fp8,
on an H200).
"""

from __future__ import annotations

import types

import torch
from torch import Tensor, nn

from tunedeck.core.estimate.fusion import (
    EPILOGUES,
    KCATS,
    TRITONS,
    WIDE_TRITONS,
    dropout_fuses,
    fused_on,
    lora_epilogue,
)
from tunedeck.core.spec import FP8_MIN_CC
from tunedeck.core.train import lora_kcat, lora_triton
from tunedeck.core.train.lora_dropout import (
    active_dropout,
    adapter_backward,
    adapter_in,
    dropout_p,
    state_bytes,
)


class _LoraLinear(torch.autograd.Function):
    """y = x·Wᵀ + bias + s·(x·Aᵀ)·Bᵀ for 2-d x in one dtype; W and bias frozen.

    epilogue: the adapter's product enters the frozen GEMM as its C operand (addmm) and its
    input gradient is accumulated in place; otherwise both are added out of place, which the
    compiler can fuse into whatever reads the sum next (ATen copies a full-size C operand into
    addmm's output before the GEMM: a measurement switch, TUNEDECK_LORA_EPILOGUE=0)."""

    @staticmethod
    def forward(ctx, x, weight, bias, a, b, scale, epilogue=True):
        u = x @ a.t()  # (N, r)
        bs = b.t() * scale  # (r, out)
        if epilogue:
            c = torch.addmm(bias, u, bs) if bias is not None else u @ bs
            y = torch.addmm(c, x, weight.t())  # c read once, in the GEMM's epilogue
        else:
            y = x @ weight.t() + u @ bs
            if bias is not None:
                y = y + bias
        ctx.save_for_backward(x, weight, a, bs, u)
        ctx.scale, ctx.epilogue = scale, epilogue
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, a, bs, u = ctx.saved_tensors
        g = dy @ bs.t()  # (N, r) = s·dy·B
        if ctx.epilogue:
            dx = dy @ weight
            dx.addmm_(g, a)  # += s·dy·B·A, in place
        else:
            dx = dy @ weight + g @ a
        da = g.t() @ x  # (r, in)
        db = (dy.t() @ u) * ctx.scale  # (out, r)
        return dx, None, None, da, db, None, None


def adapter_linear(x, weight, bias, a, b, scale, after, p) -> tuple[Tensor, Tensor, Tensor]:
    """lora_linear's math on plain tensors (qlora_fused's op runs it on its dequantized W)."""
    u, state = adapter_in(x, a, p)
    bs = b.t() * scale
    if after:
        y = torch.addmm(bias, x, weight.t()) if bias is not None else x @ weight.t()
        return y.addmm_(u, bs), u, state
    y = torch.addmm(bias, u, bs) if bias is not None else u @ bs
    return y.addmm_(x, weight.t()), u, state


def adapter_linear_backward(
    dy, x, weight, a, b, u, scale, after, state, p
) -> tuple[Tensor, Tensor, Tensor]:
    """lora_linear_backward's math on plain tensors."""
    if after and not p:
        g = (dy @ b) * scale  # (N, r) = s·dy·B
        return (dy @ weight).addmm_(g, a), g.t() @ x, (dy.t() @ u) * scale
    t, da, db = adapter_backward(dy, x, a, b, u, scale, state, p)
    return t.addmm_(dy, weight), da, db


def fake_outputs(x: Tensor, out_features: int, a: Tensor, p: float) -> tuple[Tensor, ...]:
    """The shapes of (y, u, state) for the ops' fake impls (state on the CPU, as drawn)."""
    state = torch.empty(state_bytes(x.device, p), dtype=torch.uint8, device="cpu")
    return x.new_empty(x.shape[0], out_features), x.new_empty(x.shape[0], a.shape[0]), state


@torch.library.custom_op("tunedeck::lora_linear", mutates_args=())
def lora_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    a: Tensor,
    b: Tensor,
    scale: float,
    after: bool,
    p: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, u, state): y = x·Wᵀ + bias + s·u·Bᵀ with u = D(x)·Aᵀ, accumulated in place: the
    big GEMM into the adapter's product (its C operand), or, `after`, the adapter's rank-r GEMM
    into the big one's output (the big GEMM then runs without reading a C). Opaque to the
    compiler, so ATen sees its own buffer as C and copies nothing. D is the adapter's dropout
    with probability p, drawn here; `state` is what backward draws it again from
    (lora_dropout)."""
    return adapter_linear(x, weight, bias, a, b, scale, after, p)


@lora_linear.register_fake
def _(x, weight, bias, a, b, scale, after, p):
    return fake_outputs(x, weight.shape[0], a, p)


@torch.library.custom_op("tunedeck::lora_linear_backward", mutates_args=())
def lora_linear_backward(
    dy: Tensor,
    x: Tensor,
    weight: Tensor,
    a: Tensor,
    b: Tensor,
    u: Tensor,
    scale: float,
    after: bool,
    state: Tensor,
    p: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dA, dB) of lora_linear; dx = dy·W + D(s·dy·B·A) accumulated in place, in the same
    order as the forward's (with dropout, the adapter's part first)."""
    return adapter_linear_backward(dy, x, weight, a, b, u, scale, after, state, p)


@lora_linear_backward.register_fake
def _(dy, x, weight, a, b, u, scale, after, state, p):
    return torch.empty_like(x), torch.empty_like(a), torch.empty_like(b)


def _lora_setup(ctx, inputs, output):
    x, weight, _bias, a, b, scale, after, p = inputs
    ctx.save_for_backward(x, weight, a, b, output[1], output[2])
    ctx.scale, ctx.after, ctx.p = scale, after, p


def _lora_backward(ctx, dy, _du, _dstate):
    x, weight, a, b, u, state = ctx.saved_tensors
    dx, da, db = lora_linear_backward(dy, x, weight, a, b, u, ctx.scale, ctx.after, state, ctx.p)
    return dx, None, None, da, db, None, None, None


lora_linear.register_autograd(_lora_backward, setup_context=_lora_setup)


E4M3 = torch.float8_e4m3fn
_E4M3_MAX = torch.finfo(E4M3).max


def quant_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 values and the fp32 (rows, 1) factors that undo their scaling: one scale per row,
    the row's largest magnitude mapped to e4m3's largest (448). Compile fuses it into one pass
    with whatever produced `t`."""
    amax = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = _E4M3_MAX / amax
    return (t.float() * scale).clamp(-_E4M3_MAX, _E4M3_MAX).to(E4M3), scale.reciprocal()


@torch.library.custom_op("tunedeck::scaled_mm_add", mutates_args=())
def scaled_mm_add(
    a8: Tensor, sa: Tensor, b8: Tensor, sb: Tensor, bias: Tensor | None, u: Tensor, v: Tensor
) -> Tensor:
    """(a8·sa)(b8·sb) + bias + u·v in u's dtype: the adapter accumulated in place into the fp8
    GEMM's own output. Opaque, so the compiler cannot turn the sum into an addmm whose C
    operand ATen would first copy (40 ms a step of the 7B preset, profile in docs)."""
    y = torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, bias=bias, out_dtype=u.dtype)
    return y.addmm_(u, v)


@scaled_mm_add.register_fake
def _(a8, sa, b8, sb, bias, u, v):
    return a8.new_empty((a8.shape[0], b8.shape[1]), dtype=u.dtype)


class _LoraLinearFP8(torch.autograd.Function):
    """_LoraLinear with the frozen products in fp8: x·Wᵀ from e4m3 x (a scale per row) and
    e4m3 W (a scale per output channel); dy·W from e4m3 dy (per row) and a second e4m3 copy
    of W laid out the other way (a scale per input channel). The adapter's products and
    gradients stay in the input's dtype. Hopper's fp8 GEMMs take only this layout pair
    (row-major A, column-major B), hence the two copies: together the bytes of one bf16 W.

    add: "op" adds the adapter inside the opaque scaled_mm_add, into the fp8 GEMM's own output;
    "triton" (the default on Hopper) inside one Triton kernel that takes it as one more K step
    (lora_triton.scaled_lora_mm); otherwise out of place. Adding it in place outside such an
    op (y.addmm_ on _scaled_mm's result) compiled to all-zero gradients on an H200 (torch
    2.11), though eager and CPU were right; "op" and out of place match eager compiled on the
    H200 (bench/fp8_check.py: "committed" and "out-of-place")."""

    @staticmethod
    def forward(ctx, x, w8, sw, wt8, swt, bias, a, b, scale, add="0"):
        x8, sx = quant_rows(x)
        u = x @ a.t()  # (N, r)
        bs = b.t() * scale  # (r, out)
        ctx.save_for_backward(x, wt8, swt, a, bs, u)
        ctx.scale, ctx.add = scale, add
        if add in FP8_ADDS:
            return FP8_ADDS[add](x8, sx, w8.t(), sw, bias, u, bs)
        y = torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw, bias=bias, out_dtype=x.dtype)
        return y + u @ bs

    @staticmethod
    def backward(ctx, dy):
        x, wt8, swt, a, bs, u = ctx.saved_tensors
        dy8, sdy = quant_rows(dy)
        g = dy @ bs.t()  # (N, r) = s·dy·B
        da = g.t() @ x
        db = (dy.t() @ u) * ctx.scale
        if ctx.add in FP8_ADDS:
            dx = FP8_ADDS[ctx.add](dy8, sdy, wt8.t(), swt, None, g, a)
        else:
            dx = torch._scaled_mm(dy8, wt8.t(), scale_a=sdy, scale_b=swt, out_dtype=dy.dtype)
            dx = dx + g @ a
        return dx, None, None, None, None, None, da, db, None, None


# the fp8 layer's epilogues that add the adapter inside one opaque op
FP8_ADDS = {"op": scaled_mm_add, "triton": lora_triton.scaled_mm_add_triton}


def to_fp8(module: nn.Module) -> None:
    """Replace a LoRA Linear's frozen bf16 weight by its two e4m3 copies (same bytes): the
    weight parameter is left empty, its element count kept for FLOP accounting."""
    w = module.base_layer.weight.detach()
    # contiguous both: an elementwise op keeps its input's strides, and cuBLASLt takes
    # only a row-major (N, K) B (seen as column-major through .t())
    w8, sw = quant_rows(w.contiguous())  # (out, in), a scale per output
    wt8, swt = quant_rows(w.t().contiguous())  # (in, out), a scale per input
    # plain attributes, not buffers: DDP would broadcast buffers before every forward
    module._tunedeck_fp8 = (w8, sw.t().contiguous(), wt8, swt.t().contiguous())
    module._tunedeck_numel = w.numel()
    module._tunedeck_wdtype = w.dtype
    module.base_layer.weight = nn.Parameter(w.new_empty(0), requires_grad=False)


def weight_numel(p: Tensor) -> int:
    """A parameter's weights: a 4-bit one (bitsandbytes packs two in a byte) by its shape."""
    qs = getattr(p, "quant_state", None)
    shape = getattr(qs, "shape", None)
    return int(torch.Size(shape).numel()) if shape is not None else p.numel()


def base_numel(model: nn.Module) -> int:
    """Parameters of the model outside LoRA's adapters, fp8-converted and 4-bit weights
    counted whole (MFU's FLOPs: the 7B QLoRA preset read 33 % for 54 %)."""
    n = sum(weight_numel(p) for name, p in model.named_parameters() if "lora_" not in name)
    return n + sum(getattr(m, "_tunedeck_numel", 0) for m in model.modules())


def _fused_forward(self, x, *args, **kwargs):
    """forward of a peft LoRA Linear (one adapter, not merged), fused."""
    if not lora_kcat.adapter_on(self):
        if hasattr(self, "_tunedeck_fp8"):  # peft's own forward would meet an empty weight
            raise RuntimeError(
                "method.fp8_base: this layer's frozen weight lives in fp8 "
                "copies; running it with the adapter disabled, merged or "
                "switched is not supported"
            )
        return self._tunedeck_peft_forward(x, *args, **kwargs)
    base = self.base_layer
    dev = x.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else base.weight.dtype
    a = self.lora_A["default"].weight
    b = self.lora_B["default"].weight
    shape = x.shape
    fp8 = getattr(self, "_tunedeck_fp8", None)
    if fp8 is not None:
        dt = (
            torch.get_autocast_dtype(dev)
            if torch.is_autocast_enabled(dev)
            else self._tunedeck_wdtype
        )
        with torch.autocast(dev, enabled=False):
            bias = None if base.bias is None else base.bias.to(dt)
            y = _LoraLinearFP8.apply(
                x.reshape(-1, shape[-1]).to(dt),
                *fp8,
                bias,
                a.to(dt),
                b.to(dt),
                float(self.scaling["default"]),
                "op" if self._tunedeck_epilogue == "after" else self._tunedeck_epilogue,
            )
        return y.view(*shape[:-1], y.shape[-1])
    with torch.autocast(dev, enabled=False):
        w = base.weight if base.weight.dtype == dt else base.weight.to(dt)
        bias = None if base.bias is None else base.bias.to(dt)
        if self._tunedeck_epilogue in TRITONS:
            y, _ = lora_triton.lora_linear_triton(
                x.reshape(-1, shape[-1]).to(dt),
                w,
                bias,
                a.to(dt),
                b.to(dt),
                float(self.scaling["default"]),
                lora_triton.EPILOGUE_MODES[self._tunedeck_epilogue],
            )
            return y.view(*shape[:-1], y.shape[-1])
        if self._tunedeck_epilogue in ("op", "after"):
            x2 = x.reshape(-1, shape[-1]).to(dt)
            y, _, _ = lora_linear(
                x2,
                w,
                bias,
                a.to(dt),
                b.to(dt),
                float(self.scaling["default"]),
                self._tunedeck_epilogue == "after",
                active_dropout(self),
            )
            return y.view(*shape[:-1], y.shape[-1])
        y = _LoraLinear.apply(
            x.reshape(-1, shape[-1]).to(dt),
            w,
            bias,
            a.to(dt),
            b.to(dt),
            float(self.scaling["default"]),
            self._tunedeck_epilogue != "0",
        )
    return y.view(*shape[:-1], y.shape[-1])


def eligible(module: nn.Module) -> bool:
    """A peft LoRA Linear this module can run: a plain nn.Linear base, the one adapter
    'default', plain dropout below 1 or none, no DoRA, no magnitude vector, not
    fan_in_fan_out."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return False
    if type(module) is not LoraLinear or type(module.base_layer) is not nn.Linear:
        return False
    if list(module.lora_A.keys()) != ["default"] or getattr(module, "fan_in_fan_out", False):
        return False
    return not module.use_dora.get("default", False) and dropout_p(module) < 1.0


def fp8_problem(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> str | None:
    """Why method.fp8_base cannot run on `device` computing in `dtype`, or None. CUDA's
    row-wise scaled products return bf16 only; CPU's return any float dtype."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < FP8_MIN_CC:
            return (
                f"method.fp8_base needs a GPU with fp8 matrix units (compute capability "
                f"8.9 or newer: L40S, H100, H200...); {torch.cuda.get_device_name(device)} "
                f"is {major}.{minor}. Set method.fp8_base = false"
            )
        if dtype != torch.bfloat16:
            return (
                f"method.fp8_base computes in bf16 on a GPU (its fp8 products return "
                f"bf16); model.dtype makes it {str(dtype).removeprefix('torch.')}. Set "
                f'model.dtype = "bfloat16" or method.fp8_base = false'
            )
    return None


def fuse_lora(model: nn.Module, device: torch.device | None = None, fp8: bool = False) -> int:
    """Switch every eligible LoRA Linear of `model` to the fused forward; how many.

    On by default on CUDA, where it was measured under compile (7B, one H200: +2.2 % tokens/s
    and 1.5 GiB less reserved, docs/benchmarks.md); CPU runs keep peft's layers.
    TUNEDECK_FUSED_LORA=0 turns it off anywhere, =1 on anywhere. `fp8` (method.fp8_base)
    always fuses, and moves each frozen weight to fp8 (to_fp8). A 4-bit base's layers fuse
    too (qlora_fused: 7B QLoRA on an H100, +4.1 % tokens/s and 19.7 GiB less). Layers with
    dropout fuse where the opaque ops run them (lora_dropout), not in fp8 or the traced
    epilogues."""
    if not fused_on(device.type if device is not None else "", fp8):
        return 0
    n = 0
    epilogue = lora_epilogue(default_epilogue(device))
    if epilogue not in EPILOGUES:
        raise ValueError(
            f"TUNEDECK_LORA_EPILOGUE={epilogue!r}: expected one of {', '.join(EPILOGUES)}"
        )
    if epilogue.startswith("triton"):
        lora_triton.gemm_setting()  # a bad TUNEDECK_LORA_GEMM fails here, not at a first forward
    from tunedeck.core.train.qlora_fused import eligible_4bit, fused_forward_4bit, quant_args

    no_dropout = not dropout_fuses(fp8, epilogue)
    for m in model.modules():
        if eligible(m) and not (no_dropout and dropout_p(m) > 0):
            m._tunedeck_epilogue = layer_epilogue(epilogue, m, fp8)
            if fp8:
                to_fp8(m)
            forward = _fused_forward
        elif eligible_4bit(m):
            m._tunedeck_quant = quant_args(m.base_layer.weight)
            forward = fused_forward_4bit
        else:
            continue
        m._tunedeck_dropout = dropout_p(m)
        m._tunedeck_peft_forward = m.forward
        m.forward = types.MethodType(forward, m)
        n += 1
    if epilogue in KCATS + WIDE_TRITONS and not fp8:
        _widen_blocks(
            model,
            attention=epilogue in ("kcat", "triton-wide"),
            triton=epilogue in WIDE_TRITONS,
            swiglu=epilogue == "triton-swiglu",
        )
    return n


def default_epilogue(device: torch.device | None) -> str:
    """ "triton" where it was measured faster, Hopper GPUs (compute capability 9.x, whose TMA
    the kernel reads through) with Triton installed; "op" everywhere else, also where no
    GPU is there to ask (the layers can be swapped for a CUDA device before one is used)."""
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return "op"  # asked before Triton's import, which a CPU-only machine need not pay
    on_hopper = torch.cuda.get_device_capability(device)[0] == 9
    return "triton" if on_hopper and lora_triton.available() else "op"


def layer_epilogue(epilogue: str, module: nn.Module, fp8: bool) -> str:
    """What one fused layer runs: the kcats widen blocks and leave their linears "op"; the
    Triton kernels take no dropout and need Triton; an fp8 base runs only "triton" of them
    (x·Aᵀ stays a 16-bit GEMM)."""
    if epilogue in KCATS or (fp8 and epilogue == "triton-loop"):
        return "op"
    if epilogue in TRITONS:
        if not lora_triton.available():
            raise RuntimeError(
                f"TUNEDECK_LORA_EPILOGUE={epilogue}: the triton package is not installed"
            )
        if dropout_p(module):
            return "op"
        return "triton" if epilogue in WIDE_TRITONS else epilogue
    return epilogue


def _widen_blocks(model: nn.Module, attention: bool, triton: bool, swiglu: bool = False) -> None:
    """TUNEDECK_LORA_EPILOGUE=kcat(-mlp), triton-wide(-mlp), triton-swiglu: the blocks lora_kcat
    can run take its forwards; with `swiglu` the MLPs swiglu_triton fits run its op."""
    wide = [m for m in model.modules() if lora_kcat.widens(m, eligible, attention)]
    for block in wide:
        lora_kcat.widen(block, triton)
        block._tunedeck_swiglu = swiglu and lora_kcat.swiglu_fits(block)
        block._tunedeck_block_forward = block.forward
        forward = (
            lora_kcat.wide_mlp
            if lora_kcat.groups(block) is lora_kcat.MLP
            else lora_kcat.wide_attention
        )
        block.forward = types.MethodType(forward, block)
    if wide and not triton:  # the optimizer changes B between forwards; the buffers follow it

        def refill(*_):
            for block in wide:
                lora_kcat.fill(block)

        lora_kcat.stack(model, wide).register_forward_pre_hook(refill)
