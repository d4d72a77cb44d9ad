"""Backends turn a resolved RunSpec into a LaunchPlan (what torchrun runs, per node).

`BACKENDS` lists them (each folder's `BACKEND`, a `base.Backend`; docs/adding-a-backend.md); `plan_run` is the one
way to get a plan from a spec: resolve it for this machine, check it, build the plan. The
dry run and the presets screen (preview), `tunedeck export`, the preflight and the launch
all call it, so they cannot disagree about what a spec runs.
"""

from __future__ import annotations


from tunedeck.core.backend_traits import NAMES as BACKEND_NAMES
from tunedeck.core.backends import builtin, llamafactory, script, swift
from tunedeck.core.backends.base import Backend
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.estimate.resolve import resolve
from tunedeck.core.nodes.roster import place, roster_problems
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import RunSpec

BACKENDS: dict[str, Backend] = {
    b.name: b for b in (builtin.BACKEND, swift.BACKEND, script.BACKEND, llamafactory.BACKEND)
}
# the spec's `backend` choices and the facts below this layer are keyed by these names
if tuple(BACKENDS) != BACKEND_NAMES:
    raise RuntimeError(
        f"core/backend_traits.py names {BACKEND_NAMES}, the registry {tuple(BACKENDS)}: "
        "a backend is registered in both (docs/adding-a-backend.md)"
    )


def backend_of(spec: RunSpec) -> Backend:
    try:
        return BACKENDS[spec.backend]
    except KeyError:
        raise ValueError(
            f"backend {spec.backend!r} is not available yet (one of {', '.join(BACKENDS)})"
        ) from None


def plan_run(
    spec: RunSpec, run: RunDir, local: bool = True, gpu_count: int | None = None
) -> tuple[RunSpec, LaunchPlan]:
    """(the spec resolved for this machine, with its output_dir set, and its plan, each node
    placed: its host, GPUs, interface and c10d flags). Raises
    ValueError (SwiftPlanError...) naming the key when the spec cannot run. `local`: the plan
    runs here, so what it names must exist here (off for exports to another machine)."""
    spec = resolve(spec, gpu_count=gpu_count)
    if not spec.run.output_dir:
        spec.run.output_dir = str(run.output_dir(spec))
    backend = backend_of(spec)
    backend.check(spec, local)
    plan = backend.build_plan(spec, run)
    if spec.cluster.nnodes > 1:
        # launch, dry-run and every export render this one plan: each node's exact argv/env
        problems = roster_problems(spec)
        if problems:
            raise ValueError("; ".join(problems))
        place(spec, plan)
    return spec, plan
