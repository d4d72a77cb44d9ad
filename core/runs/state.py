"""state.json's content: what a run is doing. The agent writes it (atomically, through
tunedeck.core.rundir) while it lives; the CLI writes it only to mark a run whose agent is gone
and whose processes are gone too (otherwise a new agent adopts the run: core/runs/adopt.py).

Every pid it records (agent_pid, torchrun_pid, worker_pids, rank_pids, the leaders of pgids) has
its identity in `pid_identity` ({"<pid>": {"start": ticks after boot, "boot": boot id}}; see
core/runs/procs.py), and each torchrun the agent started is in `launches`
({"id", "attempt", "boot", "after", "t"}: the launch marker its processes carry).
"""

from __future__ import annotations

import os
import time
from typing import Any

TERMINAL = ("succeeded", "failed", "stopped")


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
