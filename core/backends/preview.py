"""What a spec will do, before anything starts: the exact launch script and the batch math.

Used by `tunedeck launch --dry-run` and the TUI's presets screen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunedeck.core.backends import plan_run
from tunedeck.core.estimate.batch import describe, effective_batch
from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import RunSpec


@dataclass
class Preview:
    spec: RunSpec          # resolved for this machine
    script: str            # launch.sh for node 0 (secrets masked)
    world_size: int
    effective_batch: int
    summary: str           # one paragraph for people


def preview(spec: RunSpec, root: Path | None = None) -> Preview:
    spec, plan = plan_run(spec, RunDir((root or runs_root()) / "<run-id>"))
    t, c = spec.train, spec.cluster
    eff = effective_batch(spec, plan.world_size)  # data-parallel only (Megatron divides)
    where = (f"{c.nnodes} node(s) x {c.nproc_per_node} {c.device.upper()} rank(s), "
             f"{c.dist_backend}")
    summary = (f"{spec.name}: {spec.backend} backend, {spec.method.type} on {spec.model.path}; "
               f"{where}; {spec.parallel.strategy}. {describe(spec, plan.world_size)}"
               f"; {t.max_steps} steps.")
    return Preview(spec, plan.to_shell(c.node_rank), plan.world_size, eff, summary)
