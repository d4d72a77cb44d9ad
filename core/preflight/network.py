"""Rendezvous port (free on this node, and not the port of another live run of this home),
master address and NCCL environment checks."""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

from tunedeck.core.preflight.base import CheckResult, Context, result
from tunedeck.core.estimate.resolve import free_port
from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import TERMINAL, RunDir

CONNECT_TIMEOUT_S = 2.0
SYS_NET = Path("/sys/class/net")
SYS_IB = Path("/sys/class/infiniband")


def _is_master(ctx: Context) -> bool:
    return ctx.spec.cluster.node_rank == 0


ENDED = TERMINAL  # state.json statuses of a run that ended
PENDING_GRACE_S = 120.0  # a run with no agent yet holds its port this long after its creation


def _agent_alive(state: dict) -> bool:
    pid, created = state.get("agent_pid"), state.get("agent_create_time")
    if not isinstance(pid, int) or pid <= 0:
        # launched this instant (the agent writes its pid within seconds), or never started
        t = state.get("created")
        return isinstance(t, (int, float)) and time.time() - t < PENDING_GRACE_S
    try:
        import psutil

        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return not isinstance(created, (int, float)) or abs(p.create_time() - created) <= 1.0
    except Exception:  # noqa: BLE001 - gone, or not ours to look at
        return False


def runs_on_port(port: int, root: Path | None = None) -> list[str]:
    """Ids of the live runs of this home on this host whose resolved rendezvous port is `port`
    (state.json `master_port`, written at launch before torchrun binds it)."""
    root = root or runs_root()
    try:
        dirs = [d for d in root.iterdir() if d.is_dir()]
    except OSError:
        return []
    here = os.uname().nodename
    out = []
    for d in sorted(dirs):
        state = RunDir(d).read_state()
        if not state or state.get("master_port") != port or state.get("status") in ENDED:
            continue
        if state.get("host") not in (None, here) or not _agent_alive(state):
            continue
        out.append(str(state.get("run_id") or d.name))
    return out


def _spare_port(host: str, taken: int) -> int:
    """A port free now and not the resolved port of a live run of this home."""
    for _ in range(20):
        port = free_port(host)
        if port != taken and not runs_on_port(port):
            return port
    return port


def check_port(ctx: Context) -> CheckResult:
    id, title = "net.port", "Rendezvous port free on this node"
    c = ctx.spec.cluster
    if c.master_port == 0:
        return result(id, title, "pass", "master_port = 0: a free port is picked at launch")
    if not _is_master(ctx):
        return result(id, title, "skip", f"node_rank {c.node_rank}: node 0 listens on it")
    host = c.master_addr if c.nnodes > 1 else "127.0.0.1"
    spare_host = "127.0.0.1" if c.nnodes == 1 else "0.0.0.0"
    holders = runs_on_port(c.master_port)
    if holders:
        spare = _spare_port(spare_host, c.master_port)
        who = ", ".join(holders[:3]) + (f" and {len(holders) - 3} more" if len(holders) > 3 else "")
        return result(
            id,
            title,
            "fail",
            f"port {c.master_port} is the rendezvous port of live "
            f"run {who} of this home: whichever starts second fails with "
            "EADDRINUSE",
            f"set cluster.master_port = {spare} (free now) or 0 to pick one at launch",
            {"cluster.master_port": spare},
        )
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, c.master_port))
    except OSError as e:
        spare = _spare_port(spare_host, c.master_port)
        if e.errno == errno.EADDRNOTAVAIL:
            return result(
                id,
                title,
                "fail",
                f"master_addr {c.master_addr} is not an address "
                "of this node, but node_rank 0 must host the rendezvous",
                "run node 0 on the master host or fix cluster.master_addr",
            )
        return result(
            id,
            title,
            "fail",
            f"{host}:{c.master_port} is taken ({e.strerror}); torchrun would fail with EADDRINUSE",
            f"set cluster.master_port = {spare} (free now) or 0 to pick one at launch",
            {"cluster.master_port": spare},
        )
    finally:
        s.close()
    return result(id, title, "pass", f"{host}:{c.master_port} is free")


