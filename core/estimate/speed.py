"""Throughput and ETA from model FLOPs, a GPU's peak and an assumed utilisation (MFU).

Training FLOPs per token: forward 2N plus attention; full fine-tuning runs backward for inputs
and weights (3x forward), LoRA only for inputs (2x forward; the adapters are tiny).
Gradient checkpointing recomputes the forward once more. Measured on H200 (ms-swift, 7B LoRA,
no checkpointing): 10,958 tok/s per GPU ≈ 0.36 MFU by this count; 0.35 is the default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tunedeck.core.backend_traits import traits_of
from tunedeck.core.estimate.arch import ModelArch

DEFAULT_MFU = 0.35
# tunedeck's built-in trainer with train.compile (the default) on a GPU, by this module's count,
# on one H200 for the 7B LoRA preset (docs/benchmarks.md, 2026-12-06: Hopper's default Triton
# kernel a LoRA linear, in one call beside Unsloth): 18,158 tok/s with bf16 products ≈ 0.55;
# with method.fp8_base (the frozen products in fp8) 26,500 ≈ 0.80; eager (2026-12-01) 12,328
# ≈ 0.37. GPUs other than Hopper run cuBLAS's layers ("op"), measured 3 % slower in bf16 and
# 12 % in fp8 on one H100, so there these plan a little fast.
BUILTIN_COMPILED_MFU = 0.55
BUILTIN_FP8_MFU = 0.80
# its fused 4-bit layers (QLoRA), compiled, on one H100 (7B, 4 × 2048, no dropout,
# 2026-12-05): 16,416 tok/s ≈ 0.50; each GEMM dequantizes its weight first
BUILTIN_QLORA_MFU = 0.50
# the fused layers' dropout, per element of an adapted linear's input: 63 ms a micro-batch of
# 9.28 G elements on an H100 (the same recipe with dropout 0.05 against without, one machine,
# 2026-12-06: 14,382 and 16,173 tok/s; the op draws its mask twice and keeps none)
DROPOUT_S_PER_ELEMENT = 0.0631 / 9.28e9
DROPOUT_MEASURED_ON = "H100"
COMPILE_GAIN = 1.38  # compiled against eager, the same loop and GPU (2026-12-01)
# fp8 frozen products against bf16, compiled, in one call on one H200 (26,500 / 18,158,
# 2026-12-06; 1.32 with cuBLAS's layers)
FP8_GAIN = 1.46


def typical_mfu(
    backend: str, compiled: bool = True, fp8: bool = False, qlora: bool = False
) -> float:
    """The utilisation to plan with for a backend: measured for the built-in trainer, the
    ms-swift figure (DEFAULT_MFU) for everything else."""
    if traits_of(backend).measured_speed and compiled:
        if qlora:
            return BUILTIN_QLORA_MFU
        return BUILTIN_FP8_MFU if fp8 else BUILTIN_COMPILED_MFU
    return DEFAULT_MFU


def spec_mfu(spec) -> float:
    """typical_mfu of what `spec` runs (its backend, compile, fp8 and 4-bit switches)."""
    m = spec.method
    return typical_mfu(
        spec.backend, spec.train.compile, m.type == "lora" and m.fp8_base, m.type == "qlora"
    )


def dropout_s_per_token(
    backend: str,
    arch: ModelArch,
    method: str,
    targets,
    dropout: float,
    gpu_name: str | None = None,
) -> float:
    """GPU seconds the built-in trainer's adapter dropout adds per token: the fused layers draw
    and apply a mask over every adapted linear's input (0 for other backends, whose measured
    utilisation already includes theirs, and without dropout). Bound by memory bandwidth, so
    scaled from the GPU it was measured on to `gpu_name`'s (unscaled where that is unknown)."""
    if not (traits_of(backend).measured_speed and method in ("lora", "qlora") and dropout > 0):
        return 0.0
    shapes = arch.linear_shapes()
    d_in = sum(shapes[mod][0] for mod in arch.lora_modules(targets))
    bw = bandwidth_tbs(gpu_name)
    scale = bandwidth_tbs(DROPOUT_MEASURED_ON) / bw if bw else 1.0
    return arch.layers * d_in * DROPOUT_S_PER_ELEMENT * scale


# Dense (no sparsity) bf16 tensor-core peak TFLOP/s, whether the GPU has fp8 matrix units
# (compute capability ≥ 8.9) and its memory's bandwidth in TB/s (the datasheet's), by a
# substring of the upper-cased NVML name, first match wins (so GB200 before B200, H100 PCIe
# before H100, A10G before A10). The trainer's MFU, the estimate's throughput and the advisor
# (planning by name, away from the GPUs) all read it; the bandwidth scales what was measured
# on one GPU's memory to another's (dropout_s_per_token).
GPUS = (
    ("GB200", 2500.0, True, 8.0),
    ("B200", 2250.0, True, 8.0),
    ("B100", 1750.0, True, 8.0),
    ("GH200", 989.0, True, 4.0),
    ("H200", 989.0, True, 4.8),
    ("H100 PCIE", 756.0, True, 2.0),
    ("H100", 989.0, True, 3.35),
    ("H800", 989.0, True, 3.35),
    ("H20", 148.0, True, 4.0),
    ("A100", 312.0, False, 2.0),
    ("A800", 312.0, False, 2.0),
    ("L40S", 362.0, True, 0.864),
    ("L40", 181.0, True, 0.864),
    ("L4", 121.0, True, 0.3),
    ("A10G", 70.0, False, 0.6),
    ("A10", 125.0, False, 0.6),
    ("RTX 6000 ADA", 364.0, True, 0.96),
    ("4090", 165.0, True, 1.0),
    ("A6000", 155.0, False, 0.768),
    ("3090", 71.0, False, 0.936),
    ("V100", 125.0, False, 0.9),
    ("T4", 65.0, False, 0.32),
    ("ADA", None, True, None),
)  # other Ada cards: fp8, peak not listed
UNKNOWN_GPU = "unknown GPU (H100-class peak assumed)"  # the estimate's name for no GPU found


