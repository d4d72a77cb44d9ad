"""What a spec will do, before anything starts: the exact launch script and the batch math.

Used by `tunedeck launch --dry-run` and the TUI's presets screen; `ps_warning` is the line the
compose screen's side pane shows under a plan whose argv holds a secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunedeck.core.backends import plan_run
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.estimate.batch import describe, effective_batch
from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import RunSpec, mask_argv


@dataclass
class Preview:
    spec: RunSpec          # resolved for this machine
    script: str            # launch.sh for node 0 (secrets masked)
    world_size: int
    effective_batch: int
    summary: str           # one paragraph for people
    warning: str = ""      # ps_warning: secrets the command line itself will carry


def ps_warning(plan: LaunchPlan) -> str:
    """"" or one line naming the credential flags left in the command line: every local user
    sees a process's argv (`ps`, /proc/<pid>/cmdline) for as long as it runs. Secrets in the
    environment (env.NAME, ms-swift's --hub_token/--swanlab_token, moved there by the swift
    backend) are private to the run's owner."""
    flags: list[str] = []
    for node in plan.nodes:
        prev = ""
        for word, shown in zip(node.argv, mask_argv(node.argv)):
            if word != shown:
                flag = shown.partition("=")[0] if shown != "****" else prev
                if flag not in flags:
                    flags.append(flag)
            prev = word
    if not flags:
        return ""
    return (f"warning: `ps` shows every local user the command line, and with it the value of "
            f"{', '.join(flags)}: pass secrets as environment variables (env.NAME; masked in "
            f"the run's files and kept in its private secrets file) where the program reads one")


def preview(spec: RunSpec, root: Path | None = None) -> Preview:
    spec, plan = plan_run(spec, RunDir((root or runs_root()) / "<run-id>"))
    t, c = spec.train, spec.cluster
    eff = effective_batch(spec, plan.world_size)  # data-parallel only (Megatron divides)
    where = (f"{c.nnodes} node(s) x {c.nproc_per_node} {c.device.upper()} rank(s), "
             f"{c.dist_backend}")
    summary = (f"{spec.name}: {spec.backend} backend, {spec.method.type} on {spec.model.path}; "
               f"{where}; {spec.parallel.strategy}. {describe(spec, plan.world_size)}"
               f"; {t.max_steps} steps.")
    return Preview(spec, plan.to_shell(c.node_rank), plan.world_size, eff, summary,
                   ps_warning(plan))
