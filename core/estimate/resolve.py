"""Turn a spec's "auto" values into concrete ones on this machine, once, at launch.

The frozen spec.toml in the run directory holds the resolved values, so a run read back days
later says exactly what it ran with (device, process count, port).
"""

from __future__ import annotations

import copy
import socket

from tunedeck.core.spec import RunSpec
from tunedeck.core.telemetry.gpus import visible_gpu_count


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pin_port(spec: RunSpec, port: int | None = None) -> RunSpec:
    """The spec with the rendezvous port its launch will use. A single-node spec that leaves
    the port to the launch (0) gets `port`, else a free one now, so what a preview and the
    checks show is what runs (multi-node specs need a port every node knows: left as it is,
    and so is a spec that names its port)."""
    c = spec.cluster
    if c.master_port or c.nnodes != 1:
        return spec
    spec = copy.deepcopy(spec)
    spec.cluster.master_port = port or free_port()
    return spec


def resolve(spec: RunSpec, gpu_count: int | None = None) -> RunSpec:
    spec = copy.deepcopy(spec)
    c = spec.cluster
    # NVML starts (seconds on some nodes) only when the device or the process count is open
    needed = c.device == "auto" or (c.device == "cuda" and c.nproc_per_node == 0)
    gpus = gpu_count if gpu_count is not None else visible_gpu_count(c.gpus) if needed else 0
    if c.device == "auto":
        c.device = "cuda" if gpus > 0 else "cpu"
    if c.nproc_per_node == 0:
        c.nproc_per_node = gpus if c.device == "cuda" else c.cpu_procs
    if c.dist_backend == "auto":
        c.dist_backend = "nccl" if c.device == "cuda" else "gloo"
    if c.master_port == 0:
        # single node: any free loopback port; multi-node users must pick one all nodes know
        c.master_port = free_port() if c.nnodes == 1 else 29500
    if spec.model.dtype == "auto" and c.device == "cpu":
        spec.model.dtype = "float32"
    return spec
