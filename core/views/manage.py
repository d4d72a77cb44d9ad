"""Managing runs that are over: delete a run's records, find its newest complete checkpoint,
and the specs that clone or resume it. Headless: the runs screen calls these from its thread
workers, and the messages of `ManageError` are written for the user.

Deleting is the one irreversible thing tunedeck does, so it comes in two parts:

- the records (spec.toml, plan.json, launch.sh, state.json, run.db, logs/, events/ and whatever
  else lies in the run directory) go with `delete_run(run)`;
- the output folder (checkpoints, adapters, merged weights), which by default lies *inside* the
  run directory (`<run>/output`), stays unless the caller names it again:
  `delete_run(run, outputs=<that folder>)`, after the user confirmed that folder by name.

Neither happens while any process of the run is alive (`live_reason`), and the outputs never go
while another run writes to the same folder (a resumed run shares its source's output folder).
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomllib
from tunedeck.core.backends import BACKENDS
from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import (
    Checkpoint,
    complete_checkpoints,
    newest_checkpoint,
)
from tunedeck.core.rundir.secrets import read_secrets
from tunedeck.core.supervisor import procs
from tunedeck.core.supervisor.launch import ABANDONED_S, writes_now
from tunedeck.core.views.registry import RunInfo, list_runs, read_run
from tunedeck.core.views.doctor import cut_short
from tunedeck.core.store.state import TERMINAL, pid_alive
from tunedeck.core.spec import RunSpec, SpecError, load_spec

RESUMABLE = ("stopped", "failed")
# An agent records its run's end and then exits (closing run.db and its trackers): a tenth
# of a second on a loaded 2-core machine. A run whose end is recorded but whose agent (or
# any other process) still lives is looked at again this long before it is refused.
ENDING_S = 5.0
# ABANDONED_S (core/supervisor/launch.py): a run still "pending" with no agent this long after it was
# written never started (its launch failed before the agent took over): it may be deleted.


class ManageError(ValueError):
    """Refused or impossible; the message says why."""


# -- a run as it is now ----------------------------------------------------------------------


def current(run: RunInfo) -> RunInfo:
    """The run as its state.json says now. A viewer's RunInfo is its last look (the runs list
    reads once a second, later on a busy machine): a run whose end was recorded since must not
    be refused as running, nor a run that came back to life (adopted) be acted on as ended."""
    return read_run(run.run_dir) or run


def settled(run: RunInfo, wait_s: float | None = None) -> tuple[RunInfo, str | None]:
    """`current(run)` and why it must not be touched (`live_reason`), after waiting up to
    `wait_s` (ENDING_S) for the processes of a run whose end is recorded to be gone."""
    wait = ENDING_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait
    while True:
        run = current(run)
        why = live_reason(run)
        ended = run.status in TERMINAL and run.state.get("status") in TERMINAL
        if why is None or not ended:
            return run, why
        if time.monotonic() >= deadline:
            return run, f"{why} {wait:g}s after its end was recorded"
        time.sleep(0.05)


# -- a run's frozen spec and its folders -----------------------------------------------------


def frozen_spec(run: RunInfo) -> RunSpec:
    """The spec the run was launched with (spec.toml, resolved at launch), with the real
    values of its secrets (spec.toml holds them masked; secrets.json, 0600, holds them)."""
    path = run.run.spec
    if not path.is_file():
        raise ManageError(f"{run.run_id} has no spec.toml ({path})")
    try:
        spec = load_spec(path)
    except SpecError as e:
        raise ManageError(f"{run.run_id}'s spec.toml does not load any more: {e}") from None
    if why := cut_short(run.run, spec.backend):
        raise ManageError(
            f"{run.run_id}'s spec.toml is damaged ({why}): its lost settings "
            f"would come back as defaults; see `tunedeck doctor {run.run_id}`"
        )
    return read_secrets(run.run).unmask_spec(spec)


def run_output_dir(run: RunInfo) -> Path:
    """Where the run wrote checkpoints. Read leniently from spec.toml, so a run whose spec no
    longer validates can still be deleted with its outputs kept."""
    try:
        raw = tomllib.loads(run.run.spec.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        raw = {}
    value = (raw.get("run") or {}).get("output_dir") if isinstance(raw.get("run"), dict) else ""
    spec = RunSpec()
    spec.run.output_dir = value if isinstance(value, str) else ""
    out = run.run.output_dir(spec)
    # the agent and the ranks run in the run directory: a relative folder is relative to it
    return out if out.is_absolute() else run.run_dir / out


def _single_node_port(spec: RunSpec) -> None:
    # A single-node launch picked a free port then; that port may be taken now. Multi-node
    # ports are the user's (every node must know it), so they stay.
    if spec.cluster.nnodes == 1:
        spec.cluster.master_port = 0


# -- clone and resume ------------------------------------------------------------------------


@dataclass
class SpecFor:
    """A spec built from a run, and what the user should know about it."""

    spec: RunSpec
    notes: list[str] = field(default_factory=list)
    checkpoint: Checkpoint | None = None


def clone_spec(run: RunInfo) -> SpecFor:
    """The run's frozen spec as a new run: fresh start, its own output folder. Refuses a run
    that has not ended (a clone copies an ended run's spec; the launch would refuse its output
    folder anyway when it is the live run's own)."""
    run = current(run)
    if writes_now(run):
        raise ManageError(
            f"{run.run_id} is {run.status}: a clone copies an ended run's spec; "
            "stop it first (or wait for its end), then clone it"
        )
    spec = copy.deepcopy(frozen_spec(run))
    notes = []
    if spec.train.resume_from:
        notes.append(
            f"train.resume_from ({spec.train.resume_from}) cleared: a clone starts from step 0"
        )
        spec.train.resume_from = ""
    if run_output_dir(run).resolve() == run.run.output_dir(RunSpec()).resolve():
        spec.run.output_dir = ""  # the new run gets <its run dir>/output
    elif spec.run.output_dir:
        notes.append(
            f"run.output_dir is still {spec.run.output_dir}, the folder {run.run_id} "
            "wrote to: change it to keep the two runs' checkpoints apart"
        )
    _single_node_port(spec)
    return SpecFor(spec, notes)


def resume_spec(run: RunInfo) -> SpecFor:
    """The run's frozen spec continued from its newest complete checkpoint, writing to the same
    output folder. Refuses a run that is not stopped/failed or has no complete checkpoint.
    Judged on the run as it is now (`settled`), not as `run` was read."""
    run, why = settled(run)
    if run.status not in RESUMABLE:
        what = (
            "still running: it resumes by itself on a restart"
            if run.active
            else "finished all its steps: clone it (c) to train further"
        )
        raise ManageError(f"{run.run_id} is {run.status}; {what}")
    if why:  # ranks of a run whose agent died would write into the same folder
        raise ManageError(f"{why}: stop it before resuming it")
    spec = copy.deepcopy(frozen_spec(run))
    out = run_output_dir(run)
    ckpt = newest_checkpoint(out)
    if ckpt is None:
        raise ManageError(
            f"{run.run_id} has no complete checkpoint in {out}: nothing to resume "
            "from (set train.save_steps so the next run writes some)"
        )
    spec.train.resume_from = str(ckpt.path)
    spec.run.output_dir = str(out)
    _single_node_port(spec)
    notes = []
    backend = BACKENDS.get(spec.backend)
    if backend and backend.resume_var:
        notes.append(
            f"the script is told {backend.resume_var}={ckpt.path}; it resumes only if it reads it"
        )
    if spec.train.max_steps and ckpt.step >= spec.train.max_steps:
        notes.append(
            f"checkpoint-{ckpt.step} is already at train.max_steps "
            f"({spec.train.max_steps}): raise it to train further"
        )
    return SpecFor(spec, notes, ckpt)


# -- delete ----------------------------------------------------------------------------------


def live_reason(run: RunInfo) -> str | None:
    """Why the run must not be touched, or None when nothing of it is alive."""
    st = run.state
    abandoned = (
        run.status == "pending"
        and not st.get("agent_pid")
        and time.time() - run.created > ABANDONED_S
    )
    if run.active and not abandoned:
        return f"{run.run_id} is {run.status}"
    if pid_alive(st.get("agent_pid"), st.get("agent_create_time")):
        return f"{run.run_id}'s agent (pid {st['agent_pid']}) is still alive"
    for pid in [st.get("torchrun_pid"), *(st.get("worker_pids") or [])]:
        if pid_alive(pid):
            return f"process {pid} of {run.run_id} is still alive"
    if st.get("status") not in TERMINAL:
        # the agent died without recording an end: its ranks may live on, marked by run id
        alive = procs.marked_processes(run.run_id)
        if alive:
            return f"process {alive[0].pid} of {run.run_id} is still alive (stop it first)"
    return None


@dataclass
class DeletePlan:
    """What `delete_run` would remove and keep. `output_dir` is set when the output folder
    exists; `outputs_kept_because` is set when it may not be deleted at all."""

    run_id: str
    run_dir: Path
    records: list[Path]
    output_dir: Path | None
    checkpoints: int = 0
    outputs_kept_because: str = ""
    status: str = ""  # the run's status as judged when planning (its state.json then)

    @property
    def outputs_deletable(self) -> bool:
        return self.output_dir is not None and not self.outputs_kept_because


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _never_delete(out: Path, run_dir: Path, root: Path) -> str:
    """Why the output folder is not one we may delete, or ''."""
    for name, guarded in (
        ("the runs root", root),
        ("your home folder", Path.home()),
        ("this run's own directory", run_dir),
    ):
        if _within(guarded.resolve(), out):
            return f"it is or holds {name}"
    if out.parent == out:
        return "it is a filesystem root"
    return ""


def plan_delete(run: RunInfo, root: Path | None = None) -> DeletePlan:
    """Raises ManageError while the run is alive (as it is now: `settled`)."""
    run, why = settled(run)
    if why:
        raise ManageError(f"{why}: stop it before deleting it")
    root = Path(root or runs_root())
    run_dir = run.run_dir.resolve()
    out = run_output_dir(run).resolve()
    if _within(run_dir, out):
        # outputs in the run directory itself (or above it): only tunedeck's own files go
        rd = RunDir(run_dir)
        named = [
            rd.spec,
            rd.plan,
            rd.launch_sh,
            rd.state,
            rd.stop_request,
            rd.db,
            rd.db.with_name("run.db-wal"),
            rd.db.with_name("run.db-shm"),
            rd.logs,
            rd.events,
        ]
        records = [p for p in named if os.path.lexists(p)]
    else:
        records = sorted(p for p in run_dir.iterdir() if not _within(out, p))
    plan = DeletePlan(
        run.run_id, run_dir, records, out if out.is_dir() else None, status=run.status
    )
    if plan.output_dir is None:
        return plan
    plan.checkpoints = len(complete_checkpoints(out))
    plan.outputs_kept_because = _never_delete(out, run_dir, root)
    if not plan.outputs_kept_because:
        for other in list_runs(root):
            if other.run_id == run.run_id:
                continue
            theirs = run_output_dir(other).resolve()
            if _within(theirs, out) or _within(out, theirs):
                plan.outputs_kept_because = f"run {other.run_id} uses it too"
                break
    return plan


@dataclass
class DeleteResult:
    removed: list[Path]
    kept: Path | None  # the output folder when it stays


def delete_run(run: RunInfo, outputs: Path | None = None, root: Path | None = None) -> DeleteResult:
    """Delete the run's records, and its output folder only when `outputs` names that folder
    (the caller confirmed it with the user). Checks again that nothing of the run is alive."""
    plan = plan_delete(run, root)
    if outputs is not None:
        if plan.output_dir is None or Path(outputs).resolve() != plan.output_dir:
            raise ManageError(
                f"{outputs} is not the output folder of {run.run_id} "
                f"({plan.output_dir or 'none on disk'}); nothing deleted"
            )
        if plan.outputs_kept_because:
            raise ManageError(
                f"{plan.output_dir} is not deleted: {plan.outputs_kept_because}; nothing deleted"
            )
    rd = RunDir(plan.run_dir)
    removed = []
    # state.json first: the run leaves every listing at once, and a crash halfway leaves no
    # run that looks whole
    for p in sorted(plan.records, key=lambda p: p != rd.state):
        _remove(p)
        removed.append(p)
    kept = plan.output_dir
    if outputs is not None and plan.output_dir is not None:
        # renamed first, as the trainer's rotation does: never a half-deleted checkpoint folder
        # that still looks complete
        trash = plan.output_dir.with_name(f".deleting-{plan.output_dir.name}")
        shutil.rmtree(trash, ignore_errors=True)  # left by an earlier, interrupted delete
        os.rename(plan.output_dir, trash)
        shutil.rmtree(trash)
        removed.append(plan.output_dir)
        kept = None
    try:
        plan.run_dir.rmdir()  # only when empty: kept outputs inside keep the folder
    except OSError:
        pass
    return DeleteResult(removed, kept)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
