"""Which parallel strategy to use, and why: the rules users follow, checked against the memory
estimate rather than guessed.

* inference/serving: vLLM tensor parallel over the fewest GPUs that hold the weights plus KV
  cache; never DDP (replicas do not make one request faster).
* LoRA/QLoRA on little data that fits one GPU: one GPU (quick anyway; no NCCL to set up).
* more data and the model fits one GPU: DDP over every GPU (near-linear speed-up).
* full fine-tuning, or no fit under DDP: FSDP2 (built-in/HF) or ZeRO-3 (DeepSpeed), adding
  gradient checkpointing and then CPU offload until it fits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from tunedeck.core.backend_traits import traits_of
from tunedeck.core.estimate import (
    GIB,
    MemoryInputs,
    ModelArch,
    estimate_memory,
    fmt_duration,
    throughput,
)
from tunedeck.core.estimate.fit import MARGIN  # plan to use at most this share of a GPU
from tunedeck.core.estimate.speed import dropout_s_per_token, typical_mfu

SMALL_DATA_HOURS = 1.0  # one GPU finishes an epoch within this: no need for more
CHARS_PER_TOKEN = 3.5


@dataclass
class Advice:
    strategy: str  # single-gpu | ddp | fsdp2 | zero3 | vllm-tp | none
    gpus: int
    gradient_checkpointing: bool = False
    offload: bool = False
    per_gpu_gib: float = 0.0
    reasons: list[str] = field(default_factory=list)
    overrides: dict[str, object] = field(default_factory=dict)  # --set keys to apply it
    # switches worth adding: ms-swift flags (core/backends/swift/speed.py), built-in spec keys (speed.py)
    speed_flags: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def dataset_tokens(path: str | Path, max_length: int) -> tuple[int, int]:
    """(rows, approximate tokens) of a JSONL file, without a tokenizer: characters / 3.5,
    capped at max_length per row."""
    from tunedeck.core.demo import read_head

    rows = tokens = 0
    try:  # bounded: a FIFO or a device is refused unread, a huge file sampled from its head
        head = read_head(path, SAMPLE_BYTES, timeout_s=10.0)
    except OSError:
        return 0, 0
    for line in head.data.splitlines():
        if line.strip():
            rows += 1
            tokens += min(int(len(line) / CHARS_PER_TOKEN), max_length)
    if head.cut and head.data:  # the rest is assumed to look like the head
        scale = head.size / len(head.data)
        rows, tokens = int(rows * scale), int(tokens * scale)
    return rows, tokens


SAMPLE_BYTES = 64 << 20


def advise(
    base: MemoryInputs,
    *,
    gpus: int,
    gpu_mem_gib: float,
    data_tokens: int = 0,
    epochs: float = 1.0,
    purpose: str = "train",
    peak_tflops: float = 989.0,
    backend: str = "builtin",
    speed_flags: list[dict] | None = None,
    mfu: float | None = None,
    gpu_name: str | None = None,
) -> Advice:
    """Recommend a strategy for `base` (its strategy/world size are ignored) on `gpus` GPUs of
    `gpu_mem_gib` each. speed_flags: the run's switches worth adding (the caller asks: an
    ms-swift run's from core/backends/swift/speed.py, a built-in one's from speed.builtin_speed_flags).
    mfu: the utilisation the hours assume (default: the backend's measured one). gpu_name:
    what memory-bound costs (the adapter's dropout) are scaled to."""
    a = _advise(
        base,
        gpus=gpus,
        gpu_mem_gib=gpu_mem_gib,
        data_tokens=data_tokens,
        epochs=epochs,
        purpose=purpose,
        peak_tflops=peak_tflops,
        backend=backend,
        mfu=typical_mfu(backend, qlora=base.method == "qlora") if mfu is None else mfu,
        gpu_name=gpu_name,
    )
    if speed_flags and purpose != "inference":
        a.speed_flags = list(speed_flags)
    return a


def _advise(
    base: MemoryInputs,
    *,
    gpus: int,
    gpu_mem_gib: float,
    data_tokens: int,
    epochs: float,
    purpose: str,
    peak_tflops: float,
    backend: str,
    mfu: float,
    gpu_name: str | None,
) -> Advice:
    cap = gpu_mem_gib * MARGIN
    arch = base.arch
    if purpose == "inference":
        return _inference(arch, gpus, gpu_mem_gib)

    def est(**kw):
        return estimate_memory(dataclasses.replace(base, **kw))

    dropout_s = dropout_s_per_token(
        backend, arch, base.method, base.lora_targets, base.lora_dropout, gpu_name
    )

    def hours(world: int, gc: bool) -> float:
        tp = throughput(
            arch,
            seq_len=base.seq_len,
            method=base.method,
            world_size=world,
            tokens_per_step=max(data_tokens, 1),
            steps=1,
            peak=peak_tflops,
            mfu=mfu,
            gradient_checkpointing=gc,
            extra_s_per_token=dropout_s,
        )
        return tp.eta_s * epochs / 3600

    sharded = traits_of(backend).sharded
    shard_name = "FSDP2" if sharded == "fsdp2" else "ZeRO-3"
    shard_kw = {"strategy": sharded, "zero_stage": 3 if sharded == "deepspeed" else 0}
    one = est(strategy="ddp", world_size=1, gradient_checkpointing=False)
    one_gc = est(strategy="ddp", world_size=1, gradient_checkpointing=True)
    size = f"{arch.total_params() / 1e9:.1f}B"
    reasons: list[str] = []

    if base.method != "full":
        for gc, e in ((False, one), (True, one_gc)):
            if e.per_gpu_gib > cap:
                continue
            why = (
                f"{base.method} on a {size} model needs {e.per_gpu_gib:.1f} GiB per GPU "
                f"(≤ {cap:.0f} of {gpu_mem_gib:.0f} GiB)"
                + (" with gradient checkpointing" if gc else "")
            )
            if gpus <= 1 or (data_tokens and hours(1, gc) <= SMALL_DATA_HOURS):
                reasons = [
                    why,
                    f"one GPU takes about {fmt_duration(hours(1, gc) * 3600)} per "
                    "epoch: more GPUs would save little and add NCCL setup",
                ]
                return Advice(
                    "single-gpu",
                    1,
                    gc,
                    False,
                    e.per_gpu_gib,
                    reasons,
                    {
                        "parallel.strategy": "ddp",
                        "cluster.nproc_per_node": 1,
                        "train.gradient_checkpointing": gc,
                    },
                )
            reasons = [
                why,
                f"the data takes ~{fmt_duration(hours(1, gc) * 3600)} per epoch "
                f"on one GPU, ~{fmt_duration(hours(gpus, gc) * 3600)} with DDP on "
                f"{gpus}: replicas split the batches, almost linear",
            ]
            return Advice(
                "ddp",
                gpus,
                gc,
                False,
                e.per_gpu_gib,
                reasons,
                {
                    "parallel.strategy": "ddp",
                    "cluster.nproc_per_node": gpus,
                    "train.gradient_checkpointing": gc,
                },
            )
        reasons.append(
            f"{base.method} does not fit one GPU even with gradient checkpointing "
            f"({one_gc.per_gpu_gib:.1f} GiB > {cap:.0f})"
        )
    else:
        ddp = est(strategy="ddp", world_size=gpus, gradient_checkpointing=False)
        if ddp.per_gpu_gib <= cap * 0.6:
            reasons = [
                f"full fine-tuning of {size} fits each GPU with room to spare "
                f"({ddp.per_gpu_gib:.1f} GiB): replicas are fastest; sharding would only "
                "add communication",
                f"~{fmt_duration(hours(gpus, False) * 3600)} per epoch on {gpus} GPU(s)",
            ]
            return Advice(
                "ddp" if gpus > 1 else "single-gpu",
                gpus,
                False,
                False,
                ddp.per_gpu_gib,
                reasons,
                {"parallel.strategy": "ddp", "cluster.nproc_per_node": gpus},
            )
        reasons.append(
            f"full fine-tuning keeps weights, gradients and AdamW states for all "
            f"{size} parameters: {ddp.per_gpu_gib:.1f} GiB per GPU replicated"
        )

    if gpus > 1:
        for gc in (False, True):
            e = est(world_size=gpus, gradient_checkpointing=gc, offload="none", **shard_kw)
            if e.per_gpu_gib <= cap:
                reasons.append(
                    f"{shard_name} shards them over {gpus} GPUs: "
                    f"{e.per_gpu_gib:.1f} GiB each" + (" with gradient checkpointing" if gc else "")
                )
                return Advice(
                    sharded if sharded == "fsdp2" else "zero3",
                    gpus,
                    gc,
                    False,
                    e.per_gpu_gib,
                    reasons,
                    _shard_overrides(sharded, gpus, gc, False),
                )
    for gc in (False, True):
        e = est(
            world_size=gpus,
            gradient_checkpointing=gc,
            offload="all",
            **(
                shard_kw
                if gpus > 1 or sharded == "deepspeed"
                else {"strategy": "fsdp2", "zero_stage": 0}
            ),
        )
        if e.per_gpu_gib <= cap:
            reasons.append(
                f"{shard_name} with CPU offload fits: {e.per_gpu_gib:.1f} GiB per GPU "
                f"+ {e.cpu_offload_bytes / GIB:.0f} GiB host RAM per rank (slower: "
                "every step moves states over PCIe)"
            )
            return Advice(
                sharded if sharded == "fsdp2" else "zero3",
                gpus,
                gc,
                True,
                e.per_gpu_gib,
                reasons,
                _shard_overrides(sharded, gpus, gc, True),
            )
    reasons.append(
        "nothing fits: use QLoRA, a shorter data.max_length, a smaller "
        "per_device_batch_size, or more GPUs"
    )
    return Advice("none", gpus, True, True, one_gc.per_gpu_gib, reasons, {})


def _shard_overrides(sharded: str, gpus: int, gc: bool, offload: bool) -> dict:
    o: dict[str, object] = {
        "parallel.strategy": sharded,
        "cluster.nproc_per_node": gpus,
        "train.gradient_checkpointing": gc,
    }
    if sharded == "fsdp2":
        o["parallel.cpu_offload"] = offload
    else:
        o["parallel.zero_stage"] = 3
        o["parallel.zero_offload"] = "all" if offload else "none"
    return o


def _inference(arch: ModelArch, gpus: int, gpu_mem_gib: float) -> Advice:
    weights = arch.total_params() * 2 / GIB
    tp = 1
    # vLLM wants weights plus room for the KV cache: at most half of each GPU for weights
    while tp < gpus and weights / tp > gpu_mem_gib * 0.5:
        tp *= 2
    tp = min(tp, max(gpus, 1))
    while arch.heads % tp and tp > 1:  # tensor parallel must divide the attention heads
        tp //= 2
    reasons = [
        f"serving: vLLM with tensor_parallel_size={tp} ({weights / tp:.1f} GiB of "
        "weights per GPU, the rest for the KV cache)",
        "not DDP: replicas do not make a single request faster; add data-parallel "
        "vLLM replicas only for more throughput",
    ]
    return Advice("vllm-tp", tp, False, False, weights / tp, reasons, {"swift.use_vllm": True})
