"""A multi-node run whose ranks talked over loopback: which node, which address, and which
interface to set.

gloo binds the address a node's hostname resolves to unless GLOO_SOCKET_IFNAME names an
interface; on many images and containers that is 127.0.0.1, so the ranks of the other nodes
dial their own machine and the first collective fails (refused) or hangs (a timeout that
reads like a rendezvous or NCCL problem). Each node recorded what its ranks started with
(state.json `net`, core/nodes/iface.py `record`), the interface that routes to the master
included; a failed run with a node whose ranks' address is loopback gets one finding that
names it, and it is the root cause of what the logs say (the `loopback_address` line rule's
connects to 127.x, core/diagnose/rules.py, become its evidence). Here, above the diagnosis
(it reads the nodes' records): `tunedeck diagnose` (core/api.py) and the agent's
DiagnosisMonitor apply it to what the log rules found.
"""

from __future__ import annotations

from pathlib import Path

from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.diagnose.rules import LOOPBACK
from tunedeck.core.nodes.folders import node_host, node_run_id
from tunedeck.core.nodes.iface import IFNAME_OF, is_loopback, ranks_addr
from tunedeck.core.rundir import read_json

MAX_EVIDENCE = 12


def node_states(run_dir: Path) -> dict[int, tuple[Path, dict]]:
    """Each node's state.json as the head's folder holds it: its own, a node's as its ssh
    link streamed it (nodes/node<k>/), or a Slurm node's in its folder beside the run's."""
    out: dict[int, tuple[Path, dict]] = {}
    k = 0
    while True:
        places = (
            [run_dir / "state.json"]
            if k == 0
            else [
                run_dir / "nodes" / f"node{k}" / "state.json",
                run_dir.parent / node_run_id(run_dir.name, k) / "state.json",
            ]
        )
        found = next(((p, st) for p in places if isinstance(st := read_json(p, None), dict)), None)
        if found is None:
            return out
        out[k] = found
        k += 1


def _on_loopback(states: dict[int, tuple[Path, dict]]) -> list[tuple[int, Path, dict, str]]:
    """(node, its state.json, its `net`, the loopback address its ranks announced)."""
    out = []
    for k, (path, st) in sorted(states.items()):
        net = st.get("net")
        if isinstance(net, dict) and is_loopback(addr := ranks_addr(net)):
            out.append((k, path, net, str(addr)))
    return out


def name_interface(found: list[Finding], run_dirs: list[Path]) -> list[Finding]:
    """`found` with one `loopback_address` finding per run whose ranks used loopback (taking
    the line rule's evidence, and the root cause), when the run failed or the logs show it."""
    for run_dir in run_dirs:
        states = node_states(Path(run_dir))
        if len(states) < 2:
            continue
        bad = _on_loopback(states)
        dialed = [f for f in found if f.category == LOOPBACK]
        failed = states[0][1].get("status") == "failed" or any(f.severity == "error" for f in found)
        if not bad or not (dialed or failed):
            continue
        for f in found:
            f.root_cause = False  # consequences: refused connects, timeouts, a crashed rank
        finding = _finding(bad, states, dialed)
        found = [finding] + [f for f in found if f.category != LOOPBACK]
    return found


def _finding(bad: list, states: dict, dialed: list[Finding]) -> Finding:
    k, path, net, addr = bad[0]
    key = IFNAME_OF.get(str(net.get("backend")), "GLOO_SOCKET_IFNAME")
    master = net.get("master") or "the master"
    who = ", ".join(f"node {n} ({node_host(states[n][1]) or '?'})" for n, *_ in bad)
    routes = {str(r.get("route_iface") or "") for _, _, r, _ in bad}
    iface = routes.pop() if len(routes) == 1 else ""
    why = []
    for n, _, r, a in bad:
        if r.get("ifname"):
            why.append(f"node {n}: {key}={r['ifname']} names a loopback interface ({a})")
        else:
            why.append(
                f"node {n}: its hostname resolves to {a} and no {key} was set, so "
                f"{r.get('backend') or 'gloo'} bound it"
            )
    pinned = sorted({str(r["ifname"]) for _, _, r, _ in bad if r.get("ifname")})
    if iface:
        fix = f'Set cluster.interface = "{iface}": it routes to {master} on ' + " and ".join(
            f"node {n}" for n, *_ in bad
        )
        fix += "".join(
            f" ({iface} is {a} there)"
            for a in {(r.get("ifaces") or {}).get(iface) for _, _, r, _ in bad[:1]}
            if a
        )
    else:
        fix = (
            f"Set cluster.interface to the interface that routes to {master} on each node "
            f"(`ip route get {master}` names it; where the names differ, {key} in each "
            "node's environment)"
        )
    if pinned:
        fix += f"; drop env.{key} = {pinned[0]!r} from the spec (it wins over cluster.interface)"
    fix += ". `tunedeck preflight` checks it on every node before a launch (net.interface)."
    evidence = [
        f"{p}: net: {key} {r.get('ifname') or 'unset'}, hostname resolves to "
        f"{r.get('hostname_addr') or 'nothing'}, {r.get('route_iface') or 'no interface'} "
        f"routes to {master}"
        + (
            f" ({(r.get('ifaces') or {}).get(r['route_iface'])})"
            if r.get("route_iface") in (r.get("ifaces") or {})
            else ""
        )
        for _, p, r, _ in bad
    ]
    for f in dialed:
        evidence += [e for e in f.evidence if e not in evidence]
    times = [f.t for f in dialed if f.t is not None]
    return Finding(
        category=LOOPBACK,
        severity="error",
        summary=f"{who}: the ranks talked from {addr}, a loopback address the other nodes "
        f"cannot reach"
        + (f'; set cluster.interface = "{iface}"' if iface else "; set cluster.interface"),
        cause="; ".join(why)
        + f". The ranks of the other nodes dialed {addr}, which is their own machine"
        + (", and were refused (below)" if dialed else "")
        + ", so the first collective failed or hung: the rendezvous and timeout errors "
        "that follow are its consequences.",
        fix=fix,
        node=k,
        host=node_host(states[k][1]),
        evidence=evidence[:MAX_EVIDENCE],
        t=min(times) if times else None,
        source=str(path),
    )
