"""A queued run's turn. Its agent calls `wait_turn` before preparing anything; every POLL_S,
under the queue lock, it reads the home's runs (their state.json): the queued ones in order
(higher `priority` first, then the time queued), the live ones with the GPUs they hold. The
first queued run starts when its GPUs are free (the ones named in cluster.gpus, else the
first run.gpu_count free ones, else all) and, in a sweep, fewer than its `limit` runs of its
`group` are live; it records the GPUs it took in state.json before the lock is let go, so
the next run sees them held. A queued run whose agent is gone keeps its place but does not
hold up the others (the next tunedeck command adopts it and it waits again)."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from tunedeck.core.queue.gpus import held_by, named, nvml_view
from tunedeck.core.rundir import TERMINAL, RunDir, read_json
from tunedeck.core.spec import RunSpec

POLL_S = 1.0


def queue_record(spec: RunSpec, group: str = "", limit: int = 0) -> dict[str, Any]:
    """state.json `queue` of a run launched queued."""
    rec: dict[str, Any] = {"since": time.time(), "priority": spec.run.priority}
    if group:
        rec.update(group=group, limit=limit)
    return rec


@contextmanager
def queue_lock(root: Path):
    path = root.resolve().with_name(root.resolve().name + ".queue.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def agent_alive(state: dict[str, Any]) -> bool:
    pid = state.get("agent_pid")
    if not isinstance(pid, int):
        return False
    try:
        p = psutil.Process(pid)
        made = state.get("agent_create_time")
        return made is None or abs(p.create_time() - float(made)) < 1.0
    except (psutil.Error, TypeError, ValueError):
        return False


def home_runs(root: Path) -> list[tuple[RunDir, dict[str, Any]]]:
    out = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        st = read_json(d / "state.json", None)
        if isinstance(st, dict) and isinstance(st.get("run_id"), str):
            out.append((RunDir(d), st))
    return out


def order_key(state: dict[str, Any]) -> tuple:
    q = state.get("queue") or {}
    return (-int(q.get("priority") or 0), float(q.get("since") or 0), state.get("run_id", ""))


def queued_in_order(runs: list[tuple[RunDir, dict[str, Any]]]) -> list[dict[str, Any]]:
    return sorted((st for _, st in runs if st.get("status") == "queued"), key=order_key)


def _spec_gpus(run: RunDir) -> str:
    import tomllib

    try:
        raw = tomllib.loads(run.spec.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    g = (raw.get("cluster") or {}).get("gpus", "")
    return g if isinstance(g, str) else ""


def try_start(run: RunDir, spec: RunSpec, me: dict[str, Any]) -> tuple[list[int] | None, str]:
    """One look at the queue (the caller holds the lock): the GPUs this run takes now, or
    None and why it waits."""
    runs = home_runs(run.path.parent)
    live = [
        (r, st)
        for r, st in runs
        if st.get("run_id") != me.get("run_id")
        and st.get("status") not in TERMINAL
        and st.get("status") != "queued"
    ]
    waiting = [
        st for st in queued_in_order(runs) if agent_alive(st) or st["run_id"] == me["run_id"]
    ]
    ids = [st["run_id"] for st in waiting]
    pos = ids.index(me["run_id"]) + 1 if me["run_id"] in ids else len(ids) + 1
    if pos > 1:
        return None, f"queued: {pos} of {len(ids)}, after {ids[0]}"
    q = me.get("queue") or {}
    group, limit = q.get("group"), int(q.get("limit") or 0)
    if group and limit:
        mine = [st for _, st in live if (st.get("queue") or {}).get("group") == group]
        if len(mine) >= limit:
            return None, f"queued: {len(mine)} of the sweep's {limit} parallel runs are running"
    held: set[int] = set()
    ours: set[int] = set()
    for r, st in live:
        held.update(held_by(st, _spec_gpus(r)))
        ours.update(int(p) for p in (st.get("rank_pids") or {}).values() if isinstance(p, int))
    total, busy = nvml_view(ours)
    free = [g for g in range(total) if g not in held and g not in busy]
    want = named(spec.cluster.gpus) or None
    if want is not None:
        if all(g in free for g in want):
            return want, ""
        return None, f"queued: waiting for GPUs {','.join(map(str, want))} (free: {free})"
    count = spec.run.gpu_count or total
    if len(free) >= count:
        return free[:count], ""
    return None, f"queued: waiting for {count} free GPUs (free now: {free or 'none'})"


def wait_turn(
    run: RunDir,
    spec: RunSpec,
    state: dict[str, Any],
    save: Callable[..., None],
    sleep: Callable[[float], None],
    stopped: Callable[[], bool],
) -> list[int] | None:
    """Wait for this run's turn; the GPUs it took (recorded in state.json `queue.gpus`
    under the lock), or None when a stop came first."""
    said = ""
    while not stopped():
        with queue_lock(run.path.parent):
            gpus, why = try_start(run, spec, state)
            if gpus is not None:
                q = {**(state.get("queue") or {}), "gpus": gpus, "started": time.time()}
                save(status="pending", queue=q, message="preparing")
                return gpus
        if why != said:
            save(status="queued", message=why)
            said = why
        sleep(POLL_S)
    return None


def queue_env(state: dict[str, Any]) -> dict[str, str]:
    """The environment a queued run's torchrun gets: the GPUs it took."""
    gpus = (state.get("queue") or {}).get("gpus")
    if isinstance(gpus, list) and gpus:
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}
    return {}
