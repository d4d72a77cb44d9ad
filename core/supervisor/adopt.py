"""A run whose agent died is adopted by a new agent, started by whichever tunedeck command
reads it next. There is no daemon.

The trigger is the registry's read path: `registry.info_from_state` (used by `find_run`,
`list_runs`, `Registry.scan`, `read_run`, so by `tunedeck ls/status/stop/metrics/logs/...`,
the TUI's runs list and monitor refresh) calls `request(run_dir, state)` when state.json says
the run is not over but its agent is gone (by identity, on this host and boot). `request`
starts `python -m tunedeck.core.supervisor.agent RUN_DIR --adopt` detached, at most once per
ADOPT_EVERY_S per run and process, and returns at once; `ensure_agent` does the same and waits
until the new agent owns the run (`tunedeck stop` on an orphaned run). TUNEDECK_NO_ADOPT=1 in
a reader's environment turns the trigger off (a viewer that must not start anything).

One agent per run at a time: every agent holds an exclusive flock on the run directory for
its life (`lock_owner`); a second adopter started meanwhile finds it held and exits.

Only the user's own runs are adopted: an adoption runs plan.json's argv as whoever adopts, so
a run directory that fails core/rundir/ownership.py's rule (the folder or a file the agent
reads owned by another user, writable by others, a symlink) is refused by `why_not`
("foreign: <why>"), `request`, `spawn` and `ensure_agent`, and by the agent itself.

What the adopter can know, and what not:
  - its processes: torchrun and the ranks by the identity state.json recorded (pid + start
    time + boot id) and by the launch marker in their environments (core/supervisor/procs.py);
  - everything the ranks wrote: events resume from run.db's stored byte offsets, so nothing
    written while no agent watched is lost; the monitors start afresh (telemetry from the
    moment of adoption; the log diagnosis rescans the logs);
  - torchrun is not its child: it cannot wait() for it, so it polls the identity, and the exit
    code is read from what the attempt left (`exit_code`): every rank's `end` event
    (completed/stopped → 0, failed → 1), a rank's error.json or torchrun's ChildFailedError in
    its log (→ 1). torchrun's true exit status is lost (its parent, init, reaped it): when
    the ranks wrote no `end` and torchrun logged no failure (torchrun itself SIGKILLed; a
    backend whose ranks write no `end` events and ended quietly) the code is unknown, the run
    is recorded `failed` with "exit code unknown" and `exit_code` null;
  - ranks orphaned by a dead torchrun are watched until they end; they are not its children
    either (it cannot become their subreaper after the fact);
  - time it did not see: telemetry and live detectors have a gap between the old agent's death
    and the adoption.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tunedeck.core.rundir import FILE_MODE, RunDir, ownership
from tunedeck.core.supervisor import procs
from tunedeck.core.supervisor.launch import AGENT_UMASK

ADOPT_EVERY_S = 10.0
MAX_AGENT_CRASHES = 3
NO_ADOPT_ENV = "TUNEDECK_NO_ADOPT"
FOREIGN_PREFIX = "foreign: "  # how `why_not` begins for a run that is not the user's

_last_try: dict[str, float] = {}


# -- one agent per run ----------------------------------------------------------------------


def lock_owner(run_dir: Path, wait_s: float = 0.0) -> int | None:
    """Take the run's owner lock (an exclusive flock on the run directory, held for the
    agent's life, released by the kernel when it dies). Returns the fd to keep open; -1 when
    the file system has no flock (then there is no guard); None when another agent holds it."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)  # O_CLOEXEC: Python's default
    except OSError:
        return -1
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                return -1
        if time.monotonic() >= deadline:
            os.close(fd)
            return None
        time.sleep(0.05)


# -- when to adopt ----------------------------------------------------------------------------


def why_not(run_dir: Path, state: dict[str, Any]) -> str | None:
    """None when a new agent may adopt the run now; else why not ("foreign: <why>" for a run
    directory that is not this user's own: core/rundir/ownership.py)."""
    from tunedeck.core.store.state import TERMINAL

    foreign = ownership.problem(run_dir)
    if foreign is not None:
        return FOREIGN_PREFIX + foreign
    if state.get("status") in TERMINAL:
        return "the run is over"
    if not state.get("agent_pid"):
        return "no agent ever started"
    table = state.get("pid_identity")
    if not isinstance(table, dict) or str(state.get("agent_pid")) not in table:
        return "its agent recorded no identity (an older tunedeck, or not an agent's state)"
    alive = procs.owner_alive(state)
    if alive is None:
        return f"the run belongs to host {state.get('host')}"
    if alive:
        return "its agent is alive"
    if int(state.get("agent_crashes") or 0) >= MAX_AGENT_CRASHES:
        return f"its agent crashed {state.get('agent_crashes')} times"
    run = RunDir(run_dir)
    if not (run.spec.exists() and run.plan.exists()):
        return "spec.toml or plan.json is missing"
    return None


