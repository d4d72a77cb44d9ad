"""Memory per GPU, effective batch and throughput for a RunSpec, before any GPU is touched.

`estimate_spec(spec)` sizes a spec as it is written; `tunedeck estimate`, the compose form and
the preflight ask `core/backends/swift/run_estimate.estimate_run`, which first puts in the values the
backend will really use (ms-swift's defaults for keys an ms-swift spec leaves unset) and then
calls it. The pieces (`arch`, `memory`, `speed`) work on plain numbers for anything else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunedeck.core.backend_traits import traits_of
from tunedeck.core.estimate.fusion import dropout_fuses, fused_on, lora_epilogue
from tunedeck.core.estimate.arch import QWEN25, ArchError, ModelArch, arch_from_config, load_arch
from tunedeck.core.estimate.memory import GIB, MemoryEstimate, MemoryInputs, estimate_memory
from tunedeck.core.estimate.speed import (
    DEFAULT_MFU,
    UNKNOWN_GPU,
    Throughput,
    dropout_s_per_token,
    flops_per_token,
    fmt_duration,
    peak_tflops,
    spec_mfu,
    throughput,
)

__all__ = [
    "ArchError",
    "GIB",
    "MemoryEstimate",
    "MemoryInputs",
    "ModelArch",
    "QWEN25",
    "SpecEstimate",
    "Throughput",
    "arch_for_spec",
    "arch_from_config",
    "estimate_memory",
    "estimate_spec",
    "flops_per_token",
    "fmt_duration",
    "hub_cache_dir",
    "inputs_for_spec",
    "load_arch",
    "peak_tflops",
    "throughput",
    "DEFAULT_MFU",
]


def hub_cache_dir(model_id: str) -> Path | None:
    """A hub id's snapshot folder in the local HF or ModelScope cache, if it has a config."""
    if "/" not in model_id or model_id.startswith(("/", ".", "~")):
        return None
    hf = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
    )
    snaps = Path(hf) / ("models--" + model_id.replace("/", "--")) / "snapshots"
    if snaps.is_dir():
        for snap in sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
            if (snap / "config.json").exists():
                return snap
    ms = Path(os.environ.get("MODELSCOPE_CACHE") or os.path.expanduser("~/.cache/modelscope"))
    for cand in (ms / "hub" / "models" / model_id, ms / "hub" / model_id):
        if (cand / "config.json").exists():
            return cand
    return None


def arch_for_spec(spec) -> ModelArch:
    """The spec's model shape: the built-in demo, a local folder, or a cached hub id."""
    from tunedeck.core.demo import BUILTIN_TINY, MAX_POSITIONS, MODEL_SHAPE, VOCAB_SIZE

    path = spec.model.path
    if path == BUILTIN_TINY:
        return ModelArch(
            hidden=MODEL_SHAPE["hidden_size"],
            layers=MODEL_SHAPE["num_hidden_layers"],
            heads=MODEL_SHAPE["num_attention_heads"],
            kv_heads=MODEL_SHAPE["num_key_value_heads"],
            intermediate=MODEL_SHAPE["intermediate_size"],
            vocab=VOCAB_SIZE,
            tie_embeddings=True,
            qkv_bias=True,
            model_type="qwen2",
            max_len=MAX_POSITIONS,
        )
    p = Path(path).expanduser()
    if p.is_dir() or p.name == "config.json":
        return load_arch(p)
    cached = hub_cache_dir(path)
    if cached:
        return load_arch(cached)
    raise ArchError(
        f"model.path {path!r}: no config.json there or in the local hub cache; "
        "the estimate needs the model's config.json (a folder holding it is "
        "enough, no weights)"
    )


def fused_lora(spec, device: str) -> bool:
    """Whether the built-in trainer runs this spec's LoRA linears fused, by the trainer's own
    rule (fusion.py), read from this process's environment, which the ranks of a run it
    launches inherit (a spec's env holds no TUNEDECK_* names)."""
    m = spec.method
    if not (m.type == "lora" or (m.type == "qlora" and m.quant_bits == 4)):
        return False
    fp8 = m.type == "lora" and m.fp8_base
    if not fused_on(device, fp8):
        return False
    return not (m.lora_dropout > 0 and m.type == "lora" and not dropout_fuses(fp8, lora_epilogue()))


