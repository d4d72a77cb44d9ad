"""RunWatcher: incremental view of one run for live displays.

Each poll reads only what was appended since the last one (byte offsets into rank 0's event file
and log files), so watching a week-long run costs the same per second as watching a new one.
The watcher keeps one read-only Store (one run.db connection) for its life: call close().
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunedeck.core.ingest.tail import RankLogTail, Tail
from tunedeck.core.rundir import RunDir
from tunedeck.core.runs.registry import RunInfo, read_run
from tunedeck.core.runs.store import Store


@dataclass
class Snapshot:
    run: RunInfo | None
    steps: list[int]
    losses: list[float]
    last_step: dict[str, Any] | None
    new_log_lines: list[str]
    log_reset: bool
    eta_s: float | None
    tokens_per_s: float | None
    checkpoints: list[str] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)  # newest version of each
    telemetry: dict[str, Any] = field(default_factory=dict)       # latest sample


class RunWatcher:
    def __init__(self, run_dir: Path, rank: int = 0, log_lines: int = 200):
        self.run_dir = run_dir
        self.run = RunDir(run_dir)
        self.rank = rank
        self.store = Store(self.run)
        self.events = Tail(self.run.event_file(rank))
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.step_times: collections.deque[tuple[int, float]] = collections.deque(maxlen=50)
        self.last_step: dict[str, Any] | None = None
        self.checkpoints: list[str] = []
        self.logs = RankLogTail(self.run, rank, backlog=log_lines)
        self.log_lines = log_lines

    def close(self) -> None:
        self.store.close()

    def poll(self) -> Snapshot:
        run = read_run(self.run_dir)
        self._read_events()
        new_lines, reset = self._read_logs()
        return Snapshot(run=run, steps=list(self.steps), losses=list(self.losses),
                        last_step=self.last_step, new_log_lines=new_lines, log_reset=reset,
                        eta_s=self._eta(run), tokens_per_s=self._tokens_per_s(),
                        checkpoints=list(self.checkpoints), findings=self._findings(),
                        telemetry=self.store.telemetry_latest())

    def _findings(self) -> list[dict[str, Any]]:
        """Findings the agent stored; a finding refined by later evidence replaces itself."""
        latest: dict[tuple, dict[str, Any]] = {}
        for f in self.store.findings():
            latest[(f.get("category"), f.get("rank"), f.get("node"), f.get("summary"))] = f
        order = {"error": 0, "warning": 1, "info": 2}
        return sorted(latest.values(), key=lambda f: (not f.get("root_cause", True),
                                                      order.get(f.get("severity"), 3),
                                                      f.get("t") or 0))

    def _read_events(self) -> None:
        for e in self.events.records(max_bytes=16 << 20):   # the rest next poll
            kind = e.get("kind")
            if kind == "step" and isinstance(e.get("step"), int):
                step = e["step"]
                # a restart may repeat steps: drop the tail the new attempt overwrites
                while self.steps and self.steps[-1] >= step:
                    self.steps.pop()
                    self.losses.pop()
                self.steps.append(step)
                self.losses.append(float(e.get("loss") or 0.0))
                self.last_step = e
                if isinstance(e.get("t"), (int, float)):
                    self.step_times.append((step, float(e["t"])))
            elif kind == "checkpoint" and e.get("path"):
                self.checkpoints.append(str(e["path"]))

    def _read_logs(self) -> tuple[list[str], bool]:
        """New lines of the rank's log (at most 16 MB a poll); on first look or a new attempt
        (reset) its last `log_lines` lines."""
        lines, reset = self.logs.poll(max_bytes=16 << 20)
        return lines[-self.log_lines:], reset

    def _eta(self, run: RunInfo | None) -> float | None:
        if not run or run.status != "running" or len(self.step_times) < 2:
            return None
        (s0, t0), (s1, t1) = self.step_times[0], self.step_times[-1]
        if s1 <= s0:
            return None
        per_step = (t1 - t0) / (s1 - s0)
        remaining = max(run.max_steps - s1, 0)
        # the last step may be a while ago if the run stalled: count that time as spent
        return max(remaining * per_step - (time.time() - t1), 0.0)

    def _tokens_per_s(self) -> float | None:
        if not self.last_step:
            return None
        tps = self.last_step.get("tokens_per_s")
        return float(tps) if isinstance(tps, (int, float)) else None
