"""Model FLOPs per step and MFU, by the convention the benchmarks use.

Per token: 2·N forward matmul FLOPs; backward 2·N for activation gradients plus 2·N for
weight gradients when the weights train (full: 6·N; LoRA's frozen base: 4·N). Attention
scores and values add 4·L·h·s forward per token for a document of s tokens (QKᵀ and AV, the
full s×s square as the plain-PyTorch anchor bench counts it, so the numbers compare; causal
kernels skip about half), ×3 with backward.
MFU divides achieved model FLOP/s by the GPU's dense bf16 peak; None where unknown (CPU).
"""

from __future__ import annotations

# Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, by a substring of the device name.
PEAK_BF16_TFLOPS = [
    ("GB200", 2500.0), ("B200", 2250.0), ("H200", 989.0), ("H100 PCIe", 756.0),
    ("H100", 989.0), ("H800", 989.0), ("H20", 148.0), ("A100", 312.0), ("A800", 312.0),
    ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0),
    ("RTX 4090", 165.0), ("RTX 6000 Ada", 364.0), ("A6000", 155.0), ("V100", 125.0),
]


def peak_tflops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, peak in PEAK_BF16_TFLOPS:
        if key in device_name:
            return peak
    return None


def step_flops(n_params: int, layers: int, hidden: int, doc_lens: list[int],
               full: bool) -> float:
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
