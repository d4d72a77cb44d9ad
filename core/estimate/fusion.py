"""When the built-in trainer runs its LoRA linears fused (core/train/lora_fused.fuse_lora).
Torch-free, so the estimate follows the same rule the ranks do."""

from __future__ import annotations

import os

# TUNEDECK_LORA_EPILOGUE's values (lora_fused's docstring); the kcats widen whole blocks and run
# the other linears as "op"; the Tritons run each linear as one Triton kernel, the wide ones
# each group of a block's projections (q/k/v, gate/up) as one and the other linears as "triton"
KCATS = ("kcat", "kcat-mlp")
WIDE_TRITONS = ("triton-wide", "triton-wide-mlp", "triton-swiglu")
TRITONS = ("triton", "triton-loop", *WIDE_TRITONS)  # core/train/lora_triton.py's kernels
EPILOGUES = ("op", "after", *KCATS, *TRITONS, "1", "0")


def fused_on(device_type: str, fp8: bool = False) -> bool:
    """On CUDA by default; TUNEDECK_FUSED_LORA=0 turns it off anywhere, =1 on anywhere; the fp8
    base always fuses (its layers exist only fused)."""
    forced = os.environ.get("TUNEDECK_FUSED_LORA", "")
    return fp8 or forced == "1" or (forced != "0" and device_type == "cuda")


def lora_epilogue(default: str = "op") -> str:
    """How the adapter meets the frozen GEMM: TUNEDECK_LORA_EPILOGUE (a measurement switch),
    else `default` (the trainer's depends on the GPU: lora_fused.default_epilogue)."""
    return os.environ.get("TUNEDECK_LORA_EPILOGUE") or default


def dropout_fuses(fp8: bool, epilogue: str) -> bool:
    """Whether a layer with dropout fuses: only where the opaque ops run it (not fp8, not a
    traced epilogue); the 4-bit op always does."""
    return not fp8 and epilogue in ("op", "after", *KCATS, *TRITONS)
