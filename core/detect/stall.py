"""Stall: no new step for k × the recent step time (with a floor).

A hung collective never raises by itself (ms-swift's default DDP timeout is 208 days), so the
agent must notice that steps stopped. Ranks whose last step is behind the others are the stuck
ones; when all stopped at the same step (DDP: every rank waits in the all-reduce for the one
that never arrives), the finding says so and offers stack dumps of every rank. GPU telemetry
can still tell them apart: NCCL kernels spin while they wait, so the waiting ranks' GPUs show
~100 % utilisation and the stuck rank's GPU ~0 % (measured on 2xH200, tests/fixtures/h200/
hung_rank); such an idle rank is then named.
"""

from __future__ import annotations

import shutil
from collections import deque

from tunedeck.core.detect.common import Telemetry, clock, median, num, rank_utils, ranks_text
from tunedeck.core.diagnose.finding import Finding


class StallDetector:
    IDLE_PCT = 10.0  # a stuck rank's GPU ...
    BUSY_PCT = 80.0  # ... while a peer's spins in the collective

    def __init__(
        self,
        k: float = 10.0,
        floor_s: float = 60.0,
        first_step_s: float = 900.0,
        pids: dict[int, int] | None = None,
        telemetry: Telemetry | None = None,
        local_world: int | None = None,
    ):
        self.telemetry = telemetry
        self.local_world = local_world
        self.k = k
        self.floor_s = floor_s
        self.first_step_s = first_step_s  # model loading may take long; a hang before step 1
        self.pids = pids if pids is not None else {}  # rank -> pid (filled by the monitor)
        self.last: dict[int, tuple[int, float]] = {}  # rank -> (step, t)
        self.durations: deque = deque(maxlen=64)
        self.started: float | None = None
        self.ended: set[int] = set()
        self.flagged = False

    def update(self, events: list[dict]) -> None:
        for e in events:
            kind, rank, t = e.get("kind"), e.get("rank"), num(e.get("t"))
            if not isinstance(rank, int) or t is None:
                continue
            if kind == "start":
                self.started = t
                self.last.clear()
                self.ended.clear()
                self.flagged = False
            elif kind == "step" and isinstance(e.get("step"), int):
                prev = self.last.get(rank)
                self.last[rank] = (e["step"], t)
                s = num(e.get("step_s"))
                if s is None and prev is not None:
                    s = (t - prev[1]) / max(1, e["step"] - prev[0])
                if s is not None and s > 0:
                    self.durations.append(s)
                self.flagged = False  # progress: a new stall is a new episode
            elif kind == "end":
                self.ended.add(rank)

    def limit(self) -> float:
        recent = median(list(self.durations)) if self.durations else 0.0
        return max(self.floor_s, self.k * recent)

    def check(self, now: float) -> list:
        if self.flagged:
            return []
        if not self.last:
            if self.started is not None and now - self.started > self.first_step_s:
                self.flagged = True
                return [
                    self._finding(now, now - self.started, [], self.first_step_s, before_first=True)
                ]
            return []
        if self.ended and self.ended >= set(self.last):
            return []
        latest = max(t for _, t in self.last.values())
        idle = now - latest
        lim = self.limit()
        if idle < lim:
            return []
        self.flagged = True
        top = max(s for s, _ in self.last.values())
        behind = sorted(r for r, (s, _) in self.last.items() if s < top)
        return [self._finding(now, idle, behind, lim, gpu=self._gpu_split(latest, now))]

    def _gpu_split(self, latest: float, now: float) -> tuple[list[int], str] | None:
        """(ranks whose GPU idled since the last step while another's was busy, evidence)."""
        tel = self.telemetry
        if tel is None:
            return None
        util = rank_utils(tel, sorted(self.last), self.local_world, latest + 1.0, now)
        idle = [r for r, (_, u) in util.items() if u <= self.IDLE_PCT]
        if not idle or not any(u >= self.BUSY_PCT for _, u in util.values()):
            return None
        return idle, "GPU utilisation since the last step: " + ", ".join(
            f"GPU {g} (rank {r}) {u:.0f} %" for r, (g, u) in util.items()
        )

    def _finding(
        self,
        now: float,
        idle: float,
        behind: list[int],
        lim: float,
        before_first: bool = False,
        gpu: tuple[list[int], str] | None = None,
    ) -> Finding:
        evidence = [
            f"rank {r}: last step {s} at {clock(t)} ({now - t:.0f} s ago)"
            for r, (s, t) in sorted(self.last.items())
        ]
        if self.durations:
            evidence.append(
                f"recent step time {median(list(self.durations)):.2f} s; limit "
                f"max({self.floor_s:.0f} s, {self.k:g} x step time) = {lim:.0f} s"
            )
        if before_first:
            summary = f"no first step {idle:.0f} s after the ranks started"
            cause = (
                "The ranks started but none finished a step: a hang in process-group "
                "setup, the first collective, or a very slow first batch."
            )
        elif behind:
            top = max(s for s, _ in self.last.values())
            summary = (
                f"stalled: {ranks_text(behind)} stopped progressing "
                f"({idle:.0f} s without a step; others reached step {top})"
            )
            cause = (
                f"{ranks_text(behind).capitalize()} stopped making progress while the others "
                f"went on to step {top}; they will now wait for it in the next collective."
            )
        else:
            step = max(s for s, _ in self.last.values())
            summary = f"stalled: no rank has finished a step for {idle:.0f} s (all at step {step})"
            cause = (
                f"Every rank stopped after step {step}. In DDP all ranks wait in the "
                "gradient all-reduce for the one that never arrives, so the stuck rank is "
                "the one whose stack is NOT inside a collective. A hung collective never "
                "times out by itself when the timeout is huge (ms-swift's default DDP "
                "timeout is 208 days)."
            )
            if gpu is not None:
                behind = gpu[0]
                summary += (
                    f"; {ranks_text(behind)} idle on the GPU while the others wait in a collective"
                )
                cause += (
                    f" GPU telemetry points at {ranks_text(behind)}: NCCL kernels keep a "
                    f"waiting rank's GPU at ~100 % utilisation, while the GPU of "
                    f"{ranks_text(behind)} has been idle since the last step."
                )
                evidence.append(gpu[1])
        stuck = behind or sorted(self.last)
        dumps = [f"py-spy dump --pid {self.pids[r]}   # rank {r}" for r in stuck if r in self.pids]
        have = shutil.which("py-spy") is not None
        fix = (
            "Look at where the stuck ranks are: "
            + ("; ".join(dumps) if dumps else "py-spy dump --pid <rank pid>")
            + ("" if have else " (pip install py-spy)")
            + ". Then check the rank's log for the last thing it did (data loading, a "
            "checkpoint save, an uneven number of batches per rank). Set a finite "
            "collective timeout (cluster.collective_timeout_s for the built-in trainer, "
            "ms-swift --ddp_timeout 1800) so a hang fails "
            "instead of burning GPU hours, and stop the run if it does not recover."
        )
        return Finding(
            category="stall",
            severity="error",
            t=now,
            rank=behind[0] if len(behind) == 1 else None,
            summary=summary,
            cause=cause,
            fix=fix,
            evidence=evidence,
            source="events",
        )
