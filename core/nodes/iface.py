"""Which address a node's ranks talk from, and which interface carries traffic to the master.

Without GLOO_SOCKET_IFNAME, gloo binds to the address the node's hostname resolves to; on
many cloud images and containers that is 127.0.0.1, so the other nodes dial loopback and the
first collective hangs until the NCCL/gloo timeout. The interface that routes to
master_addr is the one to name instead: the kernel picks it for a UDP "connect" (no packet is
sent), and the interface holding that source address is its name.

Stdlib plus psutil only: the probe (`python -m tunedeck.core.nodes.probe`) runs this on every
node over ssh. Each node of a multi-node run also keeps what it found when it started
(`record`, state.json `net`), so a run that failed on loopback names the node, its address and
the interface to set afterwards (core/diagnose/loopback.py).
"""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(addr: str | None) -> bool:
    try:
        return ipaddress.ip_address(addr or "").is_loopback
    except ValueError:
        return False


def hostname_addr() -> str | None:
    """What this node's hostname resolves to (gloo's default address), None if it does not."""
    try:
        return socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError):
        return None


def interfaces() -> dict[str, str]:
    """{interface: its first IPv4 address}, of the interfaces that are up."""
    import psutil

    stats = psutil.net_if_stats()
    out = {}
    for name, addrs in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for a in addrs:
            if a.family == socket.AF_INET:
                out[name] = a.address
                break
    return out


def route_interface(master: str) -> str | None:
    """The interface this node reaches `master` through (None: no route, or only loopback)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(master), 9))
            src = s.getsockname()[0]
    except OSError:
        return None
    if is_loopback(src):
        return None
    return next((n for n, a in interfaces().items() if a == src), None)


def facts(master: str) -> dict:
    """What a node says about its network (the probe's `net` answer)."""
    return {
        "hostname_addr": hostname_addr(),
        "route_iface": route_interface(master),
        "ifaces": interfaces(),
    }


def verdict(facts: dict, interface: str, backend: str) -> tuple[str, str]:
    """("ok" | "bad", why) for one node: is the address its ranks will use for `backend`
    ("gloo"/"nccl") reachable from the other nodes? `interface`: GLOO/NCCL_SOCKET_IFNAME as
    the plan sets it ("" = unset)."""
    ifaces, route = facts.get("ifaces") or {}, facts.get("route_iface")
    routes = f"{route} routes to the master here" if route else "no interface routes to the master"
    if interface:
        addr = ifaces.get(interface)
        if addr is None:
            return "bad", f"no interface {interface!r} here ({routes})"
        if is_loopback(addr):
            return "bad", f"{interface} is loopback ({addr}); {routes}"
        return "ok", f"{interface} ({addr})"
    if backend == "nccl":  # NCCL skips lo and picks an interface of its own
        return "ok", f"NCCL picks the interface ({routes})"
    addr = facts.get("hostname_addr")
    if addr is None or is_loopback(addr):
        return (
            "bad",
            f"the hostname resolves to {addr or 'nothing'}, so gloo binds loopback; {routes}",
        )
    return "ok", f"the hostname resolves to {addr}"


IFNAME_OF = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}


def record(master: str, env: dict, dist_backend: str) -> dict:
    """What one node's ranks start with, for state.json `net`: the master they dial, the
    backend ("gloo"/"nccl"), the interface its variable names ("" = unset) and `facts`."""
    backend = "nccl" if dist_backend == "nccl" else "gloo"
    return {
        "master": master,
        "backend": backend,
        "ifname": str(env.get(IFNAME_OF[backend]) or ""),
        **facts(master),
    }


def ranks_addr(rec: dict) -> str | None:
    """The address a node's ranks announce to the others, from its `record`: the named
    interface's, else (gloo) what the hostname resolves to. None: NCCL's own pick, unknown."""
    if rec.get("ifname"):
        return (rec.get("ifaces") or {}).get(rec["ifname"])
    return rec.get("hostname_addr") if rec.get("backend") != "nccl" else None
