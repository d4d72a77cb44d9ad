"""Stopping a run: ask its agent; when the agent is gone, a new agent adopts the run first and
stops it the same graceful way; only a run nobody can adopt is killed from here.

The API for the command line and the TUI:

    stop(run, hard=False, grace_s=None, wait=True, timeout_s=None) -> RunInfo

`wait=False` records the request (stop.json, read by the agent on its next tick; the built-in
trainer also reads it before its first step) and returns at once with the run as it reads now
(`needs_stop` still True, `state["stop_requested"]` set once the agent has acted). `wait=True`
blocks until the run is over: a graceful stop escalates to SIGKILL after the grace period by
itself (the agent enforces it), so the wait is bounded (timeout_s, default grace + 30 s).
Every process that is signalled is checked against its recorded identity first
(core/runs/procs.py): a stop never reaches a process that merely reuses a recorded pid.
"""

from __future__ import annotations

import os
import signal
import time

from tunedeck.core.runs import adopt, procs
from tunedeck.core.runs.registry import RunInfo, read_run
from tunedeck.core.rundir import write_json_atomic
from tunedeck.core.runs.state import TERMINAL


def request_stop(run: RunInfo, hard: bool = False, grace_s: float | None = None) -> None:
    """Write stop.json and wake the agent (adopting the run first when its agent is gone).
    Returns once an agent has the request, or once the run was killed from here."""
    req = {"mode": "hard" if hard else "graceful", "t": time.time()}
    if grace_s is not None:
        req["grace_s"] = grace_s
    write_json_atomic(run.run.stop_request, req)
    state = run.run.read_state() or run.state
    if procs.owner_alive(state) or adopt.ensure_agent(run.run_dir):
        state = run.run.read_state() or state
        pid = state.get("agent_pid")
        if procs.owner_alive(state):
            try:
                os.kill(pid, signal.SIGUSR1)   # verified just above: it is the agent
            except ProcessLookupError:
                pass
        return
    if procs.owner_alive(state) is None:
        return   # recorded on another host: its agent there reads stop.json
    _stop_orphaned(run)


def _stop_orphaned(run: RunInfo) -> None:
    """No agent, and none could adopt the run: kill what is left of it (by identity) and
    record it."""
    st = run.run.read_state() or run.state
    if st.get("status") in TERMINAL:
        return
    left = procs.kill_run(st)
    msg = "stopped (agent was gone; processes killed)"
    if left:
        msg += f"; could not kill pids {left}"
    st.update(status="stopped", ended=time.time(), worker_pids=[], message=msg)
    run.run.write_state(st)


def wait_stopped(run: RunInfo, timeout_s: float) -> RunInfo:
    deadline = time.monotonic() + timeout_s
    cur = run
    while time.monotonic() < deadline:
        cur = read_run(run.run_dir) or cur
        if cur.state.get("status") in TERMINAL and not procs.owner_alive(cur.state):
            return cur
        time.sleep(0.1)
    return cur


def stop(run: RunInfo, hard: bool = False, grace_s: float | None = None,
         timeout_s: float | None = None, wait: bool = True) -> RunInfo:
    """Ask the run to stop. `wait`: until it is over or `timeout_s` has passed (default: the
    grace period, after which the agent SIGKILLs, plus 30 s); else return at once."""
    if not run.needs_stop:
        return run
    if run.state.get("slurm_job"):
        return _stop_slurm(run, str(run.state["slurm_job"]), hard, grace_s, timeout_s, wait)
    request_stop(run, hard=hard, grace_s=grace_s)
    if not wait:
        return read_run(run.run_dir) or run
    if timeout_s is None:
        timeout_s = (0.0 if hard else grace_s if grace_s is not None else _grace(run)) + 30.0
    return wait_stopped(run, timeout_s)


def _grace(run: RunInfo) -> float:
    try:
        from tunedeck.core.spec import load_spec

        return load_spec(run.run.spec).run.stop_grace_s
    except Exception:
        return 60.0


def _stop_slurm(run: RunInfo, job: str, hard: bool, grace_s: float | None,
                timeout_s: float | None, wait: bool) -> RunInfo:
    """A run Slurm holds: stop.json for its agents (read by node 0's, and by the trainer
    before its first step) and scancel: TERM to the job's steps first (each node's agent
    stops gracefully), the whole job after the grace period; a job still queued is just
    cancelled."""
    from tunedeck.core.nodes import slurm

    req = {"mode": "hard" if hard else "graceful", "t": time.time(), "by": "scancel"}
    if grace_s is not None:
        req["grace_s"] = grace_s
    write_json_atomic(run.run.stop_request, req)
    queued = slurm.queue_state(job)
    started = bool((run.run.read_state() or run.state).get("agent_pid"))
    if queued is None or queued["state"] == "PENDING" or not started or hard:
        slurm.cancel(job, graceful=False)
        if not started:
            _mark_stopped(run, f"cancelled in Slurm (job {job}) before it started")
    else:
        slurm.cancel(job, graceful=True)
    if not wait:
        return read_run(run.run_dir) or run
    grace = 0.0 if hard else grace_s if grace_s is not None else _grace(run)
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else grace + 30.0)
    hard_at = time.monotonic() + grace
    escalated = hard
    cur = run
    while time.monotonic() < deadline:
        cur = read_run(run.run_dir) or cur
        in_queue = slurm.queue_state(job) is not None
        if cur.state.get("status") in TERMINAL and not in_queue:
            return cur
        if not in_queue:
            # Slurm ended the job before its agent wrote the end: say what happened
            _mark_stopped(cur, f"stopped: Slurm job {job} was cancelled")
        elif not escalated and time.monotonic() >= hard_at:
            escalated = True
            slurm.cancel(job, graceful=False)
        time.sleep(0.5)
    return read_run(run.run_dir) or cur


def _mark_stopped(run: RunInfo, msg: str) -> None:
    st = run.run.read_state() or dict(run.state)
    if st.get("status") in TERMINAL:
        return
    st.update(status="stopped", ended=time.time(), worker_pids=[], message=msg)
    run.run.write_state(st)
