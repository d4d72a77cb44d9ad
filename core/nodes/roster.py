"""The node roster: which host runs which node, with its GPUs, Python and TUNEDECK_HOME, and
the per-node touches a multi-node plan needs (c10d host, local address, interface).

The spec declares the keys ([cluster] launcher, hosts, node_gpus, interface, remote_home,
remote_python); the lists whose length must agree with `cluster.nnodes` are checked here.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from tunedeck.core.spec import RunSpec


@dataclass
class Node:
    rank: int
    host: str  # the ssh destination ("" for node 0 under slurm/manual)
    addr: str  # the host part of it: what torchrun's --local_addr starts as
    gpus: str  # CUDA_VISIBLE_DEVICES ("" = the spec's)
    home: str  # TUNEDECK_HOME on that node ("" for node 0: this process's own)
    python: str  # the Python that runs tunedeck there


def _per_node(key: str, values: list[str], n: int, one_for_all: bool) -> str | None:
    if not values:
        return None
    if len(values) == n or (one_for_all and len(values) == 1):
        return None
    want = f"1 or {n}" if one_for_all else str(n)
    return (
        f"cluster.{key} has {len(values)} entries; it needs {want} (one per node, "
        f"cluster.nnodes = {n})"
    )


def roster_problems(spec: RunSpec) -> list[str]:
    """One line per roster key that does not fit the node count."""
    c = spec.cluster
    out: list[str] = []
    if c.nnodes == 1:
        return out
    if c.launcher == "ssh":
        if len(c.hosts) != c.nnodes:
            out.append(
                f'cluster.hosts has {len(c.hosts)} entries; launcher "ssh" needs one '
                f"ssh destination per node ({c.nnodes}), node 0 (this machine) first"
            )
        for h in c.hosts:
            if not h.strip() or h.startswith("-") or any(ch.isspace() for ch in h):
                out.append(
                    f"cluster.hosts: {h!r} is not an ssh destination (host, "
                    f"user@host or a ~/.ssh/config name)"
                )
        if c.master_addr in ("127.0.0.1", "localhost", "::1"):
            out.append(
                "cluster.master_addr is a loopback address; the other nodes must reach "
                "it: set node 0's address as the other nodes see it"
            )
    for key, one in (("node_gpus", False), ("remote_home", True), ("remote_python", True)):
        err = _per_node(key, getattr(c, key), c.nnodes, one)
        if err:
            out.append(err)
    return out


def _pick(values: list[str], i: int) -> str:
    if not values:
        return ""
    return values[i] if len(values) > 1 else values[0]


def host_addr(dest: str) -> str:
    """`user@host:port`-free host part of an ssh destination (an ssh_config alias stays as
    it is; the remote side replaces it by its own address towards the rendezvous)."""
    host = dest.rpartition("@")[2]
    if host.startswith("["):  # [v6addr]
        return host[1:].partition("]")[0]
    return host


def head_home() -> str:
    """The head's TUNEDECK_HOME, as an absolute path: every other node's default home, so
    that a run's folders sit at the same path on each node (one place to look, and on a
    shared filesystem one registry that lists the run once)."""
    from tunedeck.core.paths import home

    return os.path.abspath(home())


def roster(spec: RunSpec) -> list[Node]:
    c = spec.cluster
    out = []
    for k in range(c.nnodes):
        host = c.hosts[k] if k < len(c.hosts) else ""
        addr = c.master_addr if k == 0 else host_addr(host)
        out.append(
            Node(
                rank=k,
                host=host,
                addr=addr,
                gpus=c.node_gpus[k] if k < len(c.node_gpus) else "",
                home=(_pick(c.remote_home, k - 1) or head_home()) if k else "",
                python=(_pick(c.remote_python, k - 1) if k else "") or sys.executable,
            )
        )
    return out


def place(spec: RunSpec, plan: Any) -> Any:
    """Per node: its host, its GPUs, the interface, and the c10d flags that make the
    rendezvous work where a hostname resolves to a loopback address (common on cloud images
    and in containers): node 0 hosts the store (is_host), every node says its own address
    (--local_addr; a remote node replaces it by its address towards node 0 at start)."""
    c = spec.cluster
    if c.nnodes == 1:
        return plan
    nodes = roster(spec)
    interface = c.interface or auto_interface(spec)
    for cmd in plan.nodes:
        node = nodes[cmd.node_rank]
        if node.host:
            cmd.host = node.host
        elif c.launcher == "slurm":
            cmd.host = ""  # Slurm picks the hosts; each node's task records its name
        if node.gpus and spec.cluster.device != "cpu":
            cmd.env["CUDA_VISIBLE_DEVICES"] = node.gpus
        if interface:
            cmd.env.setdefault("GLOO_SOCKET_IFNAME", interface)
            cmd.env.setdefault("NCCL_SOCKET_IFNAME", interface)
        if c.launcher in ("ssh", "slurm"):
            _c10d_flags(cmd.argv, is_host=cmd.node_rank == 0, addr=node.addr)
    return plan


IFNAME_KEYS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def auto_interface(spec: RunSpec) -> str:
    """cluster.interface left empty: the interface this machine routes to master_addr through
    ("" where none does), for each variable the spec's env does not set (`place` leaves the
    user's: an NCCL_SOCKET_IFNAME for the GPUs still leaves gloo its own). A node whose
    interface to the master has another name swaps in its own at start
    (remote.own_interface), as it does --local_addr."""
    if all(k in spec.env for k in IFNAME_KEYS):
        return ""
    from tunedeck.core.nodes.iface import route_interface

    return route_interface(spec.cluster.master_addr) or ""


def _c10d_flags(argv: list[str], is_host: bool, addr: str) -> None:
    try:
        i = argv.index("--rdzv_conf")
    except ValueError:
        return
    if "is_host=" not in argv[i + 1]:
        argv[i + 1] += f",is_host={'1' if is_host else '0'}"
    if "--local_addr" not in argv and addr:
        argv[i + 2 : i + 2] = ["--local_addr", addr]


def local_addr_index(argv: list[str]) -> int | None:
    """Index of --local_addr's value in a node's torchrun argv (the remote side rewrites it
    in place: the secrets file keys real values by index, so nothing may shift)."""
    try:
        return argv.index("--local_addr") + 1
    except ValueError:
        return None
