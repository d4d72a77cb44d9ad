"""Straggler: one rank's steps take clearly longer than the others'.

Uses `compute_s` when events carry it, else step_s - data_wait_s (data starvation is the other
detector's business). In synchronous DDP a slow rank also makes the others wait inside the
all-reduce, which hides part of the skew from step_s; GPU utilisation (the straggler's GPU busy,
the others idling) is added as evidence when telemetry exists.
"""

from __future__ import annotations

from collections import deque

from tunedeck.core.detect.common import Telemetry, median, num, rank_utils
from tunedeck.core.diagnose.finding import Finding


class StragglerDetector:
    RECOVER_CHECKS = 10

    def __init__(
        self,
        window: int = 20,
        skew: float = 1.25,
        min_gap_s: float = 0.05,
        telemetry: Telemetry | None = None,
        local_world: int | None = None,
    ):
        self.window = window
        self.skew = skew
        self.min_gap_s = min_gap_s
        self.telemetry = telemetry
        self.local_world = local_world
        self.times: dict[int, deque] = {}
        self.flagged: set[int] = set()
        self.calm = 0  # consecutive checks below the recovery line

    def update(self, events: list[dict]) -> None:
        for e in events:
            if e.get("kind") == "start":
                self.times.clear()
                continue
            if e.get("kind") != "step" or not isinstance(e.get("rank"), int):
                continue
            c = num(e.get("compute_s"))
            if c is None:
                s, w = num(e.get("step_s")), num(e.get("data_wait_s")) or 0.0
                c = s - w if s is not None else None
            if c is not None and c >= 0:
                self.times.setdefault(e["rank"], deque(maxlen=self.window)).append(c)

    def check(self, now: float) -> list:
        full = {
            r: median(list(d)) for r, d in self.times.items() if len(d) >= max(5, self.window // 2)
        }
        if len(full) < 2:
            return []
        slow = max(full, key=full.get)
        rest = median([v for r, v in full.items() if r != slow])
        ratio = full[slow] / rest if rest > 0 else 0.0
        # recovered only when the skew stays away for a while: GPU warm-up steps are noisy
        # enough to dip below the line once (a slow rank on 2xH200 was reported twice)
        self.calm = self.calm + 1 if ratio < 1 + (self.skew - 1) / 2 else 0
        if self.calm >= self.RECOVER_CHECKS:
            self.flagged.clear()
        if ratio < self.skew or full[slow] - rest < self.min_gap_s or slow in self.flagged:
            return []
        self.flagged.add(slow)
        evidence = [
            f"median step time without data wait over the last {self.window} steps: "
            + ", ".join(f"rank {r} {v:.3f} s" for r, v in sorted(full.items()))
        ]
        utils = [
            f"GPU {g} (rank {r}) {u:.0f} %"
            for r, (g, u) in rank_utils(
                self.telemetry, sorted(full), self.local_world, now - 60, now
            ).items()
        ]
        if utils:
            evidence.append("GPU utilisation, last 60 s: " + ", ".join(utils))
        return [
            Finding(
                category="straggler",
                severity="warning",
                rank=slow,
                t=now,
                summary=f"rank {slow} is a straggler: its steps take {ratio:.2f}x the others' "
                f"({full[slow]:.3f} s vs {rest:.3f} s)",
                cause=(
                    f"Rank {slow} computes each step {ratio:.2f}x slower than the median rank; in "
                    "synchronous training every other rank waits for it, so the whole job runs "
                    "at its pace."
                ),
                fix=(
                    "Check rank's GPU for throttling (temperature, power cap, clocks in the GPU "
                    "panel), other processes sharing that GPU or its CPU cores, uneven sequence "
                    "lengths per rank (use length grouping / packing), and a slower PCIe/NUMA "
                    "placement; replace the GPU or exclude it (cluster.gpus) if it persists."
                ),
                evidence=evidence,
                source="events",
            )
        ]
