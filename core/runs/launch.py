"""Create a run directory and hand the run to a detached agent.

The launching process (CLI or TUI) only writes files and starts the agent in a new session with
stdin from /dev/null and output to a file; after that it can die without touching the run.

A run is its owner's only: the run directory is 0700, every file written here 0600 (launch.sh
0700), secrets are masked in spec.toml, plan.json and launch.sh and kept real only in the 0600
secrets.json (tunedeck.core.rundir.secrets), and the agent starts with umask 077 so that what it,
torchrun and the ranks create (logs, run.db, events, checkpoints) is private too.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tunedeck.core.backends import plan_run
from tunedeck.core.nodes.roster import place, roster_problems
from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import FILE_MODE, RunDir, write_json_atomic, write_text_private
from tunedeck.core.rundir.secrets import split_secrets, write_secrets
from tunedeck.core.runs.state import new_state
from tunedeck.core.spec import RunSpec


# what the agent and every process it starts create is their owner's only
AGENT_UMASK = 0o077


class LaunchError(RuntimeError):
    pass


def new_run_id(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()[:24] or "run"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{slug}-{secrets.token_hex(2)}"


def prepare_run(spec: RunSpec, root: Path | None = None,
                preflight: dict[str, Any] | None = None) -> Path:
    """Resolve and plan the spec (raises ValueError before anything is written when it
    cannot run), then write spec.toml, plan.json, launch.sh and state.json. `preflight`: the
    gate's record (core.preflight.gate_record), kept in state.json so a run launched over a
    failed check says so for good."""
    run = RunDir((root or runs_root()) / new_run_id(spec.name))
    spec, plan = plan_run(spec, run)
    if spec.cluster.nnodes > 1:
        problems = roster_problems(spec)
        if problems:
            raise ValueError("; ".join(problems))
        place(spec, plan)      # per node: host, GPUs, interface, c10d host and address
    saved, plan_json, hidden = split_secrets(spec, plan)
    run.create()
    write_secrets(run, hidden)
    write_text_private(run.spec, saved.to_toml())
    write_json_atomic(run.plan, plan_json)
    write_text_private(run.launch_sh, plan.to_shell(spec.cluster.node_rank), mode=0o700)
    state = new_state(run.run_id, spec.name, spec.train.max_steps)
    state["master_port"] = spec.cluster.master_port
    if preflight is not None:
        state["preflight"] = preflight
    run.write_state(state)
    return run.path


def start_agent(run_dir: Path, timeout_s: float = 20.0) -> int:
    """Start the run's agent detached; returns its pid once it has taken ownership."""
    run = RunDir(run_dir)
    log = os.open(run.agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tunedeck.core.runs.agent", str(run.path)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, cwd=str(run.path), umask=AGENT_UMASK)
    finally:
        os.close(log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run.read_state() or {}).get("agent_pid") == proc.pid:
            return proc.pid
        rc = proc.poll()
        if rc is not None:
            tail = run.agent_log.read_text(errors="replace")[-2000:]
            raise LaunchError(f"the run agent exited at once (code {rc}):\n{tail}")
        time.sleep(0.05)
    raise LaunchError(f"the run agent did not start within {timeout_s:.0f}s; "
                      f"see {run.agent_log}")


def launch(spec: RunSpec, root: Path | None = None,
           preflight: dict[str, Any] | None = None) -> Path:
    run_dir = prepare_run(spec, root, preflight)
    if spec.cluster.launcher == "slurm":
        submit_slurm(run_dir, spec)
    else:
        start_agent(run_dir)
    return run_dir


def submit_slurm(run_dir: Path, spec: RunSpec) -> str:
    """Hand the run to Slurm: one agent per node once the job starts (tunedeck.core.nodes.slurm).
    Until then the run is pending, and state.json names the job."""
    from tunedeck.core.nodes.slurm import SlurmError, release, submit, write_script

    run = RunDir(run_dir)
    try:
        from tunedeck.core.spec import load_spec

        spec = load_spec(run.spec)         # resolved: processes per node, ports
        job = submit(write_script(spec, run))
    except SlurmError as e:
        st = run.read_state() or {}
        st.update(status="failed", ended=time.time(), message=str(e))
        run.write_state(st)
        raise LaunchError(str(e)) from None
    st = run.read_state() or {}
    st.update(slurm_job=job, message=f"queued in Slurm as job {job}")
    run.write_state(st)
    try:
        release(job)
    except SlurmError as e:
        from tunedeck.core.nodes.slurm import cancel

        cancel(job, graceful=False)
        st.update(status="failed", ended=time.time(), message=str(e))
        run.write_state(st)
        raise LaunchError(str(e)) from None
    return job
