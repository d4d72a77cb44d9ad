"""GPU discovery through NVML. Any NVMLError means "no usable GPU" here, never a crash."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_total_gib: float


def list_gpus() -> list[GpuInfo]:
    """Physical GPUs NVML sees (ignores CUDA_VISIBLE_DEVICES); [] without a driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            if isinstance(name, bytes):
                name = name.decode()
            mem = pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30
            out.append(GpuInfo(i, name, round(mem, 1)))
        return out
    except pynvml.NVMLError:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def visible_gpu_count(gpus_field: str = "") -> int:
    """GPUs a run would get: the spec's list, else CUDA_VISIBLE_DEVICES, else all."""
    total = len(list_gpus())
    if total == 0:
        return 0
    sel = gpus_field or os.environ.get("CUDA_VISIBLE_DEVICES")
    if sel is None:
        return total
    ids = [s for s in sel.split(",") if s.strip() and s.strip() != "-1"]
    return min(len(ids), total)
