"""A LoRA linear as one Triton GEMM kernel that takes the adapter in.

cuBLAS cannot take the adapter in: whatever way its calls are arranged, the rank-r products read
x (or dy) again and write a full-size tensor the big GEMM then reads (docs/benchmarks.md, "The
adapter's 160 ms are bytes, not FLOPs"). Here a Triton kernel computes

    Y = X·W + s·(X·P)·Q        X: (M, K)   W: (K, N)   P: (K, r)   Q: (r, N)

for the forward (X = x, W = Wᵀ, P = Aᵀ, Q = Bᵀ, giving y and u = x·Aᵀ) and the backward's input
gradient (X = dy, W = W, P = B, Q = A, giving dx and dy·B); dA and dB stay cuBLAS GEMMs over the
tokens. Modes (MODE; bench/lora_triton.py measures each):
- "persistent", the default: X·P from cuBLAS, then a persistent kernel that reads every operand
  by TMA and takes s·(X·P)·Q as one more K step of r, so no full-size tensor is written for the
  adapter (GPUs with TMA, rows of 16-byte multiples; cuBLAS's products elsewhere);
- "epilogue": the same sum added after the main loop of a tiled kernel with pointer loads;
- "loop": the tiled kernel accumulates X·P in a second (BM × r) register tile over the same X
  tiles (no rank-r GEMM before it; slower, the compiler stops overlapping the loads).
The fp8 base's products (e4m3 X and W with a scale per row of X and per column of W) run the
persistent kernel too (scaled_lora_mm): the scales are applied to the accumulator before the
adapter's K step, so the fp8 product is not written and then read again to add the adapter.
Triton is imported only when a kernel is first used (CPU wheels of torch come without it).

TRITON_INTERPRET=1 runs every kernel on the CPU (tests/test_train_lora_triton.py checks them
against float64).
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor


def available() -> bool:
    """Whether Triton is installed (CUDA builds of torch bring it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _autotuned(triton, kernel, configs):
    """`kernel` autotuned per shape among `configs` (CONFIGS' layout)."""
    return triton.autotune(
        [
            triton.Config(
                dict(zip(("BM", "BN", "BK", "GROUP_M"), c[:4])) | _store(c),
                num_stages=c[4],
                num_warps=c[5],
            )
            for c in configs
        ],
        key=["M", "N", "K", "R"],
        cache_results=True,  # on disk (Triton's cache): a later process skips the timing
    )(kernel)


def _launch(kernel, tuned, grid, args, flags, config, on_gpu: bool) -> None:
    """Run at `config`, or autotuned on a GPU when none is given (SMALL on the interpreter);
    grid(BM, BN) is the launch grid."""
    if config is None and on_gpu:
        tuned[lambda c: grid(c["BM"], c["BN"])](*args, **flags)
        return
    bm, bn, bk, group_m, stages, warps = (config or SMALL)[:6]
    kernel[grid(bm, bn)](
        *args, BM=bm, BN=bn, BK=bk, GROUP_M=group_m, **flags, **_store(config or SMALL),
        num_stages=stages, num_warps=warps,
    )  # fmt: skip


def _store(config) -> dict:
    """The persistent kernel's output options a config's 7th and 8th entries name: STORE (0: by
    pointers; 1: one TMA store a tile; 2: two TMA stores of half a tile) and WS (warp-specialized
    tile loop, which on Hopper cannot be flattened); none for a 6-entry config."""
    if len(config) < 8:
        return {}
    return {"STORE": config[6], "WS": config[7], "FLAT": not config[7]}


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def lora_mm(
        X, W, P, Q, BIAS, Y, V,
        M, N, K, R,
        sxm, sxk, swk, swn, spk, spr, sqr, sqn, sym, syn, svm, svr,
        scale,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, RP: tl.constexpr,
        GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, ADAPTER: tl.constexpr,
        W_T: tl.constexpr, P_T: tl.constexpr,
    ):  # fmt: skip
        # grouped order: GROUP_M row blocks share their W column blocks while those are in L2
        pid = tl.program_id(0)
        grid_m = (M + BM - 1) // BM
        grid_n = (N + BN - 1) // BN
        group = GROUP_M * grid_n
        first_m = (pid // group) * GROUP_M
        size_m = min(grid_m - first_m, GROUP_M)
        pid_m = first_m + (pid % group) % size_m
        pid_n = (pid % group) // size_m

        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        rr = tl.arange(0, RP)
        x_ptr = X + rm[:, None] * sxm + rk[None, :] * sxk
        # an operand whose K is its contiguous dimension (W_T, P_T) is loaded K-fastest, so
        # each row is one coalesced read, and transposed in registers
        if W_T:
            w_ptr = W + rn[:, None] * swn + rk[None, :] * swk
        else:
            w_ptr = W + rk[:, None] * swk + rn[None, :] * swn
        if P_T:
            p_ptr = P + rr[:, None] * spr + rk[None, :] * spk
        else:
            p_ptr = P + rk[:, None] * spk + rr[None, :] * spr
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc_r = tl.zeros((BM, RP), dtype=tl.float32)
        for k in range(0, (K + BK - 1) // BK):
            kk = k * BK + rk
            x = tl.load(x_ptr, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            if W_T:
                w = tl.trans(tl.load(w_ptr, mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0))
            else:
                w = tl.load(w_ptr, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(x, w, acc)
            if ADAPTER == 1:  # the rank-r product in the main loop, over the same x tiles
                if P_T:
                    p = tl.trans(
                        tl.load(p_ptr, mask=(rr[:, None] < R) & (kk[None, :] < K), other=0.0)
                    )
                else:
                    p = tl.load(p_ptr, mask=(kk[:, None] < K) & (rr[None, :] < R), other=0.0)
                acc_r = tl.dot(x, p, acc_r)
                p_ptr += BK * spk
            x_ptr += BK * sxk
            w_ptr += BK * swk
        if ADAPTER:
            if ADAPTER == 1:
                # rounded to the input dtype as the unfused adapter's rank-r product is
                v = acc_r.to(Y.dtype.element_ty)
                if pid_n == 0:
                    tl.store(
                        V + rm[:, None] * svm + rr[None, :] * svr,
                        v,
                        mask=(rm[:, None] < M) & (rr[None, :] < R),
                    )
            else:  # ADAPTER == 2: P is the rank-r product itself, (M, r)
                v = tl.load(
                    P + rm[:, None] * spk + rr[None, :] * spr,
                    mask=(rm[:, None] < M) & (rr[None, :] < R),
                    other=0.0,
                )
            q = tl.load(
                Q + rr[:, None] * sqr + rn[None, :] * sqn,
                mask=(rr[:, None] < R) & (rn[None, :] < N),
                other=0.0,
            )
            acc = tl.dot((v.to(tl.float32) * scale).to(Y.dtype.element_ty), q, acc)
        if HAS_BIAS:
            acc += tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(
            Y + rm[:, None] * sym + rn[None, :] * syn,
            acc.to(Y.dtype.element_ty),
            mask=(rm[:, None] < M) & (rn[None, :] < N),
        )

    return triton, lora_mm, _autotuned(triton, lora_mm, CONFIGS)


# (BM, BN, BK, GROUP_M, num_stages, num_warps): what the GPU's autotuning picks from per shape
# (bench/lora_triton.py times each)
CONFIGS = (
    (128, 256, 64, 8, 3, 8),
    (128, 256, 64, 8, 4, 8),
    (256, 128, 64, 8, 3, 8),
    (256, 128, 64, 8, 4, 8),
    (128, 128, 64, 8, 4, 4),
    (128, 128, 64, 8, 4, 8),
    (128, 128, 128, 8, 3, 8),
    (64, 256, 64, 8, 4, 4),
)


def lora_mm(
    x: Tensor,
    w: Tensor,
    p: Tensor | None,
    q: Tensor | None,
    scale: float,
    bias: Tensor | None = None,
    config: tuple[int, ...] | None = None,
    mode: str = "loop",
) -> tuple[Tensor, Tensor | None]:
    """x·w + s·(x·p)·q + bias: x (M, K), w (K, N), q (r, N), any strides.

    mode "loop": p is (K, r) and the rank-r product accumulates in the main loop; returns
    (y, x·p). mode "epilogue": p is x·p already, (M, r), added in the epilogue; returns (y,
    None). Without p and q, the bare product (what the bench compares with cuBLAS). `config`
    one of CONFIGS; None autotunes among them on a GPU and takes SMALL on the CPU's
    interpreter."""
    triton, kernel, tuned = _kernel()
    m, k = x.shape
    n = w.shape[1]
    adapter = 0 if p is None else {"loop": 1, "epilogue": 2}[mode]
    r = p.shape[1] if adapter else 0
    y = x.new_empty(m, n)
    v = x.new_empty(m, r) if adapter == 1 else y
    p_, q_ = (p, q) if adapter else (w, w)  # unread when the adapter is off
    args = (
        x, w, p_, q_, bias if bias is not None else y, y, v,
        m, n, k, r,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1),
        p_.stride(0), p_.stride(1), q_.stride(0), q_.stride(1),
        y.stride(0), y.stride(1), v.stride(0), v.stride(1),
        scale,
    )  # fmt: skip
    flags = dict(
        RP=max(16, triton.next_power_of_2(r)),
        HAS_BIAS=bias is not None,
        ADAPTER=adapter,
        W_T=w.stride(0) == 1 and w.stride(1) != 1,
        P_T=adapter == 1 and p.stride(0) == 1 and p.stride(1) != 1,
    )
    grid = lambda bm, bn: (triton.cdiv(m, bm) * triton.cdiv(n, bn),)  # noqa: E731
    _launch(kernel, tuned, grid, args, flags, config, x.is_cuda)
    return y, (v if adapter == 1 else None)


@functools.cache
def _persistent():
    """The persistent kernel with TMA loads: one program per SM walking the output tiles, every
    operand read through tensor descriptors (Hopper's bulk copies), which is how Triton's GEMMs
    get near cuBLAS's on these GPUs. The adapter is one more K step of r after the main loop,
    its u and s·B (or s·A) tiles loaded by TMA like the loop's: loaded by pointers before or
    after the loop instead, it cost 24–53 % of the GEMM (bench/lora_triton.py on an H100,
    docs/benchmarks.md). LOOP also computes u in the main loop (a second dot over the same X
    tiles: 40 % slower, kept as TUNEDECK_LORA_EPILOGUE=triton-loop). SCALED: X and W are e4m3
    with a scale per row of X and per column of W (the fp8 base), applied to the fp32
    accumulator before the adapter's K step, whose operands stay 16-bit."""
    import triton
    import triton.language as tl

    @triton.jit
    def mm_persistent(
        X, W, U, Q, BIAS, Y, P, SX, SW,
        M, N, K, R,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, RP: tl.constexpr,
        GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, W_T: tl.constexpr,
        HAS_BIAS: tl.constexpr, ADAPTER: tl.constexpr, Q_T: tl.constexpr,
        LOOP: tl.constexpr, P_T: tl.constexpr, SCALED: tl.constexpr,
        STORE: tl.constexpr = 0, WS: tl.constexpr = False, FLAT: tl.constexpr = True,
    ):  # fmt: skip
        x_desc = tl.make_tensor_descriptor(X, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        if W_T:  # W is Wᵀ of an (N, K) row-major weight
            w_desc = tl.make_tensor_descriptor(
                W, shape=[N, K], strides=[K, 1], block_shape=[BN, BK]
            )
        else:
            w_desc = tl.make_tensor_descriptor(
                W, shape=[K, N], strides=[N, 1], block_shape=[BK, BN]
            )
        if ADAPTER and not LOOP:  # columns past r read as zeros
            u_desc = tl.make_tensor_descriptor(
                U, shape=[M, R], strides=[R, 1], block_shape=[BM, RP]
            )
        if LOOP:  # u = X·P is computed here, over the main loop's X tiles, and written to U
            if P_T:  # P is Aᵀ of an (r, K) row-major A
                p_desc = tl.make_tensor_descriptor(
                    P, shape=[R, K], strides=[K, 1], block_shape=[RP, BK]
                )
            else:
                p_desc = tl.make_tensor_descriptor(
                    P, shape=[K, R], strides=[R, 1], block_shape=[BK, RP]
                )
        if ADAPTER:
            if Q_T:  # Q is (s·B)ᵀ of an (N, r) row-major B
                q_desc = tl.make_tensor_descriptor(
                    Q, shape=[N, R], strides=[R, 1], block_shape=[BN, RP]
                )
            else:
                q_desc = tl.make_tensor_descriptor(
                    Q, shape=[R, N], strides=[N, 1], block_shape=[RP, BN]
                )
        if STORE > 0:  # the tile leaves by TMA, asynchronously, while the next one's loads start
            y_desc = tl.make_tensor_descriptor(
                Y, shape=[M, N], strides=[N, 1], block_shape=[BM, BN // STORE]
            )
        grid_m = (M + BM - 1) // BM
        grid_n = (N + BN - 1) // BN
        k_tiles = (K + BK - 1) // BK
        group = GROUP_M * grid_n
        # flatten: Triton pipelines the loads across output tiles, not only within one
        for tile in tl.range(
            tl.program_id(0), grid_m * grid_n, NUM_SMS, flatten=FLAT, warp_specialize=WS
        ):
            first_m = (tile // group) * GROUP_M
            size_m = min(grid_m - first_m, GROUP_M)
            pid_m = first_m + (tile % group) % size_m
            pid_n = (tile % group) // size_m
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            acc_r = tl.zeros((BM, RP), dtype=tl.float32)
            for kt in range(k_tiles):
                x = x_desc.load([pid_m * BM, kt * BK])
                if W_T:
                    w = w_desc.load([pid_n * BN, kt * BK]).T
                else:
                    w = w_desc.load([kt * BK, pid_n * BN])
                acc = tl.dot(x, w, acc)
                if LOOP:
                    if P_T:
                        pk = p_desc.load([0, kt * BK]).T
                    else:
                        pk = p_desc.load([kt * BK, 0])
                    acc_r = tl.dot(x, pk, acc_r)
            rm = pid_m * BM + tl.arange(0, BM)
            rn = pid_n * BN + tl.arange(0, BN)
            if SCALED:  # fp8 X and W: each row of X and column of W scaled back before the adapter
                sx = tl.load(SX + rm, mask=rm < M, other=0.0)
                sw = tl.load(SW + rn, mask=rn < N, other=0.0)
                acc = acc * sx[:, None] * sw[None, :]
            if ADAPTER:
                if LOOP:  # rounded to the input dtype as the rank-r GEMM's output is
                    v = acc_r.to(Y.dtype.element_ty)
                    if pid_n == 0:
                        rr = tl.arange(0, RP)
                        tl.store(
                            U + rm[:, None] * R + rr[None, :],
                            v,
                            mask=(rm[:, None] < M) & (rr[None, :] < R),
                        )
                else:
                    v = u_desc.load([pid_m * BM, 0])
                if Q_T:
                    q = q_desc.load([pid_n * BN, 0]).T
                else:
                    q = q_desc.load([0, pid_n * BN])
                acc = tl.dot(v, q, acc)
            if HAS_BIAS:
                acc += tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            if STORE == 0:
                tl.store(
                    Y + rm[:, None] * N + rn[None, :],
                    acc.to(Y.dtype.element_ty),
                    mask=(rm[:, None] < M) & (rn[None, :] < N),
                )
            elif STORE == 1:
                y_desc.store([pid_m * BM, pid_n * BN], acc.to(Y.dtype.element_ty))
            else:  # two halves: half the registers and shared memory the conversion needs
                halves = tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1))
                y0, y1 = tl.split(halves)
                y_desc.store([pid_m * BM, pid_n * BN], y0.to(Y.dtype.element_ty))
                y_desc.store([pid_m * BM, pid_n * BN + BN // 2], y1.to(Y.dtype.element_ty))

    triton.set_allocator(_scratch)  # the descriptors the kernel builds live in global memory
    return (
        triton,
        mm_persistent,
        {name: _autotuned(triton, mm_persistent, c) for name, c in GEMM_CONFIGS.items()},
        _autotuned(triton, mm_persistent, PERSISTENT_FP8),
    )


# (BM, BN, BK, GROUP_M, num_stages, num_warps) for the persistent kernel
PERSISTENT = (
    (128, 256, 64, 8, 3, 8),
    (128, 256, 64, 8, 4, 8),
    (128, 128, 64, 8, 4, 8),
    (128, 128, 64, 8, 5, 4),
    (128, 128, 128, 8, 3, 8),
    (128, 256, 128, 8, 2, 8),
)
# the 16-bit configs by how a tile's output leaves (_store): "pointer", masked stores, the
# default; "tma", TMA stores whole or in halves (PERSISTENT's configs whose staging still fits
# Hopper's shared memory); "ws", halves and a warp-specialized tile loop (Triton 3.6 cannot
# build it at 4 warps). Neither was faster on an H100 (docs/benchmarks.md, "How a tile leaves
# the kernel"); they stay to be measured again on a later Triton. TUNEDECK_LORA_GEMM picks.
GEMM_CONFIGS = {
    "pointer": PERSISTENT,
    "tma": (
        (128, 256, 64, 8, 3, 8, 1, False),
        (128, 128, 64, 8, 4, 8, 1, False),
        (128, 128, 64, 8, 5, 4, 1, False),
        (128, 256, 64, 8, 3, 8, 2, False),
        (128, 128, 64, 8, 4, 8, 2, False),
        (128, 128, 64, 8, 5, 4, 2, False),
        (128, 128, 128, 8, 3, 8, 2, False),
    ),
    "ws": tuple(c + (2, True) for c in PERSISTENT if c[5] == 8),
}
GEMM = "pointer"


def gemm_setting() -> str:
    """TUNEDECK_LORA_GEMM, else GEMM; an unknown name is an error that lists the known ones."""
    name = os.environ.get("TUNEDECK_LORA_GEMM") or GEMM
    if name not in GEMM_CONFIGS:
        raise ValueError(f"TUNEDECK_LORA_GEMM={name!r}: expected one of {', '.join(GEMM_CONFIGS)}")
    return name


# fp8 operands take half the shared memory a K step: longer K tiles, more stages
PERSISTENT_FP8 = (
    (128, 256, 128, 8, 3, 8),
    (128, 256, 128, 8, 4, 8),
    (128, 128, 128, 8, 4, 8),
    (128, 128, 128, 8, 5, 4),
    (128, 256, 64, 8, 4, 8),
    (128, 128, 256, 8, 3, 8),
)


@functools.cache
def _sms(device: int | None) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _scratch(size: int, alignment: int, stream) -> Tensor:
    """Global memory for the descriptors a kernel builds on the device."""
    return torch.empty(
        size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu"
    )


def lora_mm_persistent(
    x: Tensor,
    w: Tensor,
    u: Tensor | None,
    q: Tensor | None,
    scale: float,
    bias: Tensor | None = None,
    config: tuple[int, ...] | None = None,
    p: Tensor | None = None,
    scales: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """(x·w + s·u·q + bias, u), persistent and through TMA: x row-major; w, p and q each
    row-major or the transpose of a row-major tensor. u = x·p is given, or, with p (K, r),
    computed in the main loop and returned. Without u and p, the bare product. `scales`
    (sx: M values, sw: N values, fp32): x and w are e4m3 and the product is
    (sx·x)·(w·sw), in u's dtype (bf16 without u, as _scaled_mm's)."""
    triton, kernel, tuned, tuned_fp8 = _persistent()
    x = x.contiguous()
    m, k = x.shape
    n = w.shape[1]
    w_t, wm = _rows(w)
    loop = p is not None
    if loop and scales is not None:
        raise ValueError("lora_mm_persistent: fp8 operands take u, not p")
    if loop:
        r = p.shape[1]
        u = x.new_empty(m, r)
        p_t, pm = _rows(p)
    else:
        r = u.shape[1] if u is not None else 0
        p_t, pm = False, x  # unread
    out_dtype = u.dtype if u is not None else torch.bfloat16 if scales else x.dtype
    y = x.new_empty(m, n, dtype=out_dtype)
    if q is not None:  # s·q rounded to the input dtype, as the default layer's s·Bᵀ
        q_t, qm = _rows(q)
        qm = qm * scale if scale != 1.0 else qm
    else:
        q_t, qm = False, y
    u_ = u.contiguous() if u is not None else y
    sx, sw = (s.reshape(-1).contiguous() for s in scales) if scales is not None else (y, y)
    # one program per SM; a program past the last tile does nothing
    sms = _sms(x.device.index) if x.is_cuda else 4
    args = (x, wm, u_, qm, bias if bias is not None else y, y, pm, sx, sw, m, n, k, r)
    flags = dict(
        RP=max(16, triton.next_power_of_2(r)),
        NUM_SMS=sms,
        W_T=w_t,
        HAS_BIAS=bias is not None,
        ADAPTER=u is not None,
        Q_T=q_t,
        LOOP=loop,
        P_T=p_t,
        SCALED=scales is not None,
    )
    autotuned = tuned[gemm_setting()] if scales is None else tuned_fp8
    _launch(kernel, autotuned, lambda bm, bn: (sms,), args, flags, config, x.is_cuda)
    return y, u_ if u is not None else None


def _rows(t: Tensor) -> tuple[bool, Tensor]:
    """(transposed, m): m is t's row-major storage, t itself or, when t is the transpose of a
    row-major tensor, that tensor (no copy either way unless t is neither)."""
    if t.stride(0) == 1 and t.stride(1) != 1:
        return True, t.t().contiguous()
    return False, t.contiguous()


def tma_ready(x: Tensor, w: Tensor, r: int, adapter_size: int | None = None) -> bool:
    """Whether the persistent kernel can read x (M, K), w (K, N) and the rank-r tiles, whose
    elements take `adapter_size` bytes (x's where None): a GPU with TMA (compute capability
    9.0 or newer), every row a multiple of 16 bytes and x's base 16-byte aligned."""
    if not x.is_cuda or torch.cuda.get_device_capability(x.device) < (9, 0):
        return False
    size = x.element_size()
    rows = (x.shape[1] * size, w.shape[1] * size, r * (adapter_size or size))
    return all(n % 16 == 0 for n in rows) and x.data_ptr() % 16 == 0


def interpreted() -> bool:
    """Whether Triton runs its kernels on the CPU (TRITON_INTERPRET=1, the tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _persistent_runs(x: Tensor, w: Tensor, r: int, adapter_size: int | None = None) -> bool:
    """Where the persistent kernel runs: a GPU whose TMA can read the operands (tma_ready),
    or the CPU's interpreter."""
    return tma_ready(x, w, r, adapter_size) or (not x.is_cuda and interpreted())


# small tiles for the CPU's interpreter (the tests' shapes are tens of rows)
SMALL = (32, 32, 32, 4, 1, 4)


# how the adapter enters the kernel (bench/lora_triton.py measures each): "persistent" and
# "persistent-loop" run the persistent TMA kernel wherever TMA can read the operands (and on
# the CPU's interpreter), cuBLAS elsewhere; "epilogue" and "loop" the tiled kernel
MODE = "persistent"
# who makes a lone projection's rank-r products beside the persistent kernel: "cublas", "dy"
# (lora_rank.dy_pass: dy read once for g and dB, cuBLAS's x·Aᵀ and gᵀ·x; the default, 0.5 %
# faster in the trainer on an H100, docs/benchmarks.md) or "triton" (all of lora_rank's
# kernels: no faster than "dy"); TUNEDECK_LORA_RANK overrides it
RANK = "dy"


def _product(x, w, p, q, scale, bias, config, mode) -> tuple[Tensor, Tensor]:
    """(x·w + s·(x·p)·q + bias, x·p) the way `mode` says: x·p by cuBLAS first, or in the
    kernel's main loop ("loop" modes)."""
    persistent = mode.startswith("persistent")
    if persistent and _persistent_runs(x, w, p.shape[1]):
        if mode == "persistent-loop":
            return lora_mm_persistent(x, w, None, q, scale, bias, config, p)
        xp = x @ p
        return lora_mm_persistent(x, w, xp, q, scale, bias, config)[0], xp
    if mode == "loop":
        return lora_mm(x, w, p, q, scale, bias, config, "loop")
    xp = x @ p
    if persistent:  # no TMA: the default layer's cuBLAS products (the tiled kernel lost 5.6 %)
        c = xp @ (q * scale)
        return torch.addmm(c if bias is None else c + bias, x, w), xp
    return lora_mm(x, w, xp, q, scale, bias, config, "epilogue")[0], xp


def _bt(b: Tensor, sizes) -> Tensor:
    """Bᵀ, or for a group of projections (`sizes`: each one's rows of the stacked B, one rank
    r) the block-diagonal (n·r, ΣN) of their Bᵀs, so one K step of n·r adds every adapter."""
    if sizes is None or len(sizes) == 1:
        return b.t()
    return torch.block_diag(*(bi.t() for bi in b.split(list(sizes))))


def rank_setting() -> str:
    """TUNEDECK_LORA_RANK, else RANK."""
    return os.environ.get("TUNEDECK_LORA_RANK") or RANK


def rank_kernels(x: Tensor, w: Tensor, r: int, mode: str, sizes) -> str | None:
    """Which of lora_rank's kernels a lone projection's rank-r products run beside the
    persistent kernel reading x·w (rank_setting()): "dy" (g and dB from one read of dy,
    cuBLAS's x·Aᵀ and gᵀ·x) or "triton" (all three); None: cuBLAS's four."""
    rank = rank_setting()
    lone = sizes is None or len(sizes) == 1
    runs = rank in ("dy", "triton") and mode == "persistent" and lone and _persistent_runs(x, w, r)
    return rank if runs else None


def lora_forward(
    x, weight, bias, a, b, scale, config=None, mode=None, sizes=None
) -> tuple[Tensor, Tensor]:
    """(y, u): y = x·Wᵀ + bias + s·u·Bᵀ, u = x·Aᵀ. With `sizes`, W, bias, A and B stack a
    group's projections (rows of W and B per projection, r rows of A each) and each
    projection's output takes only its own adapter."""
    mode = mode or MODE
    if rank_kernels(x, weight.t(), a.shape[0], mode, sizes) == "triton":
        from tunedeck.core.train import lora_rank

        u = lora_rank.rows(x, a)
        return lora_mm_persistent(x, weight.t(), u, b.t(), scale, bias, config)[0], u
    return _product(x, weight.t(), a.t(), _bt(b, sizes), scale, bias, config, mode)


def lora_backward(
    dy, x, weight, a, b, u, scale, config=None, mode=None, sizes=None
) -> tuple[Tensor, ...]:
    """(dx, dA, dB): dx = dy·W + s·(dy·B)·A in one kernel; dA = s·(dy·B)ᵀ·x and
    dB = s·dyᵀ·u over the tokens (cuBLAS, per projection of a group; or lora_rank's kernels,
    g = dy·B and dB from one read of dy)."""
    mode = mode or MODE
    rank = rank_kernels(dy, weight, a.shape[0], mode, sizes)
    if rank:
        from tunedeck.core.train import lora_rank

        g, db = lora_rank.dy_pass(dy, b, u, scale)
        dx = lora_mm_persistent(dy, weight, g, a, scale, None, config)[0]
        da = lora_rank.tn(g, x, scale) if rank == "triton" else (g.t() @ x) * scale
        return dx, da, db
    dx, g = _product(dy, weight, _bt(b, sizes).t(), a, scale, None, config, mode)
    if sizes is None or len(sizes) == 1:
        db = (dy.t() @ u) * scale
    else:
        r = a.shape[0] // len(sizes)
        db = (
            torch.cat([dyi.t() @ ui for dyi, ui in zip(dy.split(list(sizes), 1), u.split(r, 1))])
            * scale
        )
    return dx, (g.t() @ x) * scale, db


@torch.library.custom_op("tunedeck::lora_linear_triton", mutates_args=())
def lora_linear_triton(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    a: Tensor,
    b: Tensor,
    scale: float,
    mode: str,
    sizes: list[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """(y, u) of lora_forward, opaque to the compiler (TUNEDECK_LORA_EPILOGUE=triton...)."""
    return lora_forward(x, weight, bias, a, b, scale, mode=mode, sizes=sizes)


@lora_linear_triton.register_fake
def _(x, weight, bias, a, b, scale, mode, sizes=None):
    return x.new_empty(x.shape[0], weight.shape[0]), x.new_empty(x.shape[0], a.shape[0])


@torch.library.custom_op("tunedeck::lora_linear_triton_backward", mutates_args=())
def lora_linear_triton_backward(
    dy: Tensor,
    x: Tensor,
    weight: Tensor,
    a: Tensor,
    b: Tensor,
    u: Tensor,
    scale: float,
    mode: str,
    sizes: list[int] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dA, dB) of lora_linear_triton."""
    return lora_backward(dy, x, weight, a, b, u, scale, mode=mode, sizes=sizes)


@lora_linear_triton_backward.register_fake
def _(dy, x, weight, a, b, u, scale, mode, sizes=None):
    return torch.empty_like(x), torch.empty_like(a), torch.empty_like(b)


def _setup(ctx, inputs, output):
    x, weight, _bias, a, b, scale, mode, sizes = inputs
    ctx.save_for_backward(x, weight, a, b, output[1])
    ctx.scale, ctx.mode, ctx.sizes = scale, mode, sizes


def _backward(ctx, dy, _du):
    x, weight, a, b, u = ctx.saved_tensors
    dx, da, db = lora_linear_triton_backward(dy, x, weight, a, b, u, ctx.scale, ctx.mode, ctx.sizes)
    return dx, None, None, da, db, None, None, None


lora_linear_triton.register_autograd(_backward, setup_context=_setup)


def scaled_lora_mm(a8, sa, b8, sb, bias, u, v) -> Tensor:
    """lora_fused.scaled_mm_add's (a8·sa)(b8·sb) + bias + u·v, in u's dtype, as one persistent
    kernel: the fp8 product's scales applied to the accumulator and u·v taken as one more K
    step, where cuBLAS writes the fp8 product and then reads and writes it again to add u·v.
    cuBLAS's where TMA cannot read the operands."""
    if _persistent_runs(a8, b8, u.shape[1], u.element_size()):
        return lora_mm_persistent(a8, b8, u, v, 1.0, bias, scales=(sa, sb))[0]
    from tunedeck.core.train.lora_fused import scaled_mm_add

    return scaled_mm_add(a8, sa, b8, sb, bias, u, v)


@torch.library.custom_op("tunedeck::scaled_mm_add_triton", mutates_args=())
def scaled_mm_add_triton(
    a8: Tensor, sa: Tensor, b8: Tensor, sb: Tensor, bias: Tensor | None, u: Tensor, v: Tensor
) -> Tensor:
    """scaled_lora_mm, opaque to the compiler (the fp8 base's TUNEDECK_LORA_EPILOGUE=triton)."""
    return scaled_lora_mm(a8, sa, b8, sb, bias, u, v)


@scaled_mm_add_triton.register_fake
def _(a8, sa, b8, sb, bias, u, v):
    return a8.new_empty((a8.shape[0], b8.shape[1]), dtype=u.dtype)


# TUNEDECK_LORA_EPILOGUE's Triton values and the mode each runs
EPILOGUE_MODES = {"triton": MODE, "triton-loop": "persistent-loop"}
