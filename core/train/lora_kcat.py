"""LoRA adapters as extra K columns of the frozen GEMMs (TUNEDECK_LORA_EPILOGUE=kcat, kcat-mlp).

The projections of a block that read one input are one GEMM (a group):

    xc = [x | s·x·A_1ᵀ | s·x·A_2ᵀ ...]      [y_1 | y_2 ...] = xc·[[W_1, B_1, 0], [W_2, 0, B_2] ...]ᵀ

Gated MLPs: gate and up are one group over the norm's output, down one over act(gate)·up.
Attention (kcat only): q, k and v are one group, o one over the attention's output.

The wide operands are built by `torch.cat` inside the compiled layer, so the kernels that make x
(the norm, SwiGLU) write them where they go, and the frozen GEMMs read no C operand (on an H100
cuBLAS's beta-add GEMMs take ~15 % more than bare ones, K-extended ones within 4 %:
bench/lora_kcat.py). A group's projections need no sum of their input gradients in backward
either (the compiler makes that sum another beta-add GEMM). Each group's weights are one buffer
whose first columns are the frozen weights (the base layers' weights become views of it: no
second copy) and whose B blocks are copied in before each forward (`fill`, from a forward
pre-hook on the decoder stack, outside any compiled region; B stays the fp32 parameter peft
made). Backward: one N-extended GEMM gives [dy·W | dy·B]; dB = s·dyᵀ·v from the saved rank-r
v = x·Aᵀ; the adapter's part of dx, (s·dy·B)·A, is a traced rank-r product. A block whose
projections have dropout or unequal ranks or scales keeps the per-linear ops (lora_fused).

TUNEDECK_LORA_EPILOGUE=triton-wide (triton-wide-mlp: the MLPs only) keeps the groups and runs
each as one Triton kernel instead (lora_triton): its buffers hold only the frozen weights, x
is not copied into a wide operand, and the kernel takes every adapter of the group as one K
step of n·r against the block-diagonal of their Bᵀs, so k and v (N = 512 on the 7B) no longer
run as GEMMs of their own.

As first built (ff4d0f6) this widened each linear inside its opaque op, copying x and dy into
the wide operands: 7 % slower than "op" on the 7B preset (docs/benchmarks.md)."""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from tunedeck.core.train import lora_triton, swiglu_triton
from tunedeck.core.train.lora_dropout import dropout_p

MLP = (("gate_proj", "up_proj"), ("down_proj",))
ATTENTION = (("q_proj", "k_proj", "v_proj"), ("o_proj",))
# the blocks whose forward wide_mlp (down(act(gate(x)) · up(x))) and wide_attention (the
# transformers 5 q/k/v, RoPE, attention interface, o sequence) reproduce
GATED = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP")
ATTENDS = ("LlamaAttention", "MistralAttention", "Qwen2Attention")
# the sliding window each of ATTENDS hands its attention function (Llama none)
WINDOW = {
    "Qwen2Attention": lambda block: block.sliding_window,
    "MistralAttention": lambda block: getattr(block.config, "sliding_window", None),
}


def groups(block: nn.Module) -> tuple[tuple[str, ...], ...] | None:
    """MLP or ATTENTION for a block whose forward lora_kcat reproduces, else None."""
    name = type(block).__name__
    return MLP if name in GATED else ATTENTION if name in ATTENDS else None


class _Wide(torch.autograd.Function):
    """y = xc·wᵀ for a wide operand xc = [x | s·v] (v = x·Aᵀ) and weight block w; blocks[i] =
    (first row, last row, first column in v) of the B block in w whose gradient goes to bs[i]
    (passed only to receive it). Backward keeps v, the rank-r GEMM's own output, not a slice of
    xc: that would keep all of xc alive (the compiler writes s·v and x into xc in place)."""

    @staticmethod
    def forward(ctx, xc: Tensor, v: Tensor, s: float, w: Tensor, blocks: tuple, *bs) -> Tensor:
        ctx.save_for_backward(v, w)
        ctx.blocks, ctx.r, ctx.s = blocks, bs[0].shape[1], s
        return xc @ w.t()

    @staticmethod
    def backward(ctx, dy):
        v, w = ctx.saved_tensors
        r, s = ctx.r, ctx.s
        dbs = [(dy[:, lo:hi].t() @ v[:, c : c + r]) * s for lo, hi, c in ctx.blocks]
        return dy @ w, None, None, None, None, *dbs


def _ab(proj: nn.Module) -> tuple[Tensor, Tensor]:
    return proj.lora_A["default"].weight, proj.lora_B["default"].weight


def _projs(block: nn.Module, group: tuple[str, ...]) -> list[nn.Module]:
    return [getattr(block, name) for name in group]


def _buffer_name(group: tuple[str, ...]) -> str:
    return "_tunedeck_w_" + group[0]


