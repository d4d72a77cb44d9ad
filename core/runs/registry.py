"""The registry: every run directory under the runs root, read without side effects.

Attaching is reading: the CLI and TUI only read these files, so any number of SSH sessions can
watch the same run and none of them can disturb it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunedeck.core.ingest.tail import tail_lines
from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import RunDir
from tunedeck.core.runs.state import TERMINAL, pid_alive


class RunNotFound(LookupError):
    pass


@dataclass
class RunInfo:
    run_id: str
    run_dir: Path
    name: str
    status: str
    message: str
    created: float
    started: float | None
    ended: float | None
    step: int
    max_steps: int
    loss: float | None
    tokens_per_s: float | None
    exit_code: int | None
    state: dict[str, Any] = field(repr=False)

    @property
    def run(self) -> RunDir:
        return RunDir(self.run_dir)

    @property
    def active(self) -> bool:
        return self.status not in TERMINAL

    @property
    def needs_stop(self) -> bool:
        """Not ended as far as state.json records: its processes may still be alive even
        when the agent is gone (then `status` already reads failed)."""
        return self.state.get("status") not in TERMINAL

    def age_s(self, now: float | None = None) -> float:
        return (now or time.time()) - self.created

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "name": self.name, "status": self.status,
                "message": self.message, "step": self.step, "max_steps": self.max_steps,
                "loss": self.loss, "tokens_per_s": self.tokens_per_s,
                "created": self.created, "started": self.started, "ended": self.ended,
                "exit_code": self.exit_code, "run_dir": str(self.run_dir),
                "agent_pid": self.state.get("agent_pid"),
                "torchrun_pid": self.state.get("torchrun_pid"),
                "worker_pids": self.state.get("worker_pids", []),
                "stop_requested": self.state.get("stop_requested")}


def read_run(run_dir: Path) -> RunInfo | None:
    state = RunDir(run_dir).read_state()
    if state is None or "run_id" not in state:
        return None
    status = state.get("status", "pending")
    message = state.get("message", "")
    if status not in TERMINAL and state.get("agent_pid"):
        if not pid_alive(state["agent_pid"], state.get("agent_create_time")):
            # the agent died without recording an end (host reboot, SIGKILL)
            status, message = "failed", "the run's agent is gone (killed or host restarted)"
    prog = state.get("progress") or {}
    return RunInfo(run_id=state["run_id"], run_dir=run_dir, name=state.get("name", ""),
                   status=status, message=message, created=state.get("created") or 0.0,
                   started=state.get("started"), ended=state.get("ended"),
                   step=int(prog.get("step") or 0), max_steps=int(prog.get("max_steps") or 0),
                   loss=prog.get("loss"), tokens_per_s=prog.get("tokens_per_s"),
                   exit_code=state.get("exit_code"), state=state)


def list_runs(root: Path | None = None) -> list[RunInfo]:
    """All runs, newest first."""
    root = root or runs_root()
    if not root.is_dir():
        return []
    runs = [r for d in root.iterdir() if d.is_dir() and (r := read_run(d))]
    return sorted(runs, key=lambda r: r.created, reverse=True)


def find_run(ref: str, root: Path | None = None) -> RunInfo:
    """A run by id, unique id prefix, or name (the newest run of that name)."""
    root = root or runs_root()
    direct = root / ref
    if RunDir(direct).state.exists():
        info = read_run(direct)
        if info:
            return info
    runs = list_runs(root)
    by_prefix = [r for r in runs if r.run_id.startswith(ref)]
    if len(by_prefix) == 1:
        return by_prefix[0]
    by_name = [r for r in runs if r.name == ref]
    if by_name:
        return by_name[0]
    if len(by_prefix) > 1:
        ids = ", ".join(r.run_id for r in by_prefix[:5])
        raise RunNotFound(f"{ref!r} matches several runs: {ids}")
    raise RunNotFound(f"no run {ref!r} under {root}")


def log_tail(run_dir: Path, rank: int = 0, n: int = 200) -> list[str]:
    """The last lines a rank wrote (stdout, then stderr), without reading whole files."""
    out: list[str] = []
    for p in RunDir(run_dir).rank_log_files(rank):
        out.extend(tail_lines(p, n))
    return out[-n:]
