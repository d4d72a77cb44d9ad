"""Two alerts no finding stands for, judged while torchrun runs (the agent's supervise loop,
the only time `RunAlerts.tick` is called):

- `idle_gpus`: every GPU the telemetry sampler last read (NVML, run.db's latest snapshot)
  under IDLE_UTIL % for `alerts.idle_minutes`: a run that holds its GPUs and does nothing.
- `eta_reached`: the run is still going `alerts.eta_margin` past the end its pace promised
  once EARLY_FRACTION of its steps were done (rank 0's step times in run.db, so the model's
  loading is not counted as pace): a hang, a slowdown or a stuck last step.

Both are pure over their inputs; `readings` fetches those inputs in one read-only look."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from tunedeck.core.telemetry.store import read_latest

IDLE_UTIL = 5.0  # % NVML utilisation under which a GPU counts as idle
EARLY_FRACTION = 0.1
EARLY_MIN_STEPS = 3  # a pace needs a few steps after the first


@dataclass
class Readings:
    utils: list[float]  # each GPU's latest utilisation, % ([] without NVML)
    first: tuple[int, float] | None  # rank 0's first step and its time
    last: tuple[int, float] | None  # its newest
    max_steps: int


def readings(con: sqlite3.Connection) -> Readings:
    gpus = read_latest(con).get("gpus") or []
    utils = [float(g["util"]) for g in gpus if isinstance(g.get("util"), (int, float))]
    try:
        first = con.execute(
            "SELECT step, t FROM steps WHERE rank=0 ORDER BY step LIMIT 1"
        ).fetchone()
        last = con.execute(
            "SELECT step, t, max_steps FROM steps WHERE rank=0 ORDER BY step DESC LIMIT 1"
        ).fetchone()
    except sqlite3.Error:  # no steps table yet
        first = last = None
    return Readings(
        utils,
        (int(first[0]), float(first[1])) if first and first[1] is not None else None,
        (int(last[0]), float(last[1])) if last and last[1] is not None else None,
        int(last[2] or 0) if last else 0,
    )


class IdleGpus:
    def __init__(self, minutes: float):
        self.after_s = minutes * 60.0
        self.since: float | None = None

    def due(self, now: float, utils: list[float]) -> float | None:
        """How long every GPU has been idle, once that is `minutes` or more; else None."""
        if not utils or any(u >= IDLE_UTIL for u in utils):
            self.since = None
            return None
        if self.since is None:
            self.since = now
        idle = now - self.since
        return idle if idle >= self.after_s else None


class EtaWatch:
    def __init__(self, margin: float):
        self.margin = margin
        self.promised: float | None = None  # the end time the early pace promised

    def due(self, now: float, r: Readings) -> float | None:
        """The promised end, once the run is `margin` past it and not done; else None."""
        if r.first is None or r.last is None or r.max_steps <= 0:
            return None
        (s0, t0), (s1, t1) = r.first, r.last
        if self.promised is None:
            early = max(s0 + EARLY_MIN_STEPS, int(EARLY_FRACTION * r.max_steps))
            if s1 < early or t1 <= t0:
                return None
            self.promised = t0 + (t1 - t0) / (s1 - s0) * (r.max_steps - s0)
        if s1 >= r.max_steps:
            return None
        late = now - t0 >= (self.promised - t0) * (1 + self.margin)
        return self.promised if late else None