def widens(block: nn.Module, eligible, attention: bool = True) -> bool:
    """Whether `block` is a GATED MLP (or, with `attention`, one of ATTENDS) whose projections
    are eligible peft LoRA Linears without dropout, of one rank and one scale."""
    gs = groups(block)
    if gs is None or (gs is ATTENTION and not attention):
        return False
    projs = [getattr(block, name, None) for g in gs for name in g]
    if not all(p is not None and eligible(p) for p in projs):
        return False
    return (
        all(dropout_p(p) == 0 for p in projs)
        and len({_ab(p)[0].shape[0] for p in projs}) == 1
        and len({float(p.scaling["default"]) for p in projs}) == 1
    )


def widen(block: nn.Module, triton: bool = False) -> None:
    """Give each group of the block its weight buffer ([[W_1, B_1, 0], [W_2, 0, B_2] ...]; with
    `triton` only [[W_1], [W_2] ...], the kernel taking the B blocks as its K step) and make
    the base weights views of it."""
    block._tunedeck_triton = triton
    for group in groups(block):
        projs = _projs(block, group)
        r = 0 if triton else _ab(projs[0])[0].shape[0]
        ws = [p.base_layer.weight for p in projs]
        k = ws[0].shape[1]
        buf = torch.zeros(
            sum(w.shape[0] for w in ws), k + r * len(ws), dtype=ws[0].dtype, device=ws[0].device
        )
        row = 0
        for p, w in zip(projs, ws):
            with torch.no_grad():
                buf[row : row + w.shape[0], :k].copy_(w)
            p.base_layer.weight = nn.Parameter(buf[row : row + w.shape[0], :k], requires_grad=False)
            row += w.shape[0]
        block.register_buffer(_buffer_name(group), buf, persistent=False)
    if groups(block) is ATTENTION:  # what the forward reads from the model's own module
        hf = sys.modules[type(block).__module__]
        block._tunedeck_rope = hf.apply_rotary_pos_emb
        block._tunedeck_attention = hf.ALL_ATTENTION_FUNCTIONS
        block._tunedeck_eager = hf.eager_attention_forward
        window = WINDOW.get(type(block).__name__)
        block._tunedeck_window = {"sliding_window": window(block)} if window else {}
    if not triton:  # Triton's buffers hold no B
        fill(block)


def _blocks(block: nn.Module, group: tuple[str, ...]):
    """(B, its first row in the group's buffer, its first column in v = x·A_catᵀ), per
    projection; in the buffer B's columns start k (the input width) further."""
    projs = _projs(block, group)
    r = _ab(projs[0])[0].shape[0]
    row, out = 0, []
    for i, p in enumerate(projs):
        out.append((_ab(p)[1], row, i * r))
        row += p.base_layer.weight.shape[0]
    return out


def fill(block: nn.Module) -> None:
    """Copy the block's B blocks into its buffers. Every forward: fused AdamW (the CUDA default)
    updates B in place without bumping its version counter, so no cheaper test tells when."""
    with torch.no_grad():
        for group in groups(block):
            buf = getattr(block, _buffer_name(group))
            k = _projs(block, group)[0].base_layer.weight.shape[1]
            for b, row, col in _blocks(block, group):
                buf[row : row + b.shape[0], k + col : k + col + b.shape[1]].copy_(b)


def stack(model: nn.Module, blocks: list[nn.Module]) -> nn.Module:
    """The module whose forward runs every one of `blocks` and is itself outside the compiled
    layers: the parent of the ModuleList of decoder layers (the trainer calls that stack, not
    the peft wrapper), else `model`."""
    names = {id(m): n for n, m in model.named_modules()}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and all(
            names[id(m)].startswith(name + ".") for m in blocks
        ):
            return model.get_submodule(name.rpartition(".")[0])
    return model


def adapter_on(proj: nn.Module) -> bool:
    """A peft LoRA layer runs its one adapter, 'default', unmerged (what the fused paths run)."""
    return not (proj.disable_adapters or proj.merged) and list(proj.active_adapters) == ["default"]


def _all_on(block: nn.Module) -> bool:
    return all(adapter_on(p) for g in groups(block) for p in _projs(block, g))


def _dtype(block: nn.Module, x: Tensor) -> torch.dtype:
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return getattr(block, _buffer_name(groups(block)[0])).dtype


