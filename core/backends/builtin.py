"""The built-in trainer backend: torchrun runs `python -m tunedeck.core.train --run-dir RUN`."""

from __future__ import annotations

from pathlib import Path

from tunedeck.core.backends.torchrun import base_env, torchrun_argv
from tunedeck.core.backends.plan import LaunchPlan, NodeCommand
from tunedeck.core.spec import RunSpec


def build_plan(spec: RunSpec, run_dir: Path, run_id: str) -> LaunchPlan:
    plan = LaunchPlan(run_id=run_id, backend="builtin",
                      nproc_per_node=spec.cluster.nproc_per_node, nnodes=spec.cluster.nnodes)
    for node in range(spec.cluster.nnodes):
        argv = torchrun_argv(spec, run_dir, run_id, node) + [
            "-m", "tunedeck.core.train", "--run-dir", str(run_dir)]
        host = spec.cluster.master_addr if node == 0 else f"node{node}"
        plan.nodes.append(NodeCommand(node, host, argv, base_env(spec, run_dir, run_id),
                                      str(run_dir)))
    return plan
