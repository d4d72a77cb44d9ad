"""The arithmetic of fp8 (e4m3) scaling schemes for a frozen base's matmuls, without a GPU.

A scheme is the shape of the group that shares one scale: a whole row (1 × K, what
lora_fused.quant_rows does on the GPU), a 1 × 128 tile of an activation, a 128 × 128 block
of a weight (the finer recipe of DeepSeek-V3), optionally with a few outlier input channels
kept out of fp8. `product` computes A·Bᵀ as an fp8 GEMM with fp32 accumulation would, on
de-quantized values: what bench/fp8_study.py compares with bf16 and float64, and what the
tests check against a float64 reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448


def quantize(t: torch.Tensor, group: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 values of a 2-d `t` and the float64 factor that undoes each group's scaling, one
    per (group rows × group cols) block: each block's largest magnitude maps to 448.
    A group dimension of 0 means the whole extent (group (1, 0) = one scale per row)."""
    r, c = t.shape
    gr, gc = group[0] or r, group[1] or c
    if r % gr or c % gc:
        raise ValueError(f"fp8 groups {gr}x{gc} do not tile a {r}x{c} tensor")
    blocks = t.double().reshape(r // gr, gr, c // gc, gc)
    amax = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-12)
    scale = E4M3_MAX / amax
    q = (blocks * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).reshape(r, c)
    return q, scale.reciprocal().reshape(r // gr, c // gc)


def dequantize(q: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """float64 values of quantize's output: each group's e4m3 values times its factor."""
    r, c = q.shape
    gr, gc = r // inv.shape[0], c // inv.shape[1]
    f = inv.repeat_interleave(gr, dim=0).repeat_interleave(gc, dim=1)
    return q.double() * f


def fake_quant(t: torch.Tensor, group: tuple[int, int]) -> torch.Tensor:
    return dequantize(*quantize(t, group))


@dataclass(frozen=True)
class Scheme:
    """How A (N × K, activations or output gradients) and B (M × K, the weight as the GEMM
    reads it) are grouped along the contraction K; `outliers` input channels of the largest
    magnitude in A stay in bf16 (a separate bf16 product added to the fp8 one)."""

    name: str
    a_group: tuple[int, int]
    b_group: tuple[int, int]
    outliers: int = 0


ROWS = Scheme("per-row (1×K activations, per-channel weights)", (1, 0), (1, 0))
TILES = Scheme("1×128 activation tiles, 128×128 weight blocks", (1, 128), (128, 128))
ROWS_OUTLIERS = Scheme("per-row, 8 largest input channels in bf16", (1, 0), (1, 0), outliers=8)
SCHEMES = (ROWS, TILES, ROWS_OUTLIERS)


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(t.dtype)


def product(a: torch.Tensor, b: torch.Tensor, scheme: Scheme | None) -> torch.Tensor:
    """A·Bᵀ with fp32 accumulation, returned as bf16 values (in float64): both operands in
    fp8 under `scheme`, or in bf16 when scheme is None."""
    acc = torch.float32
    if scheme is None:
        return bf16((bf16(a).to(acc) @ bf16(b).to(acc).t()).double())
    keep = torch.zeros(a.shape[1], dtype=torch.bool, device=a.device)
    if scheme.outliers:
        keep[a.abs().amax(dim=0).topk(scheme.outliers).indices] = True
    a8, b8 = a.masked_fill(keep, 0), b.masked_fill(keep, 0)
    out = fake_quant(a8, scheme.a_group).to(acc) @ fake_quant(b8, scheme.b_group).to(acc).t()
    if scheme.outliers:
        out += bf16(a[:, keep]).to(acc) @ bf16(b[:, keep]).to(acc).t()
    return bf16(out.double())
