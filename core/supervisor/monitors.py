"""The agent's monitors: telemetry sampling, the live detectors, log diagnosis, and whatever
the run's backend adds (tunedeck.core.backends: its `monitors`).

`make_monitors(ctx)` is called once torchrun has started. Every monitor has
tick(now, new_events) (~every 0.5 s, must stay well under 50 ms, and must not grow with the
run's length) and close(new_events). One monitor failing to start never stops the others, nor
the run. Monitors see the run through a `MonitorContext` (tunedeck.core.monitoring, the layer
below nodes and backends, whose monitors take it too), not the agent itself; its `store` may
be replaced while they run (the agent reopens run.db after a full disk: a monitor that keeps
something of the store has `rebind(store)`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tunedeck.core.envnum import env_number
from tunedeck.core.backends import backend_of
from tunedeck.core.detect.stall import StallDetector
from tunedeck.core.detect.starvation import StarvationDetector
from tunedeck.core.detect.straggler import StragglerDetector
from tunedeck.core.supervisor.hang import HangMonitor
from tunedeck.core.monitoring import MonitorContext, MonitorStore

log = logging.getLogger("tunedeck.monitors")

CHECK_EVERY_S = 1.0


def _slow_s() -> float:
    """Seconds between reads of the slow telemetry (power, clocks, PCIe/NVLink, GPU process
    lists, disk): TUNEDECK_TELEMETRY_SLOW_S, default 10."""
    return env_number("TUNEDECK_TELEMETRY_SLOW_S", 10.0, floor=1.0)


class TelemetryMonitor:
    def __init__(self, ctx: MonitorContext):
        from tunedeck.core.telemetry.fake import from_env
        from tunedeck.core.telemetry.nvml import Nvml
        from tunedeck.core.telemetry.sampler import TelemetrySampler

        spec = ctx.spec
        self.sampler = TelemetrySampler(
            ctx.store.telemetry,
            interval_s=spec.run.telemetry_interval_s,
            rank_pids=ctx.rank_pids,
            out_dir=spec.run.output_dir or None,
            nvml=Nvml(lib=from_env()),
            slow_s=_slow_s(),
        )

    def tick(self, now: float, new_events: list[dict]) -> None:
        self.sampler.tick(now, new_events)

    def close(self, new_events: list[dict]) -> None:
        self.sampler.close(new_events)

    def rebind(self, store: MonitorStore) -> None:
        """The agent opened run.db again (after a full disk): write through the new
        connection. The other monitors read `ctx.store` at each call."""
        self.sampler.tstore = store.telemetry


class DetectorMonitor:
    """Feeds rank events and probe records to the detectors; stores what they find."""

    def __init__(self, ctx: MonitorContext, telemetry=None, hang=None):
        self.ctx = ctx
        self.hang = hang  # HangMonitor: started by a stall
        local_world = ctx.spec.cluster.nproc_per_node or None
        self.pids: dict[int, int] = {}
        floor = env_number("TUNEDECK_STALL_FLOOR_S", 60.0)
        self.detectors = [
            StarvationDetector(telemetry=telemetry, local_world=local_world),
            StallDetector(
                floor_s=floor, pids=self.pids, telemetry=telemetry, local_world=local_world
            ),
            StragglerDetector(telemetry=telemetry, local_world=local_world),
        ]
        self.last_check = 0.0

    # Step events per rank and tick the detectors see: their windows hold shares, medians
    # and the last step, which the newest steps give as well; ranks stepping hundreds of
    # times a second would otherwise cost the agent a share of a core in detector updates.
    STEPS_PER_TICK = 64

    def tick(self, now: float, new_events: list[dict]) -> None:
        events = _newest_steps(new_events, self.STEPS_PER_TICK) + self.ctx.store.ingest_probe()
        for d in self.detectors:
            d.update(events)
        if now - self.last_check < CHECK_EVERY_S:
            return
        self.last_check = now
        if self.ctx.stopping():  # a stop pauses steps on purpose: nothing to detect now
            return
        self.pids.clear()
        self.pids.update(self.ctx.rank_pids())
        for d in self.detectors:
            for f in d.check(now):
                f.node = self.ctx.finding_node
                if self.ctx.store.save_finding(f):
                    log.warning("finding %s: %s", f.category, f.summary)
                if f.category == "stall" and self.hang is not None:
                    self.hang.trigger(now)

    def close(self, new_events: list[dict]) -> None:
        events = list(new_events) + self.ctx.store.ingest_probe()
        for d in self.detectors:
            d.update(events)


def _newest_steps(events: list[dict], keep: int) -> list[dict]:
    """The events in order, with at most the `keep` newest step events of each rank (every
    other kind kept)."""
    if len(events) <= keep:
        return list(events)
    seen: dict[object, int] = {}
    out = []
    for e in reversed(events):
        if e.get("kind") == "step":
            r = e.get("rank")
            n = seen.get(r, 0)
            if n >= keep:
                continue
            seen[r] = n + 1
        out.append(e)
    out.reverse()
    return out


def _undecided_port(f, spec) -> bool:
    """A single-node port clash while torchrun still runs: its agent moves the run off it
    (core/supervisor/portmove.py) or fails it once torchrun has exited, so it is stored then,
    as handled or as the error, and no alert goes out for a clash already answered."""
    return f.category == "port_in_use" and f.severity == "error" and spec.cluster.nnodes == 1


class DiagnosisMonitor:
    """Log-based findings (crashes, OOM, NCCL, flags...) while the run goes, stored in run.db
    so every viewer sees them as they appear. Polls every few seconds by byte offset."""

    INTERVAL_S = 5.0

    def __init__(self, ctx: MonitorContext) -> None:
        self.ctx = ctx
        self.diag = None
        self.paths: tuple[str, ...] | None = None  # a run with no log yet is a key too
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

        # metric streams are the LossMonitor's (they hold no failure text of their own)
        sources = [s for s in run_sources(self.ctx.run) if s.kind not in ("events", "jsonl")]
        # error.json files are read only where torchrun's report names them: a new one must
        # not restart every scanner from byte 0
        key = tuple(str(s.path) for s in sources if s.kind != "error_json")
        if key != self.paths:  # a rank or attempt started writing a new file
            self.diag = Diagnosis(sources, metrics=False, moves_of=self.ctx.run.path)
            self.paths = key
        found = self.diag.poll(final=final)
        from tunedeck.core.diagnose.chain import causes_first, exit_code_only
        from tunedeck.core.diagnose.exits import asked_stop

        stop = asked_stop(self.ctx.run.path) if self.ctx.stopping() else None
        if stop is not None:  # its signals are no launcher signal from outside
            found = causes_first(found + [stop])
        lost = self._lost_nodes()
        if lost:  # the other nodes' rank failures follow from it (stored as it was)
            found = [f for f in causes_first(found + lost) if f not in lost]
        if self.ctx.spec.cluster.nnodes > 1:  # ranks on loopback: name the node and interface
            from tunedeck.core.nodes.loopback import name_interface

            found = name_interface(found, [self.ctx.run.path])
        for finding in found:
            # stored only once torchrun has exited: a port clash its agent may still answer,
            # and an exit known from the launcher's report alone (a traceback that ends a
            # rank's log is closed only by the log's last read; stored before, "no traceback
            # is in this log" would outlive the real cause)
            if not final and (_undecided_port(finding, self.ctx.spec) or exit_code_only(finding)):
                continue
            if finding.t is None:
                # the poll that first saw it; a fresh time on every poll would count as a
                # change of the stored finding every INTERVAL_S (a refined finding, one with an
                # ident, keeps its first time though its source line moves on)
                finding.t = self.first_seen.setdefault(
                    (finding.category, finding.rank, finding.node, finding.ident or finding.source),
                    time.time(),
                )
            self.ctx.store.save_finding(finding)

    def _lost_nodes(self) -> list:
        """node_lost findings the node links stored in this run's run.db."""
        if self.ctx.spec.cluster.nnodes < 2:
            return []
        from tunedeck.core.diagnose.finding import Finding

        try:
            rows = self.ctx.store.findings("node_lost")
        except Exception:
            return []
        return [Finding.from_json(d) for d in rows]