def check_master(ctx: Context) -> CheckResult:
    id, title = "net.master", "Master address resolvable and reachable"
    c = ctx.spec.cluster
    if c.nnodes <= 1:
        return result(id, title, "skip", "single node: rendezvous on this node")
    try:
        infos = socket.getaddrinfo(c.master_addr, c.master_port or 29500, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return result(
            id,
            title,
            "fail",
            f"cannot resolve {c.master_addr!r}: {e.strerror}",
            "use the master's IP address or fix DNS / /etc/hosts",
        )
    addr = infos[0][4]
    if _is_master(ctx):
        return result(
            id,
            title,
            "pass",
            f"{c.master_addr} → {addr[0]} (this node hosts it; the other nodes must reach it)",
        )
    s = socket.socket(infos[0][0], socket.SOCK_STREAM)
    s.settimeout(CONNECT_TIMEOUT_S)
    try:
        s.connect(addr)
        return result(id, title, "pass", f"{addr[0]}:{addr[1]} accepts connections")
    except ConnectionRefusedError:
        # the host answered (RST): reachable, nothing listens until node 0 launches
        return result(
            id,
            title,
            "pass",
            f"{addr[0]} is reachable (port {addr[1]} not "
            "listening yet, as expected before node 0 starts)",
        )
    except (socket.timeout, TimeoutError):
        return result(
            id,
            title,
            "fail",
            f"no answer from {addr[0]}:{addr[1]} within {CONNECT_TIMEOUT_S:.0f}s",
            "open the port in the firewall between "
            "nodes, or check the address is on the nodes' shared network",
        )
    except OSError as e:
        return result(
            id,
            title,
            "fail",
            f"cannot reach {addr[0]}:{addr[1]}: {e.strerror}",
            "check routing between the nodes",
        )
    finally:
        s.close()


def _nccl_env(ctx: Context) -> dict[str, str]:
    return {k: v for k, v in {**os.environ, **ctx.spec.env}.items() if k.startswith("NCCL_")}


def check_nccl_env(ctx: Context, sys_net: Path = SYS_NET, sys_ib: Path = SYS_IB) -> CheckResult:
    id, title = "net.nccl_env", "NCCL variables match this node"
    env = _nccl_env(ctx)
    if ctx.resolved.cluster.device != "cuda" and not env:
        return result(id, title, "skip", "CPU run over gloo: NCCL not used")
    problems, warns = [], []
    ifname = env.get("NCCL_SOCKET_IFNAME", "")
    if ifname:
        have = sorted(p.name for p in sys_net.iterdir()) if sys_net.is_dir() else []
        for item in ifname.split(","):
            item = item.strip()
            if not item or item.startswith("^"):
                continue
            exact = item.startswith("=")
            name = item.lstrip("=")
            if not any(h == name or (not exact and h.startswith(name)) for h in have):
                problems.append(
                    f"NCCL_SOCKET_IFNAME={ifname}: no interface {name!r} here "
                    f"(have {', '.join(have) or 'none'})"
                )
    ib_devs = sorted(p.name for p in sys_ib.iterdir()) if sys_ib.is_dir() else []
    ib_off = env.get("NCCL_IB_DISABLE", "0") not in ("0", "")
    multi = ctx.spec.cluster.nnodes > 1
    if ib_devs and ib_off and multi:
        warns.append(
            f"NCCL_IB_DISABLE is set but InfiniBand devices exist "
            f"({', '.join(ib_devs)}): multi-node traffic falls back to TCP sockets"
        )
    if not ib_devs and not ib_off and multi:
        warns.append(
            "no InfiniBand device: NCCL will use TCP sockets between nodes (set "
            "NCCL_IB_DISABLE=1 to skip probing, and NCCL_SOCKET_IFNAME)"
        )
    if multi and not ifname:
        warns.append("NCCL_SOCKET_IFNAME unset: NCCL guesses the interface between nodes")
    shown = ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "no NCCL_* variables"
    if problems:
        return result(
            id,
            title,
            "fail",
            "; ".join(problems),
            "set env.NCCL_SOCKET_IFNAME to an interface listed above",
        )
    if warns:
        return result(
            id,
            title,
            "warn",
            f"{shown}; " + "; ".join(warns),
            "set env.NCCL_SOCKET_IFNAME to the inter-node interface; keep IB enabled "
            "where it exists",
        )
    return result(id, title, "pass", shown + (f"; IB: {', '.join(ib_devs)}" if ib_devs else ""))


def check_nodes(ctx: Context) -> CheckResult:
    """Every other node of an ssh-launched run, asked over ssh in parallel: reachable without a
    prompt, the same tunedeck and torch as here, the spec's paths present, and node 0's
    rendezvous address reachable from it (this node listens on it while it asks), its GPUs
    free."""
    id, title = "net.nodes", "Every node reachable over ssh, same versions, rendezvous reachable"
    spec = ctx.resolved
    c = spec.cluster
    if c.nnodes <= 1 or c.launcher != "ssh":
        return result(
            id,
            title,
            "skip",
            "one node, or the other nodes are not started over ssh (cluster.launcher)",
        )
    from tunedeck.core.nodes.probe import probe
    from tunedeck.core.nodes.roster import roster_problems

    problems = roster_problems(spec)
    if problems:
        return result(
            id,
            title,
            "fail",
            "; ".join(problems),
            "give cluster.hosts one ssh destination per node, node 0 first",
        )
    here = probe("", 0, [])
    answers = _node_answers(ctx)
    if isinstance(answers, str):
        return result(
            id,
            title,
            "fail",
            answers,
            "cluster.master_addr must be an address of this node (node 0)",
        )
    bad, lines = [], []
    for node, ans in answers:
        if isinstance(ans, str):
            bad.append(f"node {node.rank} ({node.host}): {ans}")
            continue
        why = []
        for dist in ("tunedeck", "torch"):
            if ans.get(dist) != here.get(dist):
                why.append(f"{dist} {ans.get(dist)} here {here.get(dist)}")
        if ans.get("reach") != "ok":
            why.append(f"cannot reach {c.master_addr}: {ans.get('reach')}")
        if ans.get("missing"):
            why.append(f"missing {', '.join(ans['missing'])}")
        if ans.get("gpu_procs"):
            why.append(f"{ans['gpu_procs']} processes hold its GPUs now (nvidia-smi)")
        (bad if why else lines).append(
            f"node {node.rank} ({node.host}): "
            + ("; ".join(why) if why else f"ok, torch {ans.get('torch')}, {ans.get('gpus')} GPUs")
        )
    if bad:
        return result(
            id,
            title,
            "fail",
            "; ".join(bad + lines),
            "fix ssh (BatchMode: keys, known_hosts), install the same tunedeck and "
            "torch there (cluster.remote_python), copy the data, open the port",
        )
    return result(id, title, "pass", "; ".join(lines))


def _node_answers(ctx: Context) -> list | str:
    """[(node, its probe answer or why there is none)] for nodes 1.., asked over ssh in
    parallel once per preflight (net.nodes and net.interface read them); this node listens on
    master_addr while they ask, so their reach test meets a socket. A str: cannot listen."""

    def ask():
        from concurrent.futures import ThreadPoolExecutor

        from tunedeck.core.nodes.roster import roster

        spec = ctx.resolved
        c = spec.cluster
        paths = [
            p
            for p in (spec.data.path, spec.model.path)
            if p and os.path.isabs(p) and not p.startswith("builtin:")
        ]
        with socket.socket(socket.AF_INET6 if ":" in c.master_addr else socket.AF_INET) as lsn:
            try:
                lsn.bind((c.master_addr, 0))
                lsn.listen(16)
                port = lsn.getsockname()[1]
            except OSError as e:
                return f"cannot listen on {c.master_addr}: {e.strerror}"
            with ThreadPoolExecutor(max_workers=min(16, c.nnodes)) as pool:
                return list(
                    pool.map(lambda n: _ask_node(n, c.master_addr, port, paths), roster(spec)[1:])
                )

    return ctx.memo("node_answers", ask)


def check_interface(ctx: Context) -> CheckResult:
    """Every node's ranks talk from an address the other nodes can reach: not loopback, which
    is what gloo binds where the hostname resolves to 127.0.0.1 and no interface is named."""
    id, title = "net.interface", "Ranks talk over an interface the other nodes reach"
    spec = ctx.resolved
    c = spec.cluster
    if c.nnodes <= 1:
        return result(id, title, "skip", "single node: ranks talk over loopback")
    from tunedeck.core.nodes.iface import facts, is_loopback, verdict
    from tunedeck.core.nodes.roster import auto_interface, roster_problems

    if is_loopback(c.master_addr) or c.master_addr == "localhost":
        return result(id, title, "pass", f"master_addr {c.master_addr}: every node on this machine")

    backend = "nccl" if c.dist_backend == "nccl" else "gloo"
    key = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    chosen = spec.env.get(key) or c.interface or auto_interface(spec)
    auto = not (spec.env.get(key) or c.interface)
    nodes: list[tuple[str, dict | str]] = [("node 0 (this one)", facts(c.master_addr))]
    if c.launcher == "ssh" and not roster_problems(spec):
        answers = _node_answers(ctx)
        if isinstance(answers, list):
            for node, ans in answers:
                who = f"node {node.rank} ({node.host})"
                if isinstance(ans, str):
                    nodes.append((who, f"not asked: {ans}"))
                elif "net" not in ans:
                    nodes.append((who, "not asked: its tunedeck is older than this one"))
                else:
                    nodes.append((who, ans["net"]))
    bad, ok, routes = [], [], set()
    for who, f in nodes:
        if isinstance(f, str):
            ok.append(f"{who}: {f}")
            continue
        # a node whose interface to the master is named otherwise uses its own (remote.py)
        mine = (f.get("route_iface") or chosen) if auto and chosen else chosen
        state, why = verdict(f, mine, backend)
        (bad if state == "bad" else ok).append(f"{who}: {why}")
        routes.add(f.get("route_iface"))
    how = f"{key}={chosen}, chosen: it routes to {c.master_addr}" if auto and chosen else ""
    if bad:
        one = next(iter(routes)) if len(routes) == 1 and None not in routes else None
        fix = (
            f'set cluster.interface = "{one}" (it routes to {c.master_addr} on every node)'
            if one
            else "set cluster.interface to the interface that routes to "
            f"{c.master_addr} (per node: {key} in its environment)"
        )
        return result(
            id,
            title,
            "fail",
            "; ".join(bad + ok)
            + "; the other nodes cannot reach a rank there, so the first collective hangs",
            fix,
            {"cluster.interface": one} if one else None,
        )
    return result(id, title, "pass", "; ".join(([how] if how else []) + ok))


def _ask_node(node, host: str, port: int, paths: list[str]):
    import json
    import subprocess

    from tunedeck.core.nodes.ssh import ssh_argv

    argv = ssh_argv(
        node.host, [node.python, "-m", "tunedeck.core.nodes.probe", host, str(port), *paths]
    )
    try:
        r = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return node, f"ssh: {e}"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return node, f"ssh exited {r.returncode}: {last}"
    try:
        return node, json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return node, f"unexpected answer: {r.stdout.strip()[:200]!r}"


CHECKS = [check_port, check_master, check_nccl_env, check_nodes, check_interface]
