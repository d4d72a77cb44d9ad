"""Create a run directory and hand the run to a detached agent.

The launching process (CLI or TUI) only writes files and starts the agent in a new session with
stdin from /dev/null and output to a file; after that it can die without touching the run.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

from tunedeck.core.backends import build_plan
from tunedeck.core.paths import runs_root
from tunedeck.core.backends.resolve import resolve
from tunedeck.core.runs.state import new_state, read_json, write_json_atomic
from tunedeck.core.spec import RunSpec


class LaunchError(RuntimeError):
    pass


def new_run_id(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()[:24] or "run"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{slug}-{secrets.token_hex(2)}"


def prepare_run(spec: RunSpec, root: Path | None = None) -> Path:
    """Resolve the spec and write spec.toml, plan.json, launch.sh and state.json."""
    root = root or runs_root()
    spec = resolve(spec)
    run_id = new_run_id(spec.name)
    run_dir = root / run_id
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "events").mkdir()
    if not spec.run.output_dir:
        spec.run.output_dir = str(run_dir / "output")
    (run_dir / "spec.toml").write_text(spec.to_toml(), encoding="utf-8")
    plan = build_plan(spec, run_dir, run_id)
    write_json_atomic(run_dir / "plan.json", plan.to_json())
    launch_sh = run_dir / "launch.sh"
    launch_sh.write_text(plan.to_shell(spec.cluster.node_rank), encoding="utf-8")
    launch_sh.chmod(0o755)
    state = new_state(run_id, spec.name, spec.train.max_steps)
    state["master_port"] = spec.cluster.master_port
    write_json_atomic(run_dir / "state.json", state)
    return run_dir


def start_agent(run_dir: Path, timeout_s: float = 20.0) -> int:
    """Start the run's agent detached; returns its pid once it has taken ownership."""
    log = open(run_dir / "logs" / "agent.log", "ab")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tunedeck.core.runs.agent", str(run_dir)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, cwd=str(run_dir))
    finally:
        log.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = read_json(run_dir / "state.json", {})
        if state.get("agent_pid") == proc.pid:
            return proc.pid
        rc = proc.poll()
        if rc is not None:
            tail = (run_dir / "logs" / "agent.log").read_text(errors="replace")[-2000:]
            raise LaunchError(f"the run agent exited at once (code {rc}):\n{tail}")
        time.sleep(0.05)
    raise LaunchError(f"the run agent did not start within {timeout_s:.0f}s; "
                      f"see {run_dir / 'logs' / 'agent.log'}")


def launch(spec: RunSpec, root: Path | None = None) -> Path:
    run_dir = prepare_run(spec, root)
    start_agent(run_dir)
    return run_dir