def _gpu(gpu_name: str | None) -> tuple[str, float | None, bool, float | None] | None:
    if not gpu_name or gpu_name == UNKNOWN_GPU:
        return None
    name = gpu_name.upper()
    return next((g for g in GPUS if g[0] in name), None)


def fp8_capable(gpu_name: str) -> bool | None:
    """Whether a GPU of this name has fp8 units; None when the name is not known here."""
    g = _gpu(gpu_name)
    return g[2] if g else None


def builtin_speed_flags(spec, gpu_name: str) -> list[dict]:
    """Built-in trainer switches that would make this run faster on `gpu_name`, measured on one
    H200 (7B LoRA, docs/benchmarks.md), each {"flag" (a spec key), "value", "gain", "why"}."""
    if not traits_of(spec.backend).measured_speed or spec.cluster.device == "cpu":
        return []
    out = []
    if not spec.train.compile:
        out.append(
            {
                "flag": "train.compile",
                "value": "true",
                "gain": COMPILE_GAIN,
                "why": f"compiled decoder layers: ~{COMPILE_GAIN:.2f}x tokens/s after "
                "~20 s of compiling (shown as a phase in the monitor)",
            }
        )
    if (
        spec.method.type == "lora"
        and not spec.method.fp8_base
        and fp8_capable(gpu_name)
        and spec.parallel.strategy == "ddp"
        and spec.method.lora_dropout == 0
        and spec.model.dtype in ("bfloat16", "auto")
    ):
        out.append(
            {
                "flag": "method.fp8_base",
                "value": "true",
                "gain": FP8_GAIN,
                "why": f"the frozen base's matmuls in fp8: ~{FP8_GAIN:.2f}x tokens/s, "
                "same memory; caveat: on outlier-heavy activations (pretrained "
                "checkpoints) the LoRA gradients are ~6-14 % off against bf16's ~1 % "
                "(docs/benchmarks.md, fp8 study)",
            }
        )
    return out


def peak_tflops(gpu_name: str | None) -> float | None:
    g = _gpu(gpu_name)
    return g[1] if g else None


def bandwidth_tbs(gpu_name: str | None) -> float | None:
    g = _gpu(gpu_name)
    return g[3] if g else None


def flops_per_token(
    arch: ModelArch, seq_len: int, method: str, gradient_checkpointing: bool = False
) -> float:
    n = arch.total_params() - arch.embedding_params()  # the lookup costs no FLOPs
    fwd = 2 * n + 4 * arch.layers * seq_len * arch.q_dim
    mult = 3.0 if method == "full" else 2.0
    if gradient_checkpointing:
        mult += 1.0
    return fwd * mult


@dataclass
class Throughput:
    tokens_per_s_per_gpu: float
    tokens_per_s: float
    step_s: float
    eta_s: float
    mfu: float  # what the run's monitor will show: the FLOPs' share of the peak
    peak_tflops: float
    gemm_mfu: float  # the utilisation assumed while computing (mfu without the extra time)

    def to_json(self) -> dict:
        return {k: round(v, 3) for k, v in asdict(self).items()}


def throughput(
    arch: ModelArch,
    *,
    seq_len: int,
    method: str,
    world_size: int,
    tokens_per_step: int,
    steps: int,
    peak: float,
    mfu: float = DEFAULT_MFU,
    gradient_checkpointing: bool = False,
    extra_s_per_token: float = 0.0,
) -> Throughput:
    """tokens_per_step: all ranks together (effective batch × seq_len). extra_s_per_token:
    GPU time a token costs besides its FLOPs at `mfu` (dropout_s_per_token)."""
    fpt = flops_per_token(arch, seq_len, method, gradient_checkpointing)
    per_gpu = 1.0 / (fpt / (peak * 1e12 * mfu) + extra_s_per_token)
    total = per_gpu * max(world_size, 1)
    step_s = tokens_per_step / total
    # the utilisation the run will show (the monitor's MFU): `mfu` less the extra time's share
    shown = per_gpu * fpt / (peak * 1e12)
    return Throughput(per_gpu, total, step_s, step_s * steps, shown, peak, mfu)


def fmt_duration(s: float) -> str:
    s = int(s)
    if s < 90:
        return f"{s}s"
    if s < 5400:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s / 86400:.1f}d"
