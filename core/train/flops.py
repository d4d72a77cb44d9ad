"""Model FLOPs per step and MFU, by the convention the benchmarks use.

Per token: 2·N forward matmul FLOPs; backward 2·N for activation gradients plus 2·N for
weight gradients when the weights train (full: 6·N; LoRA's frozen base: 4·N). Attention
scores and values add 4·L·h·s forward per token for a document of s tokens (QKᵀ and AV, the
full s×s square as the plain-PyTorch anchor bench counts it, so the numbers compare; causal
kernels skip about half), ×3 with backward.
MFU divides achieved model FLOP/s by the GPU's dense bf16 peak (core/estimate/speed.py
`peak_tflops`, also with the fp8 base); None where unknown (CPU).
"""

from __future__ import annotations


def step_flops(n_params: int, layers: int, hidden: int, doc_lens: list[int], full: bool) -> float:
    tokens = sum(doc_lens)
    matmul = (6 if full else 4) * n_params * tokens
    # s² query·key pairs per document; QKᵀ and AV each 2 FLOPs per pair and hidden unit.
    pairs = sum(s * s for s in doc_lens)
    attn = 3 * 2 * 2 * layers * hidden * pairs
    return float(matmul + attn)


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / (peak * 1e12)
