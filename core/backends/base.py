"""What every backend is: a pure plan builder plus the agent's monitors for its runs.

A backend turns a resolved RunSpec into a LaunchPlan (argv/env per node) without side
effects: no model is built, no file written (reading files, such as the demo data to name
its model folder or ms-swift's flag table, is allowed), so a dry run, an export and the
preflight see exactly the plan a launch would start. Anything a run needs built first is
done by the agent before torchrun starts (`tunedeck.core.runs.agent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import RunSpec


class Monitor(Protocol):
    """Something the agent calls every tick (~0.5 s; keep it well under 50 ms) while torchrun
    runs, and once more at the end."""

    def tick(self, now: float, new_events: list[dict[str, Any]]) -> None: ...

    def close(self, new_events: list[dict[str, Any]]) -> None: ...


def _no_monitors(run: RunDir, spec: RunSpec) -> list[Monitor]:
    return []


def _no_checks(spec: RunSpec, local: bool) -> None:
    return None


@dataclass(frozen=True)
class Backend:
    name: str
    # spec (resolved) + run directory → plan; pure
    build_plan: Callable[[RunSpec, RunDir], LaunchPlan]
    # raises ValueError for a spec this backend cannot run; `local`: also what must hold on
    # this machine (a script file that exists here), off for exports to other machines
    check: Callable[[RunSpec, bool], None] = _no_checks
    # the monitors a run of this backend adds on this node (they turn its logs into events)
    monitors: Callable[[RunDir, RunSpec], list[Monitor]] = _no_monitors
