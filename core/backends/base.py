"""What every backend is: a pure plan builder plus the agent's monitors for its runs.

A backend turns a resolved RunSpec into a LaunchPlan (argv/env per node) without side
effects: no model is built, no file written (reading files, such as the demo data to name
its model folder or ms-swift's flag table, is allowed), so a dry run, an export and the
preflight see exactly the plan a launch would start. Anything a run needs built first is
done by the agent before torchrun starts (`tunedeck.core.runs.agent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.monitoring import Monitor
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import step_of
from tunedeck.core.spec import RunSpec


def _no_monitors(run: RunDir, spec: RunSpec) -> list[Monitor]:
    return []


def _no_checks(spec: RunSpec, local: bool) -> None:
    return None


@dataclass(frozen=True)
class Restart:
    """Where a restarted attempt continues. `checkpoint` None: from step 0, or the backend
    cannot tell; `note` says which for the agent's restart message ("" when it cannot tell);
    how the trainer is told: `flag` (ms-swift's) or the variable `var` (a user's script), or
    neither when it looks for itself (the built-in trainer)."""

    checkpoint: Path | None
    note: str
    flag: str = ""
    var: str = ""

    @classmethod
    def at(cls, path: Path | None, flag: str = "", var: str = "") -> Restart:
        if path is None:
            return cls(None, "from step 0: no checkpoint written yet", flag, var)
        return cls(
            path, f"from {path.name}" + (f" ({var} for the script)" if var else ""), flag, var
        )

    @property
    def step(self) -> int:
        """The step the attempt goes on after (0: from the start, or not known)."""
        return step_of(self.checkpoint) if self.checkpoint else 0

    def environ(self) -> dict[str, str]:
        return {self.var: str(self.checkpoint)} if self.var and self.checkpoint else {}

    def argv(self, argv: list[str]) -> list[str]:
        """The attempt's command: the flag with this checkpoint replaces any the plan had."""
        if not self.flag or self.checkpoint is None:
            return argv
        out: list[str] = []
        skip = False
        for w in argv:
            if skip:
                skip = False
            elif w == self.flag:
                skip = True
            elif not w.startswith(self.flag + "="):
                out.append(w)
        return out + [self.flag, str(self.checkpoint)]


def _restart_unknown(spec: RunSpec, run: RunDir, attempt: int) -> Restart:
    return Restart(None, "")


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
    # what an attempt after the first continues from, once the one before it has ended
    restart: Callable[[RunSpec, RunDir, int], Restart] = _restart_unknown
