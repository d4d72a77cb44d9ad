"""Stack dumps of a running run's ranks: what each rank is doing when the run stalls.

Two ways, best first:
- py-spy (`py-spy dump --pid`), when installed: any Python program, no cooperation needed;
- the built-in trainer's own thread: touching stacks/rank<r>.request (`RunDir.stack_request`)
  makes it write every thread's Python stack (faulthandler's format) into the run's
  stacks/rank<r>.txt (`RunDir.stack_file`), which is read back from where it stood before the
  request. Not the rank's stderr: there a dump would read as a traceback, in the log view and
  to the diagnosis. No signal: faulthandler walking the threads from a signal handler crashed
  a training rank (core/train/trainer.py `_register_stack_dump`).
A hung rank is the one whose stack is not inside a collective (all_reduce, barrier, ...).

Only the user's own runs: the pids come from state.json, so a run directory that fails
core/rundir/ownership.py's rule (another user's, writable by others) is refused before any pid
is signalled or attached to (`ForeignRun`, a ValueError).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tunedeck.core.backend_traits import traits_of
from tunedeck.core.rundir import RunDir, ownership
from tunedeck.core.spec import load_spec

# frames of a rank that waits for the others. DDP's gradient all-reduce runs from C++ hooks
# inside backward, so on CPU (gloo) a rank waiting for a hung peer shows only the autograd
# engine; on a GPU collectives return at once and the wait is at the next copy to the host
# (the built-in trainer's all_reduce_result).
COLLECTIVES = (
    "all_reduce",
    "allreduce",
    "barrier",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "_sync_params",
    "_engine_run_backward",
    "run_backward",
)


@dataclass
class StackDump:
    rank: int | None
    pid: int
    method: str  # "py-spy", "faulthandler" or "none"
    text: str

    @property
    def in_collective(self) -> bool:
        return any(c in self.text for c in COLLECTIVES)

    def to_json(self) -> dict:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "method": self.method,
            "text": self.text,
            "in_collective": self.in_collective,
        }


def suspects(dumps: list[StackDump]) -> list[StackDump]:
    """Ranks not in a collective while another rank is: the ones the others wait for."""
    if not any(d.in_collective for d in dumps):
        return []
    return [d for d in dumps if not d.in_collective and d.method != "none"]


WAITING = "waiting in a collective"
SUSPECT = "NOT in a collective: the others wait for it"


def where(d: StackDump, odd: list[StackDump]) -> str:
    """The label of one rank's dump: WAITING, SUSPECT (see suspects) or nothing."""
    return WAITING if d.in_collective else SUSPECT if d in odd else ""


def rank_pids(run_dir: Path) -> dict[int, int]:
    """rank → pid of the run's live rank processes, as the agent records them."""
    state = RunDir(run_dir).read_state() or {}
    out: dict[int, int] = {}
    for rank, pid in (state.get("rank_pids") or {}).items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out[int(rank)] = pid
        except (psutil.Error, ValueError):
            continue
    return out


def dump_stacks(
    run_dir: str | Path, ranks: list[int] | None = None, timeout_s: float = 20.0
) -> list[StackDump]:
    """One dump per live rank (or per rank in `ranks`). Raises ValueError when the run has no
    live rank process (finished, stopped, or not started yet), and its `ForeignRun` when the
    run is not this user's (nothing is signalled)."""
    run_dir = Path(run_dir)
    ownership.check(run_dir)
    pids = rank_pids(run_dir)
    if ranks is not None:
        missing = sorted(set(ranks) - set(pids))
        if missing:
            raise ValueError(f"no live process for rank(s) {missing}; live: {sorted(pids)}")
        pids = {r: p for r, p in pids.items() if r in ranks}
    if not pids:
        raise ValueError(f"{run_dir.name}: no rank process is running")
    pyspy = shutil.which("py-spy")
    builtin = traits_of(_backend(run_dir)).rank_handlers
    out = []
    for rank, pid in sorted(pids.items()):
        if pyspy:
            out.append(_pyspy(pyspy, rank, pid, timeout_s))
        elif builtin:
            out.append(_faulthandler(run_dir, rank, pid, timeout_s))
        else:
            out.append(
                StackDump(
                    rank,
                    pid,
                    "none",
                    "py-spy is not installed (pip install py-spy), and only the "
                    "built-in trainer dumps its own stacks on request",
                )
            )
    return out


def _backend(run_dir: Path) -> str:
    try:
        return load_spec(RunDir(run_dir).spec).backend
    except Exception:  # an unreadable spec: do not send signals to an unknown program
        return "unknown"


def _pyspy(exe: str, rank: int, pid: int, timeout_s: float) -> StackDump:
    try:
        r = subprocess.run(
            [exe, "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return StackDump(rank, pid, "py-spy", f"py-spy did not answer within {timeout_s:.0f} s")
    text = r.stdout if r.returncode == 0 else (r.stderr or r.stdout).strip()
    if r.returncode != 0 and "ermission" in text:
        text += (
            "\n(py-spy needs ptrace rights: run as the same user with "
            "kernel.yama.ptrace_scope=0, or as root)"
        )
    return StackDump(rank, pid, "py-spy", text)


def _stopped(pid: int) -> str:
    """'stopped' or 'traced' when the process is halted (SIGSTOP, ^Z, a debugger), else ''."""
    try:
        st = psutil.Process(pid).status()
    except psutil.Error:
        return ""
    return {psutil.STATUS_STOPPED: "stopped", psutil.STATUS_TRACING_STOP: "traced"}.get(st, "")


def older_rank(rank: int, pid: int, path: Path) -> str:
    """What to do about a rank that did not answer and never made its request file: one
    started by a tunedeck that dumped its stacks on SIGUSR1."""
    return (
        f"rank {rank} did not answer: it was most likely started by an older tunedeck, "
        f"which dumps its stacks only on SIGUSR1; tunedeck no longer sends that signal "
        f"(it crashed a training rank mid-dump). Install py-spy (pip install py-spy) to "
        f"read its stacks without it, or, at that risk, `kill -USR1 {pid}` and read {path}"
    )


def _faulthandler(run_dir: Path, rank: int, pid: int, timeout_s: float) -> StackDump:
    path = RunDir(run_dir).stack_file(rank)
    # a halted rank cannot answer: say so at once rather than after the wait
    if how := _stopped(pid):
        return StackDump(
            rank,
            pid,
            "faulthandler",
            f"pid {pid} is {how} (SIGSTOP, ^Z or a debugger): it cannot answer",
        )
    try:
        start = path.stat().st_size
    except OSError:  # a trainer older than the stack file, or a rank still starting
        return StackDump(
            rank,
            pid,
            "faulthandler",
            f"no stack file {path}: the rank has not registered its handler",
        )
    request = RunDir(run_dir).stack_request(rank)
    # a rank creates its request file when it starts listening; one without it may be of
    # an older tunedeck, which answered only a signal
    listens = request.exists()
    try:
        request.touch()
    except OSError as e:
        return StackDump(rank, pid, "faulthandler", f"could not ask rank {rank}: {e}")
    # the rank's thread answers within a poll (0.25 s); wait for the dump to stop growing
    deadline, size = time.monotonic() + min(timeout_s, 5.0), start
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = path.stat().st_size
        if now > start and now == size:
            break
        size = now
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", errors="replace")
    if not text.strip():
        text = older_rank(rank, pid, path) if not listens else f"no dump appeared in {path}"
    return StackDump(rank, pid, "faulthandler", text.strip())