class LossMonitor:
    """Loss anomalies (NaN, collapse to zero, frozen grad norm) from the step events of this
    node's first rank as the agent ingests them: constant work per new step."""

    INTERVAL_S = 5.0

    def __init__(self, ctx: MonitorContext) -> None:
        from tunedeck.core.diagnose.loss import LossWatch

        self.ctx = ctx
        self.rank = ctx.node_rank * max(ctx.spec.cluster.nproc_per_node, 1)
        self.watch = LossWatch(str(ctx.run.event_file(self.rank)))
        self.last = 0.0
        self.shown: list[dict] = []

    def tick(self, now: float, new_events: list[dict]) -> None:
        self._feed(new_events)
        if now - self.last >= self.INTERVAL_S:
            self.last = now
            self._save()

    def close(self, new_events: list[dict]) -> None:
        self._feed(new_events)
        self._save()

    def _feed(self, events: list[dict]) -> None:
        from tunedeck.core.diagnose.loss import loss_record

        rank = self.rank
        self.watch.feed(
            [
                r
                for e in events
                if e.get("rank") == rank
                and e.get("kind") == "step"
                and (r := loss_record(e)) is not None
            ]
        )

    def _save(self) -> None:
        found = self.watch.findings()
        shown = [f.to_json() for f in found]
        if shown != self.shown:
            self.shown = shown
            # a finding whose counts grew replaces its stored version (same ident): run.db
            # and the monitor keep one finding per anomaly however long the run
            for f in found:
                f.node = self.ctx.finding_node
                self.ctx.store.save_finding(f)


def make_monitors(ctx: MonitorContext) -> list[Any]:
    monitors: list[Any] = []
    telemetry = None
    try:
        tm = TelemetryMonitor(ctx)
        monitors.append(tm)
        telemetry = tm.sampler
    except Exception:
        log.exception("telemetry could not start; the run goes on without it")
    try:
        hang = HangMonitor(ctx)
        monitors += [DetectorMonitor(ctx, telemetry, hang), hang]
    except Exception:
        log.exception("live detectors could not start")
    monitors += [DiagnosisMonitor(ctx), LossMonitor(ctx)]
    c = ctx.spec.cluster
    if c.launcher == "ssh" and c.nnodes > 1 and ctx.node_rank == 0:
        from tunedeck.core.nodes.link import NodesMonitor  # the other nodes, over ssh

        monitors.append(NodesMonitor(ctx))
    if c.launcher == "slurm" and c.nnodes > 1:
        from tunedeck.core.nodes.slurm import NodesWatch  # the others, on the shared disk

        monitors.append(NodesWatch(ctx))
    try:
        monitors.extend(backend_of(ctx.spec).monitors(ctx.run, ctx.spec))
    except Exception:
        log.exception("backend %s monitors could not start", ctx.spec.backend)
    return monitors
