"""A gated MLP's SwiGLU inside the Triton GEMMs around it (TUNEDECK_LORA_EPILOGUE=triton-swiglu).

A LoRA'd gated MLP, y = down(silu(gate(x)) · up(x)), run as lora_triton's kernels still leaves
three memory-bound kernels a layer to the compiler, each a pass over (tokens × intermediate)
tensors: SwiGLU forward (reads g and u, writes h), its backward (reads dh, g and u, writes dg
and du) and h rebuilt in backward for down's LoRA gradient (the lean layers save g and u, not
h). On the 7B preset they took 125 ms of a 1,875 ms step on an H100 (docs/benchmarks.md,
"Where the 7B preset's step goes"). Here:
- forward: one persistent kernel makes gate's and up's tiles of the same columns side by side
  (two accumulators over the same x tiles, each with its adapter as one more K step) and
  writes g and u (saved for backward) and h = silu(g)·u, so g and u are not read back;
- backward: down's input-gradient kernel (dh = dy·W_d + s·(dy·B_d)·A_d) reads the g and u
  tiles of its own output tile in the epilogue and writes dg, du and h instead of dh, so dh is
  never written and h is rebuilt where g and u are read anyway.
Per 7B layer and micro-batch of 8,192 tokens that is 6 fewer passes of 310 MB over HBM, but
the epilogues stall the kernels' main loops about as long: +0.6 % in the trainer on an H100,
so it is opt-in (docs/benchmarks.md, "SwiGLU inside the MLP's GEMMs"). The
rank-r products and the gate/up input gradient are lora_triton's and lora_rank's. Same math,
parameters and state dict as peft; `fits` says which blocks run it (the others run the
triton-wide-mlp path). TRITON_INTERPRET=1 runs the kernels on the CPU
(tests/test_train_lora_triton.py checks them against float64).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from tunedeck.core.train import lora_triton
from tunedeck.core.train.lora_triton import _autotuned, _launch, _scratch, _sms

# (BM, BN, BK, GROUP_M, num_stages, num_warps). Forward: BN is each of gate's and up's column
# block (two accumulators, the work of one BM × 2·BN tile). Backward: tiles like lora_triton's
# persistent kernel's, whose epilogue here also holds the g and u tiles.
FORWARD = (
    (128, 128, 64, 8, 3, 8),
    (128, 128, 64, 8, 4, 8),
    (128, 64, 64, 8, 4, 4),
    (128, 64, 64, 8, 4, 8),
    (64, 128, 64, 8, 4, 4),
)
BACKWARD = (
    (128, 128, 64, 8, 3, 8),
    (128, 128, 64, 8, 4, 8),
    (128, 256, 64, 8, 3, 8),
    (128, 64, 64, 8, 4, 4),
    (128, 128, 64, 8, 5, 4),
)


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def gate_up(
        X, W, U, BG, BU, GU, H,
        M, N, K, R,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, RP: tl.constexpr,
        GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
    ):  # fmt: skip
        # X (M, K); W (2N, K) = [W_gate; W_up]; U (M, 2R) = x·[A_gate; A_up]ᵀ; BG, BU (N, R) =
        # s·B. Writes GU (M, 2N) = [g | u] and H (M, N) = silu(g)·u.
        x_desc = tl.make_tensor_descriptor(X, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        w_desc = tl.make_tensor_descriptor(
            W, shape=[2 * N, K], strides=[K, 1], block_shape=[BN, BK]
        )
        # columns past 2R read as zeros; the other projection's columns past R meet B's
        # zero columns past R
        u_desc = tl.make_tensor_descriptor(
            U, shape=[M, 2 * R], strides=[2 * R, 1], block_shape=[BM, RP]
        )
        bg_desc = tl.make_tensor_descriptor(BG, shape=[N, R], strides=[R, 1], block_shape=[BN, RP])
        bu_desc = tl.make_tensor_descriptor(BU, shape=[N, R], strides=[R, 1], block_shape=[BN, RP])
        k_tiles = (K + BK - 1) // BK
        tiles = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
        for tile in tl.range(tl.program_id(0), tiles, NUM_SMS, flatten=True):
            # grouped order: GROUP_M row blocks share their weight column blocks while in L2
            group = GROUP_M * ((N + BN - 1) // BN)
            first_m = (tile // group) * GROUP_M
            size_m = min((M + BM - 1) // BM - first_m, GROUP_M)
            pid_m = first_m + (tile % group) % size_m
            pid_n = (tile % group) // size_m
            acc_g = tl.zeros((BM, BN), dtype=tl.float32)
            acc_u = tl.zeros((BM, BN), dtype=tl.float32)
            for kt in range(k_tiles):
                x = x_desc.load([pid_m * BM, kt * BK])
                # gate's rows past N are up's: their columns are never stored
                acc_g = tl.dot(x, w_desc.load([pid_n * BN, kt * BK]).T, acc_g)
                acc_u = tl.dot(x, w_desc.load([N + pid_n * BN, kt * BK]).T, acc_u)
            acc_g = tl.dot(u_desc.load([pid_m * BM, 0]), bg_desc.load([pid_n * BN, 0]).T, acc_g)
            acc_u = tl.dot(u_desc.load([pid_m * BM, R]), bu_desc.load([pid_n * BN, 0]).T, acc_u)
            # g and u rounded to the output dtype first, as the unfused GEMMs' outputs are
            g = acc_g.to(GU.dtype.element_ty)
            u = acc_u.to(GU.dtype.element_ty)
            gf = g.to(tl.float32)
            h = gf * tl.sigmoid(gf) * u.to(tl.float32)
            # masked pointer stores: by TMA both kernels were slower (docs/benchmarks.md)
            rm = pid_m * BM + tl.arange(0, BM)
            rn = pid_n * BN + tl.arange(0, BN)
            mask = (rm[:, None] < M) & (rn[None, :] < N)
            row = rm[:, None] * (2 * N) + rn[None, :]
            tl.store(GU + row, g, mask=mask)
            tl.store(GU + row + N, u, mask=mask)
            tl.store(H + rm[:, None] * N + rn[None, :], h.to(H.dtype.element_ty), mask=mask)

    @triton.jit
    def down_back(
        DY, W, G, A, GU, DGU, H,
        M, N, K, R,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, RP: tl.constexpr,
        GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
    ):  # fmt: skip
        # DY (M, K); W (K, N) = W_down; G (M, R) = dy·B_down; A (R, N) = s·A_down; GU (M, 2N) =
        # [g | u]. dh = DY·W + G·A stays in registers: writes DGU (M, 2N) = [dg | du] and H.
        dy_desc = tl.make_tensor_descriptor(DY, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        w_desc = tl.make_tensor_descriptor(W, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
        g_desc = tl.make_tensor_descriptor(G, shape=[M, R], strides=[R, 1], block_shape=[BM, RP])
        a_desc = tl.make_tensor_descriptor(A, shape=[R, N], strides=[N, 1], block_shape=[RP, BN])
        k_tiles = (K + BK - 1) // BK
        tiles = ((M + BM - 1) // BM) * ((N + BN - 1) // BN)
        for tile in tl.range(tl.program_id(0), tiles, NUM_SMS, flatten=True):
            # grouped order: GROUP_M row blocks share their weight column blocks while in L2
            group = GROUP_M * ((N + BN - 1) // BN)
            first_m = (tile // group) * GROUP_M
            size_m = min((M + BM - 1) // BM - first_m, GROUP_M)
            pid_m = first_m + (tile % group) % size_m
            pid_n = (tile % group) // size_m
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for kt in range(k_tiles):
                acc = tl.dot(
                    dy_desc.load([pid_m * BM, kt * BK]), w_desc.load([kt * BK, pid_n * BN]), acc
                )
            acc = tl.dot(g_desc.load([pid_m * BM, 0]), a_desc.load([0, pid_n * BN]), acc)
            # dh rounded as the unfused GEMM's output is
            dh = acc.to(DGU.dtype.element_ty).to(tl.float32)
            rm = pid_m * BM + tl.arange(0, BM)
            rn = pid_n * BN + tl.arange(0, BN)
            mask = (rm[:, None] < M) & (rn[None, :] < N)
            row = rm[:, None] * (2 * N) + rn[None, :]
            g = tl.load(GU + row, mask=mask, other=0.0).to(tl.float32)
            u = tl.load(GU + row + N, mask=mask, other=0.0).to(tl.float32)
            sig = tl.sigmoid(g)
            silu = g * sig
            dg = dh * u * sig * (1.0 + g * (1.0 - sig))
            tl.store(DGU + row, dg.to(DGU.dtype.element_ty), mask=mask)
            tl.store(DGU + row + N, (dh * silu).to(DGU.dtype.element_ty), mask=mask)
            tl.store(
                H + rm[:, None] * N + rn[None, :], (silu * u).to(H.dtype.element_ty), mask=mask
            )

    triton.set_allocator(_scratch)
    return (
        triton,
        gate_up,
        _autotuned(triton, gate_up, FORWARD),
        down_back,
        _autotuned(triton, down_back, BACKWARD),
    )


def _run(which: int, operands: tuple, outs: tuple, m: int, n: int, k: int, r: int, config):
    """Launch _kernels()'s kernel `which` (1: gate_up, 3: down_back) over row-major copies of
    `operands` (TMA reads rows; dy_pass's g is strided), one program per SM."""
    from tunedeck.core.train.lora_rank import _rp

    kernels = _kernels()
    triton, kernel, tuned = kernels[0], kernels[which], kernels[which + 1]
    on_gpu = outs[0].is_cuda
    sms = _sms(outs[0].device.index) if on_gpu else 4
    args = (*(t.contiguous() for t in operands), *outs, m, n, k, r)
    flags = dict(RP=_rp(triton, r), NUM_SMS=sms)
    _launch(kernel, tuned, lambda bm, bn: (sms,), args, flags, config, on_gpu)
    return outs


def gate_up_swiglu(
    x: Tensor, w: Tensor, u: Tensor, bg: Tensor, bu: Tensor, config=None
) -> tuple[Tensor, Tensor]:
    """([g | u], silu(g)·u) for g = x·W_gᵀ + u_g·bgᵀ and u = x·W_uᵀ + u_u·buᵀ: x (M, K), w
    (2N, K) = [W_g; W_u], u (M, 2R) = x·[A_g; A_u]ᵀ, bg and bu (N, R) = s·B (row-major)."""
    (m, k), (n, r) = x.shape, bg.shape
    outs = (x.new_empty(m, 2 * n), x.new_empty(m, n))
    return _run(1, (x, w, u, bg, bu), outs, m, n, k, r, config)


def down_swiglu_backward(
    dy: Tensor, w: Tensor, g: Tensor, a: Tensor, gu: Tensor, config=None
) -> tuple[Tensor, Tensor]:
    """([dg | du], h) of SwiGLU's backward at dh = dy·w + g·a: dy (M, K), w (K, N) = W_down,
    g (M, R) = dy·B_down, a (R, N) = s·A_down, gu (M, 2N) = [g | u] of the forward."""
    (m, k), (r, n) = dy.shape, a.shape
    outs = (dy.new_empty(m, 2 * n), dy.new_empty(m, n))
    return _run(3, (dy, w, g, a, gu), outs, m, n, k, r, config)


def fits(hidden: int, n: int, r: int, weight: Tensor) -> bool:
    """Whether the kernels can run a gated MLP of these sizes whose weights are `weight`'s
    kind, decided once (a check inside the compiled layer would break its graph): every row
    a multiple of 16 bytes in 16-bit floats (TMA's rule; then in fp32 too), on a GPU with TMA
    or the CPU's interpreter."""
    rows = all(v % 8 == 0 for v in (hidden, n, r))
    if weight.is_cuda:
        cc = torch.cuda.get_device_capability(weight.device)
        return rows and cc >= (9, 0) and lora_triton.available()
    return rows and lora_triton.interpreted()


def mlp_forward(x, w_gu, a_gu, b_gu, w_d, a_d, b_d, scale) -> tuple[Tensor, ...]:
    """(y, [g | u], x·A_guᵀ, h·A_dᵀ): y = down(silu(gate(x))·up(x)) with each projection's
    adapter; w_gu (2N, K) and a_gu (2r, K), b_gu (2N, r) stack gate's and up's."""
    n = w_d.shape[1]
    u1 = x @ a_gu.t()
    bs = b_gu * scale
    gu, h = gate_up_swiglu(x, w_gu, u1, bs[:n], bs[n:])
    u2 = h @ a_d.t()
    y = lora_triton.lora_mm_persistent(h, w_d.t(), u2, b_d.t(), scale)[0]
    return y, gu, u1, u2


def mlp_backward(dy, x, gu, u1, u2, w_gu, a_gu, b_gu, w_d, a_d, b_d, scale) -> tuple[Tensor, ...]:
    """(dx, dA_gu, dB_gu, dA_d, dB_d) of mlp_forward."""
    from tunedeck.core.train import lora_rank

    n = w_d.shape[1]
    dy = dy.contiguous()
    g2, db_d = lora_rank.dy_pass(dy, b_d, u2, scale)
    dgu, h = down_swiglu_backward(dy, w_d, g2, a_d * scale, gu)
    da_d = (g2.t() @ h) * scale
    dx, da_gu, db_gu = lora_triton.lora_backward(
        dgu, x, w_gu, a_gu, b_gu, u1, scale, mode="persistent", sizes=[n, n]
    )
    return dx, da_gu, db_gu, da_d, db_d


@torch.library.custom_op("tunedeck::swiglu_mlp", mutates_args=())
def swiglu_mlp(
    x: Tensor,
    w_gu: Tensor,
    a_gu: Tensor,
    b_gu: Tensor,
    w_d: Tensor,
    a_d: Tensor,
    b_d: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """mlp_forward, opaque to the compiler."""
    x = x.contiguous()
    if x.data_ptr() % 16:  # TMA reads from 16-byte aligned rows only
        x = x.clone()
    return mlp_forward(x, w_gu, a_gu, b_gu, w_d, a_d, b_d, scale)


@swiglu_mlp.register_fake
def _(x, w_gu, a_gu, b_gu, w_d, a_d, b_d, scale):
    m, n = x.shape[0], w_d.shape[1]
    return (
        x.new_empty(m, w_d.shape[0]),
        x.new_empty(m, 2 * n),
        x.new_empty(m, a_gu.shape[0]),
        x.new_empty(m, a_d.shape[0]),
    )


@torch.library.custom_op("tunedeck::swiglu_mlp_backward", mutates_args=())
def swiglu_mlp_backward(
    dy: Tensor,
    x: Tensor,
    gu: Tensor,
    u1: Tensor,
    u2: Tensor,
    w_gu: Tensor,
    a_gu: Tensor,
    b_gu: Tensor,
    w_d: Tensor,
    a_d: Tensor,
    b_d: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """mlp_backward, opaque to the compiler."""
    return mlp_backward(dy, x, gu, u1, u2, w_gu, a_gu, b_gu, w_d, a_d, b_d, scale)


@swiglu_mlp_backward.register_fake
def _(dy, x, gu, u1, u2, w_gu, a_gu, b_gu, w_d, a_d, b_d, scale):
    return tuple(torch.empty_like(t) for t in (x, a_gu, b_gu, a_d, b_d))


def _setup(ctx, inputs, output):
    x, w_gu, a_gu, b_gu, w_d, a_d, b_d, scale = inputs
    # h is not kept: down's backward kernel makes it again from g and u
    ctx.save_for_backward(
        x.contiguous(), output[1], output[2], output[3], w_gu, a_gu, b_gu, w_d, a_d, b_d
    )
    ctx.scale = scale


def _backward(ctx, dy, *_):
    dx, da_gu, db_gu, da_d, db_d = swiglu_mlp_backward(dy, *ctx.saved_tensors, ctx.scale)
    return dx, None, da_gu, db_gu, None, da_d, db_d, None


swiglu_mlp.register_autograd(_backward, setup_context=_setup)
