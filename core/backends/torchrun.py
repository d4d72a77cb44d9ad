"""The torchrun part of every plan: rendezvous, per-rank log files, restarts, environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tunedeck.core.spec import RunSpec


def torchrun_argv(spec: RunSpec, run_dir: Path, run_id: str, node_rank: int) -> list[str]:
    c = spec.cluster
    argv = [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(c.nnodes),
            "--nproc_per_node", str(c.nproc_per_node),
            # restarts are the agent's job (pause between attempts, resume, history)
            "--max_restarts", "0",
            # per-rank stdout/stderr files under logs/node<k>/<id>_*/attempt_<n>/<local_rank>/
            "--log_dir", str(run_dir / "logs" / f"node{node_rank}"),
            "--redirects", "3",
            "--rdzv_id", run_id]
    if c.nnodes == 1:
        argv += ["--master_addr", c.master_addr, "--master_port", str(c.master_port)]
    else:
        # c10d rendezvous: a missing node fails after join_timeout instead of hanging
        argv += ["--rdzv_backend", "c10d",
                 "--rdzv_endpoint", f"{c.master_addr}:{c.master_port}",
                 "--rdzv_conf", f"join_timeout={c.join_timeout_s}",
                 "--node_rank", str(node_rank)]
    return argv


def base_env(spec: RunSpec, run_dir: Path, run_id: str) -> dict[str, str]:
    env: dict[str, str] = {
        "TUNEDECK_RUN_ID": run_id,      # marks every process of the run (stop sweeps by it)
        "TUNEDECK_RUN_DIR": str(run_dir),
        "PYTHONUNBUFFERED": "1",
    }
    if spec.backend != "builtin" and spec.run.dataloader_probe:
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
    env.update(spec.env)
    return env