def _group(block: nn.Module, group: tuple[str, ...], x2: Tensor, dt: torch.dtype) -> Tensor:
    """[y_1 | y_2 ...] of the group's projections for rows x2 (autocast off, dtype dt)."""
    projs = _projs(block, group)
    buf = getattr(block, _buffer_name(group))
    bl = _blocks(block, group)
    a = torch.cat([_ab(p)[0] for p in projs]) if len(projs) > 1 else _ab(projs[0])[0]
    s = float(projs[0].scaling["default"])
    biases = [p.base_layer.bias for p in projs]
    if block._tunedeck_triton:  # one kernel: the group's GEMM, bias and adapters
        bs = torch.cat([b for b, _, _ in bl]) if len(bl) > 1 else bl[0][0]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([_bias(p, dt) for p in projs])
        return lora_triton.lora_linear_triton(
            x2,
            buf if buf.dtype == dt else buf.to(dt),
            bias,
            a.to(dt),
            bs.to(dt),
            s,
            lora_triton.MODE,
            [p.base_layer.weight.shape[0] for p in projs],
        )[0]
    v = x2 @ a.to(dt).t()
    y = _Wide.apply(
        torch.cat([x2, v * s], 1),
        v,
        s,
        buf if buf.dtype == dt else buf.to(dt),
        tuple((row, row + b.shape[0], col) for b, row, col in bl),
        *(b.to(dt) for b, _, _ in bl),
    )
    if any(b is not None for b in biases):
        y = y + torch.cat([_bias(p, dt) for p in projs])
    return y


def _bias(proj: nn.Module, dt: torch.dtype) -> Tensor:
    """A projection's bias in dt, zeros where it has none (a group's biases are one vector)."""
    w, b = proj.base_layer.weight, proj.base_layer.bias
    return b.to(dt) if b is not None else w.new_zeros(w.shape[0], dtype=dt)


def wide_mlp(self, x: Tensor) -> Tensor:
    """forward of a widened gated MLP (its own forward where an adapter is off)."""
    if not _all_on(self):
        return self._tunedeck_block_forward(x)
    dt, shape = _dtype(self, x), x.shape
    with torch.autocast(x.device.type, enabled=False):
        x2 = x.reshape(-1, shape[-1]).to(dt)
        if getattr(self, "_tunedeck_swiglu", False):
            y = _swiglu(self, x2, dt)
        else:
            y = _group(self, MLP[0], x2, dt)
            m = y.shape[1] // 2
            y = _group(self, MLP[1], self.act_fn(y[:, :m]) * y[:, m:], dt)
    return y.view(*shape[:-1], y.shape[-1])


def swiglu_fits(block: nn.Module) -> bool:
    """Whether swiglu_triton can run a widened MLP: SiLU gating, no biases (the kernels add
    none), sizes and a device its kernels take."""
    if groups(block) is not MLP:
        return False
    act = type(getattr(block, "act_fn", None)).__name__
    projs = [p for g in MLP for p in _projs(block, g)]
    w = block.gate_proj.base_layer.weight
    return (
        act in ("SiLU", "SiLUActivation")
        and all(p.base_layer.bias is None for p in projs)
        and swiglu_triton.fits(w.shape[1], w.shape[0], _ab(block.gate_proj)[0].shape[0], w)
    )


def _swiglu(block: nn.Module, x2: Tensor, dt: torch.dtype) -> Tensor:
    """The MLP as swiglu_triton's op: SwiGLU inside the GEMMs around it."""
    (gate, up), (down,) = (_projs(block, g) for g in MLP)
    w_gu = getattr(block, _buffer_name(MLP[0]))
    a_d, b_d = _ab(down)
    return swiglu_triton.swiglu_mlp(
        x2,
        w_gu.to(dt),
        torch.cat([_ab(gate)[0], _ab(up)[0]]).to(dt),
        torch.cat([_ab(gate)[1], _ab(up)[1]]).to(dt),
        down.base_layer.weight.to(dt),
        a_d.to(dt),
        b_d.to(dt),
        float(gate.scaling["default"]),
    )[0]


def wide_attention(
    self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None, **kw
):
    """forward of a widened attention block (its own forward where an adapter is off)."""
    if not _all_on(self):
        return self._tunedeck_block_forward(
            hidden_states=hidden_states,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            **kw,
        )
    dt, shape = _dtype(self, hidden_states), hidden_states.shape[:-1]
    heads = (*shape, -1, self.head_dim)
    with torch.autocast(hidden_states.device.type, enabled=False):
        qkv = _group(
            self, ATTENTION[0], hidden_states.reshape(-1, hidden_states.shape[-1]).to(dt), dt
        )
    q, k, v = qkv.split([p.base_layer.weight.shape[0] for p in _projs(self, ATTENTION[0])], 1)
    # attention keeps v: as a view of qkv it would keep q and k's columns alive too
    q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v.contiguous()))
    cos, sin = position_embeddings
    q, k = self._tunedeck_rope(q, k, cos, sin)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, self.layer_idx)
    attend = self._tunedeck_attention.get_interface(
        self.config._attn_implementation, self._tunedeck_eager
    )
    out, weights = attend(
        self,
        q,
        k,
        v,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **self._tunedeck_window,
        **kw,
    )
    out = out.reshape(*shape, -1).contiguous()
    with torch.autocast(hidden_states.device.type, enabled=False):
        y = _group(self, ATTENTION[1], out.reshape(-1, out.shape[-1]).to(dt), dt)
    return y.view(*shape, -1), weights
