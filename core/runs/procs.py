"""Finding and ending every process of a run.

torchrun starts each rank in its own session, so one killpg does not reach them all. A run's
processes are found three ways: the recorded process groups, the live descendants of the agent
and torchrun, and a sweep for the TUNEDECK_RUN_ID marker in process environments (which also
finds ranks orphaned by a dead agent).
"""

from __future__ import annotations

import os
import signal

import psutil


def descendants(pid: int | None) -> list[psutil.Process]:
    if not pid:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def marked_processes(run_id: str, exclude: set[int] | None = None) -> list[psutil.Process]:
    """Processes whose environment carries TUNEDECK_RUN_ID=run_id."""
    exclude = exclude or set()
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid"]):
        if p.pid in exclude or p.pid == me:
            continue
        try:
            if p.environ().get("TUNEDECK_RUN_ID") == run_id:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def signal_pids(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_groups(pgids, sig: int = signal.SIGKILL) -> None:
    for pgid in set(pgids):
        if not pgid or pgid == os.getpgrp():
            continue
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_run(run_id: str, pgids=(), roots=(), exclude: set[int] | None = None,
             wait_s: float = 5.0) -> list[int]:
    """SIGKILL everything of the run; returns pids still alive after `wait_s` (should be [])."""
    exclude = set(exclude or ()) | {os.getpid()}
    procs: dict[int, psutil.Process] = {}
    for r in roots:
        for p in descendants(r):
            procs[p.pid] = p
        try:
            procs[r] = psutil.Process(r)
        except psutil.Error:
            pass
    for p in marked_processes(run_id, exclude):
        procs[p.pid] = p
    groups = set(pgids)
    for p in procs.values():
        try:
            groups.add(os.getpgid(p.pid))
        except OSError:
            pass
    groups.discard(os.getpgrp())
    kill_groups(groups)
    signal_pids([pid for pid in procs if pid not in exclude], signal.SIGKILL)
    alive = [p for pid, p in procs.items() if pid not in exclude]
    _, alive = psutil.wait_procs(alive, timeout=wait_s)
    # a last sweep catches anything forked while we were killing
    late = marked_processes(run_id, exclude)
    signal_pids([p.pid for p in late], signal.SIGKILL)
    _, late_alive = psutil.wait_procs(late, timeout=wait_s)
    return sorted({p.pid for p in alive} | {p.pid for p in late_alive})


