"""The agent's plug-ins: telemetry sampling, the probe reader and the live detectors.

`make_monitors(agent)` is called once torchrun has started. Every monitor has
tick(now, new_events) (~every 0.5 s, must stay well under 50 ms) and close(new_events).
One monitor failing to start never stops the others, nor the run. A backend module with a
`monitors(agent)` function (core/backends/<backend>.py) adds its own.
"""

from __future__ import annotations

import importlib
import time
import logging
import os
from typing import Any

from tunedeck.core.detect.stall import StallDetector
from tunedeck.core.detect.starvation import StarvationDetector
from tunedeck.core.detect.straggler import StragglerDetector
from tunedeck.core.probe.reader import ProbeTail

log = logging.getLogger("tunedeck.monitors")

CHECK_EVERY_S = 1.0


def _rank_pids(agent) -> list[int]:
    return list(agent.state.get("worker_pids") or [])


def _slow_s() -> float:
    """Seconds between reads of the slow telemetry (power, clocks, PCIe/NVLink, GPU process
    lists, disk): TUNEDECK_TELEMETRY_SLOW_S, default 10."""
    raw = os.environ.get("TUNEDECK_TELEMETRY_SLOW_S", "").strip()
    try:
        return max(1.0, float(raw)) if raw else 10.0
    except ValueError:
        log.warning("TUNEDECK_TELEMETRY_SLOW_S=%r is not a number; using 10", raw)
        return 10.0


class TelemetryMonitor:
    def __init__(self, agent):
        from tunedeck.core.telemetry.fake import from_env
        from tunedeck.core.telemetry.nvml import Nvml
        from tunedeck.core.telemetry.sampler import TelemetrySampler
        from tunedeck.core.telemetry.store import TelemetryStore

        spec = agent.spec
        self.sampler = TelemetrySampler(
            TelemetryStore(agent.store.db), interval_s=spec.run.telemetry_interval_s,
            rank_pids=lambda: _rank_pids(agent), out_dir=spec.run.output_dir or None,
            nvml=Nvml(lib=from_env()), slow_s=_slow_s())

    def tick(self, now: float, new_events: list[dict]) -> None:
        self.sampler.tick(now, new_events)

    def close(self, new_events: list[dict]) -> None:
        self.sampler.close(new_events)


class DetectorMonitor:
    """Feeds rank events and probe records to the detectors; stores what they find."""

    def __init__(self, agent, telemetry=None):
        self.agent = agent
        spec = agent.spec
        local_world = spec.cluster.nproc_per_node or None
        self.probe = ProbeTail(agent.run_dir, agent.store.db)
        self.pids: dict[int, int] = {}
        floor = float(os.environ.get("TUNEDECK_STALL_FLOOR_S", "") or 60.0)
        self.detectors = [
            StarvationDetector(telemetry=telemetry, local_world=local_world),
            StallDetector(floor_s=floor, pids=self.pids, telemetry=telemetry,
                          local_world=local_world),
            StragglerDetector(telemetry=telemetry, local_world=local_world),
        ]
        self.telemetry = telemetry
        self.last_check = 0.0

    def tick(self, now: float, new_events: list[dict]) -> None:
        events = list(new_events) + self.probe.poll()
        for d in self.detectors:
            d.update(events)
        if now - self.last_check < CHECK_EVERY_S:
            return
        self.last_check = now
        if self.agent.stop_mode:  # a stop pauses steps on purpose: nothing to detect now
            return
        self._map_pids()
        for d in self.detectors:
            for f in d.check(now):
                f.node = self.agent.node_rank
                if self.agent.store.save_finding(f):
                    log.warning("finding %s: %s", f.category, f.summary)

    def _map_pids(self) -> None:
        procs = getattr(self.telemetry, "procs", None)
        for i, pid in enumerate(_rank_pids(self.agent)):
            rank = procs.rank_of(pid) if procs is not None else None
            self.pids[rank if rank is not None else i] = pid

    def close(self, new_events: list[dict]) -> None:
        events = list(new_events) + self.probe.poll()
        for d in self.detectors:
            d.update(events)


class DiagnosisMonitor:
    """Log-based findings (crashes, OOM, NCCL, flags...) while the run goes, stored in run.db
    so every viewer sees them as they appear. Polls every few seconds by byte offset."""

    INTERVAL_S = 5.0

    def __init__(self, agent) -> None:
        self.agent = agent
        self.diag = None
        self.paths: tuple[str, ...] = ()
        self.last = 0.0
        self.first_seen: dict[tuple, float] = {}

    def tick(self, now: float, new_events: list[dict]) -> None:
        if now - self.last >= self.INTERVAL_S:
            self.last = now
            self._poll(final=False)

    def close(self, new_events: list[dict]) -> None:
        self._poll(final=True)

    def _poll(self, final: bool) -> None:
        from tunedeck.core.diagnose.engine import Diagnosis
        from tunedeck.core.diagnose.sources import run_sources

        sources = run_sources(self.agent.run_dir)
        # error.json files are read only where torchrun's report names them: a new one must
        # not restart every scanner from byte 0
        key = tuple(str(s.path) for s in sources if s.kind != "error_json")
        if key != self.paths:  # a rank or attempt started writing a new file
            self.diag, self.paths = Diagnosis(sources), key
        for finding in self.diag.poll(final=final):
            if finding.t is None:
                # the poll that first saw it; a fresh time on every poll would store the same
                # finding again every INTERVAL_S (run.db dedups on identical content only)
                finding.t = self.first_seen.setdefault(
                    (finding.category, finding.rank, finding.node, finding.source), time.time())
            self.agent.store.save_finding(finding)


def make_monitors(agent) -> list[Any]:
    monitors: list[Any] = []
    telemetry = None
    try:
        tm = TelemetryMonitor(agent)
        monitors.append(tm)
        telemetry = tm.sampler
    except Exception:
        log.exception("telemetry could not start; the run goes on without it")
    try:
        monitors.append(DetectorMonitor(agent, telemetry))
    except Exception:
        log.exception("live detectors could not start")
    monitors.append(DiagnosisMonitor(agent))
    try:
        mod = importlib.import_module(f"tunedeck.core.backends.{agent.spec.backend}")
    except ImportError:
        mod = None
    hook = getattr(mod, "monitors", None)
    if callable(hook):
        try:
            monitors.extend(hook(agent) or [])
        except Exception:
            log.exception("backend %s monitors could not start", agent.spec.backend)
    return monitors
