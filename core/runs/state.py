"""state.json's content: what a run is doing. The agent writes it (atomically, through
tunedeck.core.rundir) while it lives; the CLI writes it only to mark a run whose agent is gone
and whose processes are gone too (otherwise a new agent adopts the run: core/runs/adopt.py).

Every pid it records (agent_pid, torchrun_pid, worker_pids, rank_pids, the leaders of pgids) has
its identity in `pid_identity` ({"<pid>": {"start": ticks after boot, "boot": boot id}}; see
core/runs/procs.py), and each torchrun the agent started is in `launches`
({"id", "attempt", "boot", "after", "t"}: the launch marker its processes carry).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from tunedeck.core.rundir import TERMINAL  # re-exported: the runs layer names it from here
STATUSES = ("pending", "running", *TERMINAL)   # what the agent writes (readers add `lost`)
BEAT_S = 5.0            # a live agent writes state.json `beat` at least this often
STALE_AFTER_S = 3 * BEAT_S   # ... so a run not over whose beat is older is marked stale


def new_state(run_id: str, name: str, max_steps: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "name": name,
        "status": "pending",
        "message": "",
        "created": time.time(),
        "started": None,
        "ended": None,
        "agent_pid": None,
        "agent_pgid": None,
        "agent_create_time": None,
        "torchrun_pid": None,
        "worker_pids": [],
        "pgids": [],
        "pid_identity": {},
        "launches": [],
        "host": os.uname().nodename,
        "master_port": None,
        "attempt": 0,
        "exit_code": None,
        "stop_requested": None,
        "progress": {"step": 0, "max_steps": max_steps, "loss": None, "lr": None,
                     "tokens_per_s": None, "t": None},
    }


def pid_alive(pid: int | None, create_time: float | None = None) -> bool:
    """True if `pid` runs and, when known, is the same process (pids are reused)."""
    if not pid:
        return False
    try:
        import psutil

        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is not None and abs(p.create_time() - create_time) > 1.0:
            return False
        return True
    except Exception:
        return False


# What each key of state.json may hold (a key may be absent: older runs lack newer keys).
# A reader checks before trusting the file, so one damaged run shows as damaged instead of
# breaking every command that lists runs.
_INT, _NUM, _STR = "an integer", "a number", "a string"
INT_LIMIT = 1 << 63
_SCHEMA: dict[str, tuple[str, bool]] = {       # key: (kind, may be null)
    "run_id": (_STR, False), "name": (_STR, False), "status": (_STR, False),
    "message": (_STR, True), "host": (_STR, True),
    "created": (_NUM, False), "started": (_NUM, True), "ended": (_NUM, True),
    "agent_pid": (_INT, True), "agent_pgid": (_INT, True), "agent_create_time": (_NUM, True),
    "torchrun_pid": (_INT, True), "master_port": (_INT, True), "attempt": (_INT, True),
    "exit_code": (_INT, True), "stop_requested": (_STR, True),
    "worker_pids": ("a list of integers", True), "pgids": ("a list of integers", True),
    "pid_identity": ("an object", True), "rank_pids": ("an object", True),
    "launches": ("a list", True), "preflight": ("an object", True),
    "progress": ("an object", True), "agent_crashes": (_INT, True),
    "attempts": ("a list", True), "io_pauses": ("a list", True), "adopted": ("a list", True),
    "beat": (_NUM, True), "survivors": ("a list of integers", True),
    "forced_stop": ("an object", True), "db_restored": ("a list", True),
    "output_shared_with": ("a list", True),
}
_PROGRESS: dict[str, str] = {"step": _INT, "max_steps": _INT, "loss": _NUM, "lr": _NUM,
                             "tokens_per_s": _NUM, "t": _NUM}


def _is(kind: str, v: Any) -> bool:
    if kind == _INT:   # one that fits the 64-bit integers every reader (SQLite too) takes
        return isinstance(v, int) and not isinstance(v, bool) and -INT_LIMIT <= v < INT_LIMIT
    if kind == _NUM:
        return (type(v) is float and math.isfinite(v)) or (type(v) is int and abs(v) < 1e308)
    if kind == _STR:
        return isinstance(v, str)
    if kind == "a list of integers":
        return isinstance(v, list) and all(_is(_INT, x) for x in v)
    if kind == "a list":
        return isinstance(v, list)
    return isinstance(v, dict)


def state_problem(state: Any) -> str | None:
    """Why `state` cannot be trusted as a run's state.json (one line naming the key), or None."""
    if not isinstance(state, dict):
        return "not a JSON object"
    for key, (kind, nullable) in _SCHEMA.items():
        if key not in state:
            if key == "run_id":
                return "run_id: missing"
            continue
        v = state[key]
        if v is None and nullable:
            continue
        if not _is(kind, v):
            return f"{key}: expected {kind}, got {_shown(v)}"
    status = state.get("status", "pending")
    if status not in STATUSES:
        return f"status: expected one of {', '.join(STATUSES)}, got {_shown(status)}"
    for key, kind in _PROGRESS.items():
        v = (state.get("progress") or {}).get(key)
        if v is not None and not _is(kind, v):
            return f"progress.{key}: expected {kind}, got {_shown(v)}"
    return None


# Without these a state.json says nothing a reader can use: the run is damaged. Any other key
# that holds a wrong value is read as missing (`clean_state`), so one bad value copied from a
# rank's file never hides a live run or makes it unstoppable; `state_problem` still names it
# (`tunedeck doctor`).
VITAL = ("run_id", "status")


def fatal_problem(state: Any) -> str | None:
    """Why `state` cannot be read as a run's state at all (a vital key), or None."""
    if not isinstance(state, dict):
        return "not a JSON object"
    if "run_id" not in state:
        return "run_id: missing"
    if not _is(_STR, state["run_id"]):
        return f"run_id: expected {_STR}, got {_shown(state['run_id'])}"
    status = state.get("status", "pending")
    if status not in STATUSES:
        return f"status: expected one of {', '.join(STATUSES)}, got {_shown(status)}"
    return None


def clean_state(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of a readable state.json with each key (and progress field) that holds a wrong
    value dropped, as if it had never been written."""
    out: dict[str, Any] = {}
    for key, v in state.items():
        rule = _SCHEMA.get(key)
        if rule is not None and not (v is None and rule[1]) and not _is(rule[0], v):
            continue
        out[key] = v
    prog = out.get("progress")
    if isinstance(prog, dict):
        out["progress"] = {k: v for k, v in prog.items()
                           if k not in _PROGRESS or v is None or _is(_PROGRESS[k], v)}
    return out


def progress_from_event(event: dict[str, Any], progress: dict[str, Any]) -> dict[str, Any] | None:
    """state.json's progress after a rank's step event, each value checked as the schema
    says (a rank file is data: a loss of Infinity, a string or a list is dropped, never
    copied); None when the event names no usable step."""
    step = event.get("step")
    if not _is(_INT, step) or step < 0:
        return None
    out = dict(progress)
    out["step"] = step
    for key in ("loss", "lr", "tokens_per_s", "t"):
        v = event.get(key)
        out[key] = v if _is(_NUM, v) else None
    return out


def stale_for(state: dict[str, Any], now: float | None = None) -> float | None:
    """Seconds since a live run's agent last wrote state.json's beat, when that is longer
    than STALE_AFTER_S (a frozen or hung agent: its progress is old news); else None."""
    beat = state.get("beat")
    if state.get("status") in TERMINAL or not _is(_NUM, beat):
        return None
    age = (time.time() if now is None else now) - beat
    return age if age > STALE_AFTER_S else None


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
