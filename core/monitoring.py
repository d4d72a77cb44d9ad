"""The monitor interface: what the agent ticks while torchrun runs, and what a monitor sees.

One layer below nodes, backends and runs (pyproject's import-linter layers contract), so
that the backends' monitors (tunedeck.core.backends), the multi-node monitors
(tunedeck.core.nodes) and the agent's own (tunedeck.core.supervisor.monitors) share one typed
context. A monitor never sees the concrete run.db `Store` (of runs, the top layer): only the
`MonitorStore` protocol below, which the Store satisfies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable

from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import RunSpec
from tunedeck.core.telemetry.store import TelemetryStore


class Monitor(Protocol):
    """Something the agent calls every tick (~0.5 s; keep it well under 50 ms) while torchrun
    runs, and once more at the end."""

    def tick(self, now: float, new_events: list[dict[str, Any]]) -> None: ...

    def close(self, new_events: list[dict[str, Any]]) -> None: ...

    # optional, for monitors that number steps themselves: `restarted(step)` before the next
    # attempt starts, which goes on after `step`; for monitors that keep something of the
    # store: `rebind(store)` after the agent opened run.db again


@runtime_checkable
class FindingsSink(Protocol):
    """Where a monitor puts what it noticed (run.db's findings table: the Store)."""

    def save_finding(self, finding: Finding) -> bool:
        """Store `finding` (a refined one, same `key()`, replaces its stored version); True
        when it was new or changed, False when exactly this was stored already."""
        ...


@runtime_checkable
class MonitorStore(FindingsSink, Protocol):
    """All a monitor uses of the agent's (writable) run.db: findings, the probe records the
    ranks wrote since the last call, and the telemetry tables' writer."""

    def ingest_probe(self) -> list[dict[str, Any]]: ...

    @property
    def telemetry(self) -> TelemetryStore: ...


@dataclass
class MonitorContext:
    """The run as the monitors see it (not the agent itself). `store` may be replaced while
    they run (the agent reopens run.db after a full disk): read `ctx.store` at each call, or
    have `rebind(store)`."""

    run: RunDir
    spec: RunSpec
    store: MonitorStore  # the agent's (writable) store
    node_rank: int
    rank_pids: Callable[[], dict[int, int]]  # rank → pid of this node's live ranks
    stopping: Callable[[], bool]  # a stop was asked for (steps pause on purpose)
    # signal the run's own processes among pids (procs.signal_ours: identity-checked), for
    # monitors of the layers below runs (the nodes monitor ends an attempt with it)
    signal_ours: Callable[[dict, list, int], list[int]]

    @property
    def finding_node(self) -> int | None:
        """The node a finding of this agent's is stamped with: none on a one-node run, where
        "node 0" would only add noise to what the monitor and `doctor` show."""
        return self.node_rank if self.spec.cluster.nnodes > 1 else None


__all__ = ["Monitor", "FindingsSink", "MonitorStore", "MonitorContext"]