def request(run_dir: Path, state: dict[str, Any], force: bool = False) -> bool:
    """Start an adopting agent unless one was started from here in the last ADOPT_EVERY_S
    seconds; never waits. True when one was started."""
    if os.environ.get(NO_ADOPT_ENV) == "1" and not force:
        return False
    key = str(run_dir)
    now = time.monotonic()
    if not force and now - _last_try.get(key, -ADOPT_EVERY_S) < ADOPT_EVERY_S:
        return False
    if why_not(run_dir, state) is not None:
        return False
    _last_try[key] = now
    try:
        spawn(run_dir)
    except (OSError, ownership.ForeignRun):
        return False
    return True


def spawn(run_dir: Path) -> subprocess.Popen:
    """`python -m tunedeck.core.supervisor.agent RUN_DIR --adopt`, detached like a launch's (its
    own session, output to agent.log, umask 077). Raises `ownership.ForeignRun` for a run
    that is not this user's (nothing is opened or started)."""
    ownership.check(run_dir)
    run = RunDir(run_dir)
    env = dict(os.environ)
    for k in (procs.RUN_ID_ENV, procs.LAUNCH_ID_ENV, "TUNEDECK_RUN_DIR", "TUNEDECK_ATTEMPT"):
        env.pop(k, None)  # never the marker of a run the reader may be running inside
    # followed on purpose: a Slurm node's agent.log links into the head's logs, and the run
    # folder was checked to be this user's alone (why_not), so no one else placed a link
    log = os.open(run.agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "tunedeck.core.supervisor.agent", str(run.path), "--adopt"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=str(run.path),
            env=env,
            umask=AGENT_UMASK,
        )
    finally:
        os.close(log)


def ensure_agent(run_dir: Path, timeout_s: float = 20.0) -> bool:
    """The run has a live agent when this returns True: the one it had, or a new one that
    adopted it (started here and waited for). False when none could take it, and for a run
    that is not this user's (nothing is started; `ownership.problem` says why)."""
    if ownership.problem(run_dir) is not None:
        return False
    run = RunDir(run_dir)
    state = run.read_state() or {}
    if procs.owner_alive(state):
        return True
    if why_not(run_dir, state) is not None:
        return False
    try:
        proc = spawn(run_dir)
    except ownership.ForeignRun:
        return False
    _last_try[str(run_dir)] = time.monotonic()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = run.read_state() or {}
        if procs.owner_alive(state):
            return True
        if proc.poll() is not None:  # it found another owner, or could not adopt
            return bool(procs.owner_alive(run.read_state() or {}))
        time.sleep(0.05)
    return bool(procs.owner_alive(run.read_state() or {}))


# -- what an attempt left ---------------------------------------------------------------------


def exit_code(run: RunDir, since: float, node: int = 0) -> tuple[int | None, str]:
    """torchrun's exit code on `node`, read from what the attempt that started at `since`
    left (the adopter is not torchrun's parent): (code or None when unknown, how it was
    known)."""
    from tunedeck.core.store.store import read_events

    plan = run.read_plan()
    try:
        nproc = int(plan.get("nproc_per_node") or 0)
    except (TypeError, ValueError):
        nproc = 0
    expected = set(range(node * nproc, node * nproc + nproc))
    last: dict[int, dict[str, Any]] = {}
    try:
        ends = read_events(run, "end")
    except Exception:
        ends = []
    for e in ends:
        t = e.get("t")
        if isinstance(e.get("rank"), int) and isinstance(t, (int, float)) and t >= since:
            last[e["rank"]] = e
    failed = [e for e in last.values() if e.get("reason") == "failed"]
    if failed:
        e = failed[0]
        return 1, f"rank {e['rank']} recorded its failure: {str(e.get('error') or '')[:200]}"
    if expected and expected <= set(last):
        return 0, "every rank recorded its end"
    for src in run.rank_logs(latest_only=True):
        if src.kind == "error_json":
            try:
                if src.path.stat().st_mtime >= since:
                    return 1, f"rank {src.rank} left {src.path.name}"
            except OSError:
                continue
    tail = _tail(run.torchrun_log(node))
    if "ChildFailedError" in tail or "exitcode" in tail:
        return 1, "torchrun's log reports a failed rank"
    missing = sorted(expected - set(last)) if expected else []
    return None, (f"rank(s) {missing} recorded no end" if missing else "no rank recorded an end")


def _tail(path: Path, n: int = 16384) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