def inputs_for_spec(
    spec,
    arch: ModelArch | None = None,
    *,
    device: str | None = None,
    procs_per_node: int | None = None,
) -> MemoryInputs:
    """Estimator inputs from a *resolved* spec (device and process count concrete)."""
    c, p, m, t = spec.cluster, spec.parallel, spec.method, spec.train
    own = traits_of(spec.backend).trainer_memory
    device = device or (c.device if c.device != "auto" else "cpu")
    procs = procs_per_node or c.nproc_per_node or (1 if device == "cuda" else c.cpu_procs)
    dtype = spec.model.dtype
    compute = 4 if dtype == "float32" or (dtype == "auto" and device == "cpu") else 2
    offload = "none"
    if p.strategy == "fsdp2" and p.cpu_offload:
        offload = "all"
    elif p.strategy == "deepspeed":
        offload = p.zero_offload
    return MemoryInputs(
        arch=arch or arch_for_spec(spec),
        method=m.type,
        lora_rank=m.lora_rank,
        lora_targets=tuple(m.target_modules),
        lora_dropout=m.lora_dropout,
        quant_bits=m.quant_bits,
        micro_batch=t.per_device_batch_size,
        seq_len=spec.data.max_length,
        grad_accum=t.grad_accum,
        strategy=p.strategy,
        zero_stage=p.zero_stage if p.strategy == "deepspeed" else 0,
        offload=offload,
        world_size=procs * c.nnodes,
        tp=p.tp if p.strategy == "megatron" else 1,
        pp=p.pp if p.strategy == "megatron" else 1,
        gradient_checkpointing=t.gradient_checkpointing,
        compute_bytes=compute,
        autocast=compute == 2,
        master_fp32=own and m.type == "full",
        # the built-in trainer's AdamW is fused on CUDA (no foreach temporaries)
        fused_optimizer=own and device == "cuda" and not p.cpu_offload,
        attn_impl=spec.model.attn_impl,
        device=device,
        # the built-in trainer: chunked cross-entropy, compiled layers (CUDA), expandable segments
        loss_chunk_elems=2**29 if own and device == "cuda" else 0,
        compiled=own and device == "cuda" and bool(t.compile),
        fused_lora=own and fused_lora(spec, device),
        expandable_segments=own and device == "cuda",
        grads_in_buckets=own and p.strategy == "ddp",
        fp8_base=traits_of(spec.backend).fp8_base and m.type == "lora" and m.fp8_base,
    )


@dataclass
class SpecEstimate:
    inputs: MemoryInputs
    memory: MemoryEstimate
    effective_batch: int
    throughput: Throughput | None
    gpu_name: str
    gpu_mem_gib: float | None
    spec: Any = None  # the resolved spec these numbers are of

    def to_json(self) -> dict:
        mem = self.memory.to_json()
        out = {
            "per_gpu_gib": mem["per_gpu_gib"],
            "reserved_gib": mem["reserved_gib"],
            "allocated_gib": mem["allocated_gib"],
            "breakdown": mem["breakdown"],
            "peak_phase": mem["peak_phase"],
            "params": mem["params"],
            "trainable_params": mem["trainable_params"],
            "checkpoint_gib": round(mem["checkpoint_bytes"] / GIB, 3),
            "notes": mem["notes"],
            "effective_batch": self.effective_batch,
            "world_size": self.inputs.world_size,
            "device": self.inputs.device,
            "gpu": self.gpu_name,
            "gpu_mem_gib": self.gpu_mem_gib,
            "inputs": self.inputs.to_json(),
        }
        if self.throughput:
            out["throughput"] = self.throughput.to_json()
            out["throughput"]["eta"] = fmt_duration(self.throughput.eta_s)
        return out


def estimate_spec(
    spec,
    *,
    gpus: int | None = None,
    gpu_name: str = "",
    gpu_mem_gib: float | None = None,
    mfu: float | None = None,
) -> SpecEstimate:
    """Estimate for a spec. `gpus` forces GPUs per node (planning on a machine without them);
    otherwise the spec is resolved against this machine's GPUs. mfu: the utilisation assumed
    for the throughput (default: what this spec's backend and switches were measured at)."""
    from tunedeck.core.estimate.resolve import resolve
    from tunedeck.core.telemetry.gpus import list_gpus

    # NVML starts in seconds on some nodes: ask it only for what the caller did not say
    found = list_gpus() if not gpu_name or gpu_mem_gib is None else []
    if gpus is None:
        r = resolve(spec)
        device, procs = r.cluster.device, r.cluster.nproc_per_node
    else:
        r = resolve(spec, gpu_count=gpus)
        device, procs = "cuda", gpus
    if found and not gpu_name:
        gpu_name = found[0].name
        gpu_mem_gib = gpu_mem_gib or min(g.memory_total_gib for g in found)
    inp = inputs_for_spec(r, device=device, procs_per_node=procs)
    mem = estimate_memory(inp)
    eff = r.train.per_device_batch_size * r.train.grad_accum * procs * r.cluster.nnodes
    tp = None
    peak = peak_tflops(gpu_name) if gpu_name else None
    if device == "cuda" and peak is None:
        peak = 989.0  # unknown GPU: an H100-class peak, labelled as assumed below
        gpu_name = gpu_name or UNKNOWN_GPU
    if device == "cuda":
        dropout_s = dropout_s_per_token(
            r.backend, inp.arch, inp.method, inp.lora_targets, inp.lora_dropout, gpu_name
        )
        tp = throughput(
            inp.arch,
            seq_len=inp.seq_len,
            method=inp.method,
            world_size=inp.world_size,
            tokens_per_step=eff * inp.seq_len,
            steps=r.train.max_steps,
            peak=peak,
            mfu=spec_mfu(r) if mfu is None else mfu,
            gradient_checkpointing=inp.gradient_checkpointing,
            extra_s_per_token=dropout_s,
        )
        if dropout_s:
            mem.notes.append(
                f"the adapter's dropout ({inp.lora_dropout:g}) takes ≈"
                f"{dropout_s * tp.tokens_per_s_per_gpu:.0%} of each step's GPU time "
                "(planned from one H100 measurement, scaled by memory bandwidth; "
                "method.lora_dropout = 0 skips it)"
            )
    return SpecEstimate(inp, mem, eff, tp, gpu_name, gpu_mem_gib, r)
