"""The torchrun part of every plan: rendezvous, per-rank log files, restarts, environment."""

from __future__ import annotations

import os
import sys

from tunedeck.core.backend_traits import traits_of
from tunedeck.core.backends.plan import LaunchPlan, NodeCommand
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import RunSpec


def launcher_env(c) -> dict[str, str]:
    """The variables a backend's own launcher (`swift`, `llamafactory-cli`) reads for the
    nodes and GPUs of its torchrun: what a user exports before the command by hand."""
    env: dict[str, str] = {}
    if c.nnodes > 1:
        env.update(
            NNODES=str(c.nnodes),
            NODE_RANK=str(c.node_rank),
            MASTER_ADDR=c.master_addr,
            MASTER_PORT=str(c.master_port),
        )
    if c.gpus:
        env["CUDA_VISIBLE_DEVICES"] = c.gpus
    return env


def torchrun_argv(spec: RunSpec, run: RunDir, node_rank: int) -> list[str]:
    c = spec.cluster
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(c.nnodes),
        "--nproc_per_node",
        str(c.nproc_per_node),
        # restarts are the agent's job (pause between attempts, resume, history)
        "--max_restarts",
        "0",
        # per-rank stdout/stderr files (the layout: tunedeck.core.rundir)
        "--log_dir",
        str(run.node_log_dir(node_rank)),
        "--redirects",
        "3",
        "--rdzv_id",
        run.run_id,
    ]
    if c.nnodes == 1:
        argv += ["--master_addr", c.master_addr, "--master_port", str(c.master_port)]
    else:
        # c10d rendezvous: a missing node fails after join_timeout instead of hanging
        argv += [
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"{c.master_addr}:{c.master_port}",
            "--rdzv_conf",
            f"join_timeout={c.join_timeout_s}",
            "--node_rank",
            str(node_rank),
        ]
    return argv


def run_env(run: RunDir) -> dict[str, str]:
    """The run's own variables: applied last, so no spec can set them (core/spec.py refuses
    env.TUNEDECK_* keys too; the agent adds TUNEDECK_ATTEMPT and TUNEDECK_LAUNCH_ID the same
    way at start)."""
    return {
        "TUNEDECK_RUN_ID": run.run_id,  # marks every process of the run (stop sweeps by it)
        "TUNEDECK_RUN_DIR": str(run.path),
    }


def base_env(spec: RunSpec, run: RunDir) -> dict[str, str]:
    env: dict[str, str] = {**run_env(run), "PYTHONUNBUFFERED": "1"}
    if not traits_of(spec.backend).own_trainer and spec.run.dataloader_probe:
        # the probe's sitecustomize must come first on the path to be imported at start-up
        from tunedeck.core.probe import SITE_DIR

        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *inherited])
    if spec.cluster.device == "cpu":
        # torchrun sets this only for nproc>1; 2 threads per rank on 2 cores is 7x slower
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif spec.cluster.gpus:
        env["CUDA_VISIBLE_DEVICES"] = spec.cluster.gpus
    if spec.run.flight_recorder:
        from tunedeck.core.probe.flight import flight_env

        env.update(flight_env(run.path))
    env.update(spec.env)
    env.update(run_env(run))
    return env


def torchrun_plan(
    spec: RunSpec, run: RunDir, target: list[str], defaults: dict[str, str] | None = None
) -> LaunchPlan:
    """One torchrun per node running `target` (what follows torchrun's own flags); `defaults`
    are environment values the spec's own env may override."""
    c = spec.cluster
    plan = LaunchPlan(
        run_id=run.run_id, backend=spec.backend, nproc_per_node=c.nproc_per_node, nnodes=c.nnodes
    )
    for node in range(c.nnodes):
        env = base_env(spec, run)
        for k, v in (defaults or {}).items():
            env.setdefault(k, v)
        env.update(run_env(run))
        host = c.master_addr if node == 0 else f"node{node}"
        plan.nodes.append(
            NodeCommand(node, host, torchrun_argv(spec, run, node) + target, env, str(run.path))
        )
    return plan
