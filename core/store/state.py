"""state.json's content: what a run is doing. The agent writes it (atomically, through
tunedeck.core.rundir) while it lives; the CLI writes it only to mark a run whose agent is gone
and whose processes are gone too (otherwise a new agent adopts the run: core/supervisor/adopt.py).

Its shape is declared once, as `RunState` in core/rundir/records.py; this module holds what the
runs layer asks of it: a new run's state, whether a file can be trusted, and its values read
as the schema says. Every pid it records (agent_pid, torchrun_pid, worker_pids, rank_pids, the
leaders of pgids) has its identity in `pid_identity` (core/supervisor/procs.py), and each torchrun
the agent started is in `launches` (the launch marker its processes carry).
"""

from __future__ import annotations

import time
from typing import Any

from tunedeck.core.envnum import env_number
from tunedeck.core.rundir.records import (  # noqa: F401  (STATUSES, TERMINAL re-exported)
    INT_LIMIT,
    STATUSES,
    TERMINAL,
    RunState,
    number_or_none,
)


# TUNEDECK_BEAT_S, default 5: tests that freeze an agent set it lower to see it go stale
# sooner. Read here only; the agent and every reader must agree on it.
BEAT_S = env_number("TUNEDECK_BEAT_S", 5.0, floor=0.5)  # a live agent beats at least this often
STALE_AFTER_S = 3 * BEAT_S  # ... so a run not over whose beat is older is marked stale
KEYS = RunState.keys()  # what state.json may hold (the agent writes no other key)


def new_state(run_id: str, name: str, max_steps: int) -> dict[str, Any]:
    return RunState.new(run_id, name, max_steps).to_json()


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

# Without these a state.json says nothing a reader can use: the run is damaged. Any other key
# that holds a wrong value is read as missing (`clean_state`), so one bad value copied from a
# rank's file never hides a live run or makes it unstoppable; `state_problem` still names it
# (`tunedeck doctor`).
VITAL = RunState.VITAL


def state_problem(state: Any) -> str | None:
    """Why `state` cannot be trusted as a run's state.json (one line naming the first bad
    key), or None."""
    fatal = fatal_problem(state)
    if fatal is not None:
        return fatal
    problems = RunState.parse(state)[1]
    return problems[0] if problems else None


def fatal_problem(state: Any) -> str | None:
    """Why `state` cannot be read as a run's state at all (a vital key), or None."""
    if not isinstance(state, dict):
        return "not a JSON object"
    if "run_id" not in state:
        return "run_id: missing"
    return next((p for p in RunState.parse(state)[1] if p.split(":")[0] in VITAL), None)


def clean_state(state: dict[str, Any]) -> dict[str, Any]:
    """A readable state.json as the schema reads it: each key (and progress field) that holds
    a wrong value at its default, as if it had never been written; unknown keys kept."""
    return RunState.from_json(state).to_json()


def progress_from_event(event: dict[str, Any], progress: dict[str, Any]) -> dict[str, Any] | None:
    """state.json's progress after a rank's step event, each value checked as the schema
    says (a rank file is data: a loss of Infinity, a string or a list is dropped, never
    copied); None when the event names no usable step."""
    step = event.get("step")
    if type(step) is not int or not 0 <= step < INT_LIMIT:
        return None
    out = dict(progress)
    out["step"] = step
    for key in ("loss", "lr", "tokens_per_s", "t"):
        out[key] = number_or_none(event.get(key))
    return out


def stale_for(state: dict[str, Any], now: float | None = None) -> float | None:
    """Seconds since a live run's agent last wrote state.json's beat, when that is longer
    than STALE_AFTER_S (a frozen or hung agent: its progress is old news); else None."""
    beat = number_or_none(state.get("beat"))
    if state.get("status") in TERMINAL or beat is None:
        return None
    age = (time.time() if now is None else now) - beat
    return age if age > STALE_AFTER_S else None
