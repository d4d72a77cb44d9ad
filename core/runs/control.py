"""Stopping a run: ask its agent, or do the agent's job when the agent is gone."""

from __future__ import annotations

import os
import signal
import time

from tunedeck.core.runs import procs
from tunedeck.core.runs.registry import RunInfo, read_run
from tunedeck.core.rundir import write_json_atomic
from tunedeck.core.runs.state import TERMINAL, pid_alive


def request_stop(run: RunInfo, hard: bool = False, grace_s: float | None = None) -> None:
    """Write stop.json and wake the agent. Returns at once; see wait_stopped."""
    req = {"mode": "hard" if hard else "graceful", "t": time.time()}
    if grace_s is not None:
        req["grace_s"] = grace_s
    write_json_atomic(run.run.stop_request, req)
    pid = run.state.get("agent_pid")
    if pid and pid_alive(pid, run.state.get("agent_create_time")):
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    else:
        _stop_orphaned(run)


def _stop_orphaned(run: RunInfo) -> None:
    """No agent: kill what is left of the run ourselves and record it."""
    st = run.state
    procs.kill_run(run.run_id, pgids=st.get("pgids", []),
                   roots=[p for p in (st.get("torchrun_pid"),) if p])
    st.update(status="stopped", ended=time.time(), worker_pids=[],
              message="stopped (agent was gone; processes killed)")
    run.run.write_state(st)


def wait_stopped(run: RunInfo, timeout_s: float) -> RunInfo:
    deadline = time.monotonic() + timeout_s
    cur = run
    while time.monotonic() < deadline:
        cur = read_run(run.run_dir) or cur
        if cur.status in TERMINAL and not pid_alive(cur.state.get("agent_pid"),
                                                    cur.state.get("agent_create_time")):
            return cur
        time.sleep(0.2)
    return cur


def stop(run: RunInfo, hard: bool = False, grace_s: float | None = None,
         timeout_s: float | None = None) -> RunInfo:
    """Stop and wait until the agent has recorded the end. A graceful stop escalates to
    SIGKILL after the grace period by itself (the agent enforces it)."""
    if not run.needs_stop:
        return run
    request_stop(run, hard=hard, grace_s=grace_s)
    grace = grace_s if grace_s is not None else _grace(run)
    return wait_stopped(run, timeout_s if timeout_s is not None else grace + 30)


def _grace(run: RunInfo) -> float:
    try:
        from tunedeck.core.spec import load_spec

        return load_spec(run.run.spec).run.stop_grace_s
    except Exception:
        return 60.0
