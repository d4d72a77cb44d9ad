"""The estimate of the run a spec starts: the one path `tunedeck estimate`, the compose form
and the preflight memory check all take, so the three show one number for one spec.

Each backend says how it runs a spec (`Backend.as_run`: an ms-swift spec's unset keys take
ms-swift's defaults, core/backends/swift/run_estimate.py); a name that is no backend's is
sized as written.
"""

from __future__ import annotations

from typing import Any

from tunedeck.core.backends import BACKENDS
from tunedeck.core.backends.base import Backend
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.estimate import SpecEstimate, estimate_spec
from tunedeck.core.estimate.resolve import resolve
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import RunSpec


def _no_plan(spec: RunSpec, run: RunDir) -> LaunchPlan:
    raise ValueError(f"backend {spec.backend!r} is not available")


_AS_WRITTEN = Backend("", _no_plan)


def _backend(spec: RunSpec) -> Backend:
    return BACKENDS.get(spec.backend, _AS_WRITTEN)


def as_run(spec: RunSpec) -> tuple[RunSpec, list[str]]:
    """`spec` as its backend will run it, for the numbers only (never for a plan), and what
    the figures had to assume."""
    return _backend(spec).as_run(spec)


def run_settings(spec: RunSpec) -> list[dict[str, Any]]:
    """The trainer's settings of `spec` (resolved) and where each value comes from: what the
    dry run and the compose form's pane show ([] for a backend that has none to show)."""
    return _backend(spec).run_settings(spec)


def run_defaults(spec: RunSpec) -> dict[str, tuple[Any, str]]:
    """For each setting `spec` leaves to its backend: (the value it runs with, None where it
    decides at run time; where that comes from). The compose form's empty boxes show it."""
    return _backend(spec).run_defaults(spec)


def length_is_bound(spec: RunSpec) -> bool:
    """Whether the figures are sized at the backend's length limit rather than a length the
    user chose (the data decides how long batches really get)."""
    return _backend(spec).length_is_bound(spec)


def length_unless_steps(spec: RunSpec) -> str | None:
    """How long the run trains when the spec does not say it in steps; None when the steps
    are the spec's."""
    return _backend(spec).length_unless_steps(spec)


def estimate_run(
    spec: RunSpec,
    *,
    gpus: int | None = None,
    gpu_name: str = "",
    gpu_mem_gib: float | None = None,
    mfu: float | None = None,
) -> SpecEstimate:
    """`estimate_spec` of the run `spec` starts (arguments as there); `.spec` is the spec the
    numbers are of, the backend's defaults in place."""
    if _backend(spec).resolve_for_estimate:
        spec = resolve(spec, gpu_count=gpus)
    view, notes = as_run(spec)
    est = estimate_spec(view, gpus=gpus, gpu_name=gpu_name, gpu_mem_gib=gpu_mem_gib, mfu=mfu)
    est.memory.notes.extend(notes)
    return est
