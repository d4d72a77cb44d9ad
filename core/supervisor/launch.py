"""Create a run directory and hand the run to a detached agent.

The launching process (CLI or TUI) only writes files and starts the agent in a new session with
stdin from /dev/null and output to a file; after that it can die without touching the run.

A run is its owner's only: the run directory is 0700, every file written here 0600 (launch.sh
0700), secrets are masked in spec.toml, plan.json and launch.sh and kept real only in the 0600
secrets.json (tunedeck.core.rundir.secrets), and the agent starts with umask 077 so that what it,
torchrun and the ranks create (logs, run.db, events, checkpoints) is private too.

One live writer per output folder. Two runs writing one folder mix their checkpoints, and each
one's rotation deletes the other's, so a launch (and resume and clone, which launch) refuses an
output folder that a live run of this home writes (`OutputShared`): the same folder, one inside
the other, compared as resolved real paths; a run is live while its state.json does not record
an end (read through the registry). The check is made under an exclusive lock, an flock on
`runs.launch.lock` beside the runs root (`launch_lock`; beside it, not in it, where every entry is
a run), held while checking, writing the run directory and starting the agent (or submitting the
Slurm job), so of two launches started at the same moment the second sees the first. A launch
killed in between leaves a pending run without an agent, which holds its folder for
`ABANDONED_S`. `share_output=True` (`--share-output`) launches anyway and records the runs it
shares with in state.json `output_shared_with`.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Iterator

import tomllib
from tunedeck.core.backends import BACKENDS, plan_run
from tunedeck.core.paths import runs_root
from tunedeck.core.queue.wait import queue_record
from tunedeck.core.rundir import (
    FILE_MODE,
    TERMINAL,
    RunDir,
    write_json_atomic,
    write_text_private,
)
from tunedeck.core.rundir.secrets import split_secrets, write_secrets
from tunedeck.core.store.state import new_state
from tunedeck.core.spec import RunSpec
from tunedeck.core.supervisor import procs

if TYPE_CHECKING:
    from tunedeck.core.views.registry import Registry, RunInfo


# what the agent and every process it starts create is their owner's only
AGENT_UMASK = 0o077
LOCK_SUFFIX = ".launch.lock"  # <runs root>.launch.lock: $TUNEDECK_HOME/runs.launch.lock
LOCK_WAIT_S = 120.0  # another launch holds it while its agent starts
# A run still "pending" with no agent (and no Slurm job) this long after it was written never
# started: its launch died before the agent took over. It writes nothing.
ABANDONED_S = 300.0


class LaunchError(RuntimeError):
    pass


class OutputShared(LaunchError):
    """The output folder is one a live run writes; `users` are those runs (with the folder
    each writes)."""

    def __init__(self, folder: Path, users: list[tuple[RunInfo, Path]]):
        self.folder, self.users = folder, users
        said = []
        for run, theirs in users:
            who = f"live run {run.run_id} ({run.name}, {run.status})"
            said.append(
                f"{who} writes it"
                if theirs == folder
                else f"it lies inside {theirs}, which {who} writes"
                if theirs in folder.parents
                else f"it holds {theirs}, which {who} writes"
            )
        super().__init__(
            f"output folder {folder} is in use: {'; '.join(said)}. Two runs in one folder mix "
            "their checkpoints and delete each other's. Stop that run first, or give this one "
            "a folder of its own (--set run.output_dir=PATH), or launch with --share-output "
            "to share it anyway (the new run's state.json records it)"
        )


# -- one live writer per output folder ------------------------------------------------------


def written_folder(spec: RunSpec, run: RunDir) -> Path:
    """The folder a run of `spec` in `run` writes its checkpoints into, as a resolved real
    path: `RunDir.output_dir(spec)`, or for ms-swift an `--output_dir` the user put in
    swift.extra_args (it wins over tunedeck's). ms-swift writes under it, into
    `v<N>-<date>/` folders that each run numbers by listing it, and a restart resumes from the
    newest checkpoint anywhere below it: the whole folder is the run's. A relative folder is
    relative to the run directory (the ranks' working directory)."""
    backend = BACKENDS.get(spec.backend)
    own = backend.user_output_dir(spec) if backend else None
    out = Path(own).expanduser() if own else run.output_dir(spec)
    if not out.is_absolute():
        out = run.path / out
    return Path(os.path.realpath(out))


def run_written_folder(run: RunDir) -> Path:
    """`written_folder` of an existing run, from its spec.toml read leniently (a spec that no
    longer validates still names its folder; none readable: `<run>/output`)."""
    try:
        raw = tomllib.loads(run.spec.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        raw = {}
    spec = RunSpec()
    backend = raw.get("backend")
    spec.backend = backend if isinstance(backend, str) else spec.backend
    section = raw.get("run") if isinstance(raw.get("run"), dict) else {}
    value = section.get("output_dir")
    spec.run.output_dir = value if isinstance(value, str) else ""
    swift = raw.get("swift") if isinstance(raw.get("swift"), dict) else {}
    extra = swift.get("extra_args")
    if isinstance(extra, list):
        spec.swift.extra_args = [str(w) for w in extra]
    return written_folder(spec, run)


def writes_now(run: RunInfo, now: float | None = None) -> bool:
    """The run may write into its output folder now or later: its state.json records no end
    and the reader found none (pending, running, lost; another user's run in a shared home
    as its state.json says), unless it is damaged (nothing it says can be trusted) or was
    abandoned before its agent started."""
    st = run.state
    recorded = st.get("status", "pending")
    if run.damaged or run.status in TERMINAL or recorded in TERMINAL:
        return False
    abandoned = (
        recorded == "pending"
        and not st.get("agent_pid")
        and not st.get("slurm_job")
        and (now or time.time()) - run.created > ABANDONED_S
    )
    return not abandoned


def _nested(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


# One incremental registry per runs root, used only under `launch_lock`: `scan(full=True)`
# lists the same runs as `list_runs` (every state.json stat'ed, read again only when it
# changed), so a launch among thousands of finished runs costs stats, not JSON reads.
_registries: dict[str, Registry] = {}


def output_users(
    folder: Path, root: Path | None = None, exclude: str = ""
) -> list[tuple[RunInfo, Path]]:
    """The live runs under `root` whose output folder is `folder` (resolved), lies inside it
    or holds it, each with its folder."""
    from tunedeck.core.views.registry import Registry  # registry → adopt → this module

    root = Path(root or runs_root())
    users = []
    with launch_lock(root):
        registry = _registries.setdefault(str(root.resolve()), Registry(root))
        runs = registry.scan(full=True)
    for other in runs:
        if other.run_id == exclude or not writes_now(other):
            continue
        theirs = run_written_folder(other.run)
        if _nested(folder, theirs):
            users.append((other, theirs))
    return users


_held = threading.local()


def lock_path(root: Path) -> Path:
    """The launch lock of a runs root: a file beside it (`runs.launch.lock`)."""
    root = Path(root).resolve()
    return root.with_name(root.name + LOCK_SUFFIX)


@contextmanager
def launch_lock(root: Path | None = None, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """The launches of one runs root, one at a time: an exclusive flock on `lock_path(root)`
    (across processes, and across threads of one process: each takes its own open file).
    Re-entrant within a thread, so `launch` holds it over `prepare_run`, which takes it too
    for its callers that call it alone."""
    root = Path(root or runs_root())
    key = str(root.resolve())
    depth = getattr(_held, "roots", None)
    if depth is None:
        depth = _held.roots = {}
    if depth.get(key):
        depth[key] += 1
        try:
            yield
        finally:
            depth[key] -= 1
        return
    path = lock_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except PermissionError:  # another user's (a shared home): a shared lock still works
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"another launch has held {path} for {wait_s:.0f}s; "
                        "try again (or see which tunedeck process holds it)"
                    )
                time.sleep(0.05)
            except OSError as e:
                raise LaunchError(
                    f"cannot lock {path} ({e.strerror}): launches of this home "
                    "take it to check that no live run writes their output "
                    "folder"
                ) from None
        depth[key] = 1
        try:
            yield
        finally:
            depth.pop(key, None)
    finally:
        os.close(fd)  # releases the flock


def new_run_id(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()[:24] or "run"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{slug}-{secrets.token_hex(2)}"


def prepare_run(
    spec: RunSpec,
    root: Path | None = None,
    preflight: dict[str, Any] | None = None,
    share_output: bool = False,
    sweep: dict[str, Any] | None = None,
    agent_follows: bool = False,
) -> Path:
    """Resolve and plan the spec (raises ValueError before anything is written when it
    cannot run), then write spec.toml, plan.json, launch.sh and state.json. `agent_follows`:
    this process starts the run's agent next (state.json names it, so that a stop meanwhile
    waits for that agent rather than for nothing). `preflight`: the
    gate's record (core.preflight.gate_record), kept in state.json so a run launched over a
    failed check says so for good. Raises `OutputShared` when a live run writes the output
    folder, unless `share_output` (then state.json `output_shared_with` names those runs)."""
    root = Path(root or runs_root())
    run = RunDir(root / new_run_id(spec.name))
    spec, plan = plan_run(spec, run)  # placed per node: host, GPUs, interface, c10d flags
    saved, plan_json, hidden = split_secrets(spec, plan)
    with launch_lock(root):
        # checked at the last moment, under the lock: a launch that gets it later sees this
        # run's state.json, written below
        folder = written_folder(spec, run)
        users = output_users(folder, root, exclude=run.run_id)
        if users and not share_output:
            raise OutputShared(folder, users)
        _write_run(
            run,
            spec,
            plan,
            saved,
            plan_json,
            hidden,
            preflight,
            [u.run_id for u, _ in users] if share_output else None,
            sweep,
            agent_follows,
        )
    return run.path


def _write_run(
    run: RunDir,
    spec: RunSpec,
    plan,
    saved: RunSpec,
    plan_json: dict,
    hidden: dict,
    preflight: dict[str, Any] | None,
    shared_with: list[str] | None,
    sweep: dict[str, Any] | None = None,
    agent_follows: bool = False,
) -> None:
    run.create()
    write_secrets(run, hidden)
    write_text_private(run.spec, saved.to_toml())
    write_json_atomic(run.plan, plan_json)
    write_text_private(run.launch_sh, plan.to_shell(spec.cluster.node_rank), mode=0o700)
    state = new_state(run.run_id, spec.name, spec.train.max_steps)
    state["master_port"] = spec.cluster.master_port
    if agent_follows:
        state["launcher"] = {"pid": os.getpid(), **(procs.identity(os.getpid()) or {})}
    c = spec.cluster
    if c.nnodes > 1 and c.launcher != "slurm":  # a Slurm node records its own as it starts
        from tunedeck.core.nodes.iface import record

        mine = next((n for n in plan.nodes if n.node_rank == c.node_rank), plan.nodes[0])
        state["net"] = record(c.master_addr, mine.env, c.dist_backend)
    if preflight is not None:
        state["preflight"] = preflight
    if shared_with is not None:  # --share-output: the live runs it shares the folder with
        state["output_shared_with"] = shared_with
    if spec.run.queue:  # its agent waits for its turn (core/queue); a sweep's runs, K at a time
        group = sweep["id"] if sweep else ""
        state.update(
            status="queued", queue=queue_record(spec, group, (sweep or {}).get("parallel", 0))
        )
    if sweep is not None:
        state["sweep"] = {k: v for k, v in sweep.items() if k != "parallel"}
    run.write_state(state)


def shared_with(run_dir: Path) -> list[str] | None:
    """The runs a run was launched to share its output folder with (`--share-output`), or
    None when it was not."""
    value = (RunDir(run_dir).read_state() or {}).get("output_shared_with")
    return [str(v) for v in value] if isinstance(value, list) else None


def start_agent(run_dir: Path, timeout_s: float = 20.0) -> int:
    """Start the run's agent detached; returns its pid once it has taken ownership."""
    run = RunDir(run_dir)
    log = os.open(run.agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tunedeck.core.supervisor.agent", str(run.path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=str(run.path),
            umask=AGENT_UMASK,
        )
    finally:
        os.close(log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run.read_state() or {}).get("agent_pid") == proc.pid:
            return proc.pid
        rc = proc.poll()
        if rc is not None:
            tail = run.agent_log.read_text(errors="replace")[-2000:]
            _never_started(run, f"the run agent exited at once (code {rc})")
            raise LaunchError(f"the run agent exited at once (code {rc}):\n{tail}")
        time.sleep(0.05)
    raise LaunchError(f"the run agent did not start within {timeout_s:.0f}s; see {run.agent_log}")


def _never_started(run: RunDir, why: str) -> None:
    """The agent died before taking the run: record the end, so the run does not stay
    pending (and holding its output folder) with no one to end it."""
    st = run.read_state() or {}
    if st.get("status") == "pending" and not st.get("agent_pid"):
        st.update(status="failed", ended=time.time(), message=why)
        run.write_state(st)


def launch(
    spec: RunSpec,
    root: Path | None = None,
    preflight: dict[str, Any] | None = None,
    share_output: bool = False,
    sweep: dict[str, Any] | None = None,
) -> Path:
    """Write the run directory and start its agent (or submit it to Slurm), all under
    `launch_lock`: the output folder check, the run's state.json and its owner come into
    being before the next launch of this home looks. `OutputShared` when a live run writes
    the output folder and not `share_output`."""
    root = Path(root or runs_root())
    with launch_lock(root):
        run_dir = prepare_run(
            spec, root, preflight, share_output=share_output, sweep=sweep, agent_follows=True
        )
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

        spec = load_spec(run.spec)  # resolved: processes per node, ports
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
