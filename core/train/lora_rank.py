"""A LoRA linear's rank-r products as Triton kernels that read each full-size tensor once.

Beside its frozen GEMMs (lora_triton's kernel) a LoRA linear makes four products of rank r per
micro-batch, each reading a full-size tensor and making r columns of output: bytes, not FLOPs
(docs/benchmarks.md, "The adapter's 160 ms are bytes"):
    forward   u = x·Aᵀ                    reads x
    backward  g = dy·B, dB = s·dyᵀ·u      read dy (twice through cuBLAS)
              dA = s·gᵀ·x                 reads x
cuBLAS runs them as four skinny GEMMs. Here:
- `dy_pass` makes g and dB from one read of dy. Each program streams one block of columns of
  dy over a range of rows: dB's partial sum for its columns stays in registers, g's partial
  for each row block goes to an fp32 scratch row; both partials are summed over the programs
  afterwards (a fixed order: the same bits every run, unlike atomics).
- `tn` makes gᵀ·x the same way, without g's part (the tokens split over programs).
- `rows` makes x·Aᵀ, a program per block of rows.
Which run is `lora_triton.RANK` (TUNEDECK_LORA_RANK: "dy", the default on Hopper, runs
dy_pass beside cuBLAS's x·Aᵀ and gᵀ·x; "triton" all three; "cublas" none); bench/lora_rank.py
times them per projection. TRITON_INTERPRET=1 runs them on the CPU
(tests/test_train_lora_triton.py checks them against float64).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from tunedeck.core.train.lora_triton import _sms

# (BM, BN, num_warps, num_stages): the rows and columns of dy (x) a program reads per step
# (for `rows`: rows and K columns of x); bench/lora_rank.py times the alternatives
CONFIG = {"dy": (128, 256, 8, 3), "tn": (64, 64, 4, 4), "rows": (32, 256, 4, 3)}
# on the CPU's interpreter (the tests' shapes are tens of rows)
SMALL = (16, 16, 4, 1)
# programs per SM the grids aim at: streaming kernels need several in flight to fill HBM's pipe
WAVES = 2


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def strips(
        T, S, B, G, OUT,
        M, N, R,
        BM: tl.constexpr, BN: tl.constexpr, RP: tl.constexpr, WITH_G: tl.constexpr,
    ):  # fmt: skip
        # OUT's partial Tᵀ·S for column block j of T (M, N) over rows [i·mper·BM, ...), S
        # (M, r): one long stream of tiles a program (short inner loops would spend their time
        # filling the load pipeline). Wide rows of T are the MMA's M, not r. WITH_G (dy_pass:
        # T = dy, S = u): also T·B's partial over this column block for these rows, to G.
        i = tl.program_id(0)
        j = tl.program_id(1)
        mper = tl.cdiv(tl.cdiv(M, BM), tl.num_programs(0))
        m0 = i * mper * BM
        m1 = tl.minimum(m0 + mper * BM, M)
        rr = tl.arange(0, RP)
        rn = j * BN + tl.arange(0, BN)
        nmask = rn < N
        if WITH_G:
            b = tl.load(
                B + rn[:, None] * R + rr[None, :],
                mask=nmask[:, None] & (rr[None, :] < R),
                other=0.0,
            )
        acc = tl.zeros((BN, RP), dtype=tl.float32)
        for m in range(m0, m1, BM):
            rm = m + tl.arange(0, BM)
            mmask = rm < m1
            t = tl.load(
                T + rm[:, None] * N + rn[None, :], mask=mmask[:, None] & nmask[None, :], other=0.0
            )
            sv = tl.load(
                S + rm[:, None] * R + rr[None, :],
                mask=mmask[:, None] & (rr[None, :] < R),
                other=0.0,
            )
            acc = tl.dot(tl.trans(t), sv, acc)
            if WITH_G:  # summed over j afterwards
                tl.store(
                    G + j * M * RP + rm[:, None] * RP + rr[None, :],
                    tl.dot(t, b),
                    mask=mmask[:, None],
                )
        tl.store(OUT + i * N * RP + rn[:, None] * RP + rr[None, :], acc, mask=nmask[:, None])

    @triton.jit
    def rows(
        X, A, OUT,
        M, K, R,
        BM: tl.constexpr, BK: tl.constexpr, RP: tl.constexpr,
    ):  # fmt: skip
        # program i: rows [i·BM, ...) of x·Aᵀ, over all of K
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rr = tl.arange(0, RP)
        mmask = rm < M
        acc = tl.zeros((BM, RP), dtype=tl.float32)
        for k in range(0, K, BK):
            rk = k + tl.arange(0, BK)
            kmask = rk < K
            x = tl.load(
                X + rm[:, None] * K + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0
            )
            a = tl.load(
                A + rr[:, None] * K + rk[None, :],
                mask=(rr[:, None] < R) & kmask[None, :],
                other=0.0,
            )
            acc = tl.dot(x, tl.trans(a), acc)
        tl.store(
            OUT + rm[:, None] * R + rr[None, :],
            acc.to(OUT.dtype.element_ty),
            mask=mmask[:, None] & (rr[None, :] < R),
        )

    return triton, strips, rows


def _config(t: Tensor, config, kernel: str) -> tuple[int, int, int, int]:
    return config or (CONFIG[kernel] if t.is_cuda else SMALL)


def _rp(triton, r: int) -> int:
    return max(16, triton.next_power_of_2(r))


def _strips(t: Tensor, s: Tensor, b: Tensor | None, config, kind: str):
    """(tᵀ·s (N, r), t·b (M, r) or None), both fp32: t (M, N), s (M, r), b (N, r) or None. A
    program per column block of t, row programs enough to give every SM WAVES of them while
    each still streams several row blocks; the partials summed here."""
    triton, kernel, _ = _kernels()
    t, s = t.contiguous(), s.contiguous()
    m, n = t.shape
    r = s.shape[1]
    bm, bn, warps, stages = _config(t, config, kind)
    rp = _rp(triton, r)
    mblocks, nblocks = triton.cdiv(m, bm), triton.cdiv(n, bn)
    sms = _sms(t.device.index) if t.is_cuda else 4
    si = max(1, min(mblocks // 4, triton.cdiv(WAVES * sms, nblocks)))
    si = triton.cdiv(mblocks, triton.cdiv(mblocks, si))  # no empty row program
    out = torch.empty(si, n, rp, device=t.device, dtype=torch.float32)
    # t·b's partials: an fp32 row of r per row of t and column block
    gs = out if b is None else torch.empty(nblocks, m, rp, device=t.device, dtype=torch.float32)
    kernel[(si, nblocks)](
        t, s, s if b is None else b.contiguous(), gs, out, m, n, r,
        BM=bm, BN=bn, RP=rp, WITH_G=b is not None, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    ts = (out[0] if si == 1 else out.sum(0))[:, :r]
    if b is None:
        return ts, None
    return ts, (gs[0] if nblocks == 1 else gs.sum(0))[:, :r]


def dy_pass(dy: Tensor, b: Tensor, u: Tensor, scale: float, config=None) -> tuple[Tensor, Tensor]:
    """(g, dB) = (dy·B, s·dyᵀ·u) from one read of dy: dy (M, N), B (N, r), u (M, r); g in
    dy's dtype (fp32 sums rounded once, as cuBLAS's), dB in B's."""
    db, g = _strips(dy, u, b, config, "dy")
    return g.to(dy.dtype), (db * scale).to(b.dtype)


def tn(g: Tensor, x: Tensor, scale: float = 1.0, config=None) -> Tensor:
    """s·gᵀ·x: g (M, r), x (M, N), in x's dtype; the tokens M split over programs."""
    xg = _strips(x, g, None, config, "tn")[0]
    return (xg.t() * scale).to(x.dtype).contiguous()


def rows(x: Tensor, a: Tensor, config=None) -> Tensor:
    """x·Aᵀ: x (M, K), A (r, K) row-major, in x's dtype."""
    triton, _, kernel = _kernels()
    x, a = x.contiguous(), a.contiguous()
    m, k = x.shape
    r = a.shape[0]
    bm, bk, warps, stages = _config(x, config, "rows")
    out = x.new_empty(m, r)
    grid = (triton.cdiv(m, bm),)
    kernel[grid](
        x, a, out, m, k, r, BM=bm, BK=bk, RP=_rp(triton, r), num_warps=warps, num_stages=stages
    )
    return out
