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
(core/supervisor/procs.py): a stop never reaches a process that merely reuses a recorded pid.

Only the user's own runs are stopped: a run directory that fails core/rundir/ownership.py's
rule (another user's, writable by others, a symlink) names pids and a Slurm job its writer
chose, so `stop` and `request_stop` raise `ForeignRun` before anything is written or signalled.

A run launched a moment ago has state.json before its agent has taken it (launch's
`start_agent` returns once the agent has written its pid): a stop in that window waits for the
agent (which reads stop.json before it starts anything and ends "stopped before start") instead
of taking the run for one whose agent is gone. Only when no agent comes, or the agent is gone,
does the stop end the run from here, and then its words say what it did: processes killed
only when some were.
"""

from __future__ import annotations

import os
import signal
import time

from tunedeck.core.alerts.watch import END_WAIT_S
from tunedeck.core.rundir import ownership, write_json_atomic
from tunedeck.core.rundir.ownership import ForeignRun
from tunedeck.core.supervisor import adopt, procs
from tunedeck.core.views.registry import RunInfo, read_run
from tunedeck.core.store.state import TERMINAL

__all__ = ["ForeignRun", "request_stop", "stop", "wait_stopped"]

# How long after its state.json was written a run may still be without an agent: launch's
# start_agent waits 20 s for the agent's pid, the agent up to 30 s for the run's lock.
START_WAIT_S = 30.0


def _check_owner(run: RunInfo) -> None:
    """ForeignRun unless the run is this user's own (checked now, not as it was listed)."""
    if run.foreign:
        raise ForeignRun(run.run_dir, run.message.removeprefix("foreign: "))
    ownership.check(run.run_dir)


def request_stop(run: RunInfo, hard: bool = False, grace_s: float | None = None) -> None:
    """Write stop.json and wake the agent (adopting the run first when its agent is gone;
    waiting for it when the run was launched a moment ago and its agent has not taken it yet).
    Returns once an agent has the request, or once the run was ended from here. Raises
    ForeignRun for a run that is not this user's: nothing is written or signalled."""
    _check_owner(run)
    req = {"mode": "hard" if hard else "graceful", "t": time.time()}
    if grace_s is not None:
        req["grace_s"] = grace_s
    write_json_atomic(run.run.stop_request, req)
    state = run.run.read_state() or run.state
    if _unowned(state):
        # launched a moment ago: the agent has not written its pid yet. It reads stop.json
        # before it starts anything; the run is not one whose agent is gone.
        state = _await_agent(run, state)
        if _unowned(state):
            _stop_unstarted(run)
            return
    if procs.owner_alive(state) or adopt.ensure_agent(run.run_dir):
        _wake(run.run.read_state() or state)
        return
    if procs.owner_alive(state) is None:
        return  # recorded on another host: its agent there reads stop.json
    _stop_orphaned(run)


def _unowned(state: dict) -> bool:
    """Not over, and no agent has taken it yet (a launch starting its agent, or one that died
    before it could). A Slurm job's agents start when the job does (`_stop_slurm`)."""
    return (
        not (state.get("agent_pid") or state.get("slurm_job"))
        and state.get("status") not in TERMINAL
    )


def _await_agent(run: RunInfo, state: dict) -> dict:
    """state.json once an agent has taken the run or the run has ended, waiting until
    START_WAIT_S after the run was written (a run abandoned long ago is not waited for), and
    only while the launch that wrote it is alive to start that agent (a run only prepared, or
    whose launch died, has no agent coming)."""
    launcher = state.get("launcher")
    if not isinstance(launcher, dict) or not procs.same_process(launcher.get("pid"), launcher):
        return state
    try:
        created = float(state.get("created") or 0.0)
    except (TypeError, ValueError):
        created = 0.0
    deadline = time.monotonic() + max(0.0, min(START_WAIT_S, created + START_WAIT_S - time.time()))
    while _unowned(state) and time.monotonic() < deadline:
        time.sleep(0.05)
        state = run.run.read_state() or state
    return state


def _stop_unstarted(run: RunInfo) -> None:
    """No agent ever took the run (its launch ended before starting one): record it stopped,
    under the owner lock so that an agent taking the run meanwhile is not overwritten (one
    that comes later finds stop.json and ends the run the same way)."""
    fd = adopt.lock_owner(run.run_dir)
    if fd is None:  # an agent holds the run now: it reads stop.json before it starts
        return
    try:
        st = run.run.read_state() or dict(run.state)
        if not _unowned(st):
            if procs.owner_alive(st):
                _wake(st)
            return
        st.update(
            status="stopped",
            ended=time.time(),
            worker_pids=[],
            message="stopped before start: no agent had taken the run (its launch "
            "ended before starting one)",
        )
        run.run.write_state(st)
    finally:
        if fd >= 0:
            os.close(fd)


def _wake(state: dict) -> None:
    """SIGUSR1 to the run's agent, verified by identity just before, so it reads stop.json
    now rather than at its next tick. Only once it handles the signal: an agent that has just
    written its pid may not have installed its handlers yet, and SIGUSR1 would kill it (it
    looks for stop.json by itself before it starts anything)."""
    pid = state.get("agent_pid")
    if procs.owner_alive(state) and procs.catches(pid, signal.SIGUSR1):
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass


def _stop_orphaned(run: RunInfo) -> None:
    """No agent, and none could adopt the run: kill what is left of it (by identity) and
    record it, saying what was done. Under the owner lock where it can be had: an agent that
    took the run meanwhile is woken instead."""
    ownership.check(run.run_dir)
    fd = adopt.lock_owner(run.run_dir)
    try:
        st = run.run.read_state() or run.state
        if st.get("status") in TERMINAL:
            return
        if fd is None and procs.owner_alive(st):  # an agent took the run after all
            _wake(st)
            return
        found, groups = procs.run_processes(st)
        left = procs.kill_run(st) if found or groups else []
        if found:
            msg = f"stopped (agent was gone; {len(found)} processes killed)"
        else:
            msg = "stopped (agent was gone; none of its processes was running)"
        if left:
            msg += f"; could not kill pids {left}"
        st.update(status="stopped", ended=time.time(), worker_pids=[], message=msg)
        run.run.write_state(st)
    finally:
        if fd is not None and fd >= 0:
            os.close(fd)


def wait_stopped(run: RunInfo, timeout_s: float) -> RunInfo:
    deadline = time.monotonic() + timeout_s
    cur = run
    while time.monotonic() < deadline:
        cur = read_run(run.run_dir) or cur
        if cur.state.get("status") in TERMINAL and not procs.owner_alive(cur.state):
            return cur
        time.sleep(0.1)
    return cur


def wait_settled(run: RunInfo) -> RunInfo:
    """An ended run, once its agent has exited: the agent sends the end's alerts after the
    final status (alerts.json is its last write), so a script that reads or archives the
    folder after a `--wait` sees it whole. Bounded by the agent's own wait for its alerts."""
    return wait_stopped(run, END_WAIT_S + 5.0)


def stop(
    run: RunInfo,
    hard: bool = False,
    grace_s: float | None = None,
    timeout_s: float | None = None,
    wait: bool = True,
) -> RunInfo:
    """Ask the run to stop. `wait`: until it is over or `timeout_s` has passed (default: the
    grace period, after which the agent SIGKILLs, plus 30 s); else return at once. Raises
    ForeignRun for a run that is not this user's (nothing is written, signalled or
    cancelled)."""
    _check_owner(run)
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


def _stop_slurm(
    run: RunInfo, job: str, hard: bool, grace_s: float | None, timeout_s: float | None, wait: bool
) -> RunInfo:
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
