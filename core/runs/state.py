"""state.json: what a run is doing, written atomically by the run's agent.

Readers never see a half-written file (write to a temp file, fsync, rename). Only the agent
writes it while it lives; the CLI writes it only to mark a run whose agent is gone.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

TERMINAL = ("succeeded", "failed", "stopped")


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path, default: Any = None) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return default


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
