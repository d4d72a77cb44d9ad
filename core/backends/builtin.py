"""The built-in trainer backend: torchrun runs `python -m tunedeck.core.train --run-dir RUN`.
The trainer writes the event stream itself, so the backend adds no monitor."""

from __future__ import annotations

from tunedeck.core.backends.base import Backend
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.backends.torchrun import torchrun_plan
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import RunSpec


def build_plan(spec: RunSpec, run: RunDir) -> LaunchPlan:
    return torchrun_plan(spec, run, ["-m", "tunedeck.core.train", "--run-dir", str(run.path)])


BACKEND = Backend("builtin", build_plan)
