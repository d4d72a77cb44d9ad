"""Small helpers shared by the detectors."""

from __future__ import annotations

import time
from typing import Protocol


class Telemetry(Protocol):
    """What detectors ask of telemetry (tunedeck.core.telemetry.sampler.TelemetrySampler has it)."""

    def gpu_util(self, gpu: int, t0: float, t1: float) -> float | None: ...

    def gpu_for_rank(self, rank: int, local_world: int | None = None) -> int | None: ...


def num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def rank_utils(
    tel: Telemetry | None, ranks, local_world: int | None, t0: float, t1: float
) -> dict[int, tuple[int, float]]:
    """rank → (its GPU, mean utilisation over [t0, t1]) for the ranks telemetry can place."""
    out: dict[int, tuple[int, float]] = {}
    if tel is None:
        return out
    for r in ranks:
        g = tel.gpu_for_rank(r, local_world)
        u = tel.gpu_util(g, t0, t1) if g is not None else None
        if u is not None:
            out[r] = (g, u)
    return out
