"""Which GPUs are free for a queued run: not held by a live run of this home (the GPUs its
queue record took, or the ones its spec names) and not used by another process beyond
BUSY_MIB of memory (NVML; the fake NVML of CI behind the same interface)."""

from __future__ import annotations

from typing import Any

from tunedeck.core.envnum import env_number
from tunedeck.core.telemetry.fake import from_env
from tunedeck.core.telemetry.nvml import Nvml


def busy_mib() -> float:
    """TUNEDECK_QUEUE_BUSY_MIB: memory another process may use on a GPU still called free."""
    return env_number("TUNEDECK_QUEUE_BUSY_MIB", 1024.0)


def nvml_view(ours: set[int]) -> tuple[int, set[int]]:
    """(GPU count, GPUs a process not of this home's runs uses beyond busy_mib()); (0, {})
    without NVML."""
    nv = Nvml(lib=from_env())
    if not nv.init():
        return 0, set()
    try:
        limit = busy_mib()
        busy = {
            i
            for i in range(nv.count)
            if any(pid not in ours and (mib or 0) > limit for pid, mib in nv.gpu_processes(i))
        }
        return nv.count, busy
    finally:
        nv.close()


def named(gpus: str) -> list[int]:
    """cluster.gpus ("0,1") as indices."""
    return [int(x) for x in gpus.split(",") if x.strip().isdigit()]


def held_by(state: dict[str, Any], spec_gpus: str) -> list[int]:
    """The GPUs a live (started) run holds: those its queue record took, else its spec's."""
    q = state.get("queue") or {}
    if isinstance(q.get("gpus"), list):
        return [int(g) for g in q["gpus"] if isinstance(g, int)]
    return named(spec_gpus)
