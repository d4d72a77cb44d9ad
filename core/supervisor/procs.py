"""Finding and ending every process of a run, and only those.

A pid or a process group number in state.json is a claim about the past: after the process
ends (or the host reboots) the kernel hands the number to someone else. So every pid the run
records is stored with its identity, and nothing is ever signalled on a number alone:

    state["pid_identity"] = {"<pid>": {"start": <ticks>, "boot": "<boot id>"}, ...}

`start` is the process's start time in clock ticks after boot (field 22 of /proc/<pid>/stat:
exact, unlike a float create time), `boot` the kernel's /proc/sys/kernel/random/boot_id. A pid
is ours while a process with that pid, that start time and that boot id exists. A process
group is signalled only when its leader (the process whose pid is the group number) is ours,
or when it was read from a live process that is ours (a group number cannot be reused while a
member lives).

torchrun starts each rank in its own session, so one killpg does not reach them all. A run's
processes are found three ways: the recorded process groups and pids (by identity), the live
descendants of torchrun (by identity), and a sweep for the run's launch marker in process
environments (which finds ranks orphaned by a dead agent and their DataLoader workers). The
marker is TUNEDECK_RUN_ID=<run id> together with TUNEDECK_LAUNCH_ID=<one of the run's
launches>: the launch id is made by the agent for each torchrun it starts and recorded in
state.json `launches` (with the boot and torchrun's start time) before torchrun starts; it is
never in a spec, plan.json or launch.sh. A process that merely claims the run id (a spec or a
shell that set TUNEDECK_RUN_ID, a launch.sh replayed by hand) is not the run's and is never
killed by its stop.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any
from collections.abc import Iterable

import psutil

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
RUN_ID_ENV = "TUNEDECK_RUN_ID"
LAUNCH_ID_ENV = "TUNEDECK_LAUNCH_ID"

_boot: str | None = None


# -- identity -------------------------------------------------------------------------------


def boot_id() -> str:
    """This boot's id ("" where the kernel has none: then start times alone identify)."""
    global _boot
    if _boot is None:
        try:
            with open(BOOT_ID_PATH, encoding="ascii") as f:
                _boot = f.read().strip()
        except OSError:
            _boot = ""
    return _boot


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks after boot; None when it is gone, a zombie
    (it holds nothing but its pid), or unreadable."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            raw = f.read()
    except (OSError, ValueError):
        return None
    # the command name (field 2) may hold spaces and ')': the fields after the last ')'
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        if rest[0] in (b"Z", b"X"):
            return None
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def identity(pid: int | None) -> dict[str, Any] | None:
    """{"start", "boot"} of a live process, None when it is gone."""
    if not pid:
        return None
    ticks = start_ticks(pid)
    return None if ticks is None else {"start": ticks, "boot": boot_id()}


def same_process(pid: int | None, ident: dict[str, Any] | None) -> bool:
    """True while `pid` is the process `ident` was taken from (same boot, same start)."""
    if not pid or not isinstance(ident, dict):
        return False
    if ident.get("boot", "") != boot_id():
        return False
    ticks = start_ticks(pid)
    return ticks is not None and ticks == ident.get("start")


def recorded_identity(state: dict[str, Any], pid: int | None) -> dict[str, Any] | None:
    table = state.get("pid_identity")
    if not pid or not isinstance(table, dict):
        return None
    ident = table.get(str(pid))
    return ident if isinstance(ident, dict) else None


def is_ours(state: dict[str, Any], pid: int | None) -> bool:
    """`pid` is alive and is the very process the run recorded under that number."""
    return same_process(pid, recorded_identity(state, pid))


def ours(state: dict[str, Any], pids: Iterable[int | None]) -> list[int]:
    return [p for p in dict.fromkeys(pids) if p and is_ours(state, p)]


def live_processes(state: dict[str, Any]) -> list[int]:
    """The run's recorded torchrun and rank processes that are alive by identity (cheap: a
    few /proc reads; no sweep of the process table)."""
    pids = [state.get("torchrun_pid"), *(state.get("worker_pids") or [])]
    pids += [p for p in (state.get("rank_pids") or {}).values()]
    return ours(state, [p for p in pids if isinstance(p, int)])


def owner_alive(state: dict[str, Any]) -> bool | None:
    """Is the run's agent alive? True/False, or None when this host cannot tell (the run
    was recorded on another host: its pids mean nothing here)."""
    pid = state.get("agent_pid")
    if not pid:
        return False
    ident = recorded_identity(state, pid)
    if ident is not None:
        if ident.get("boot", "") != boot_id():
            return None if state.get("host") != os.uname().nodename else False
        return same_process(pid, ident)
    from tunedeck.core.store.state import pid_alive  # a run recorded before identities

    return pid_alive(pid, state.get("agent_create_time"))


# -- the launch marker ----------------------------------------------------------------------


def launch_matches(state: dict[str, Any], env: dict[str, str], start: int | None) -> bool:
    """A process environment carries this run's marker and one of its launch ids, and the
    process started in that launch's boot, no earlier than that launch's torchrun."""
    if env.get(RUN_ID_ENV) != state.get("run_id") or start is None:
        return False
    lid = env.get(LAUNCH_ID_ENV)
    for launch in state.get("launches") or []:
        if isinstance(launch, dict) and lid and launch.get("id") == lid:
            if launch.get("boot", "") != boot_id():
                return False
            return start >= int(launch.get("after") or 0)
    return False


def marked_processes(run_id: str, exclude: set[int] | None = None) -> list[psutil.Process]:
    """Processes whose environment carries TUNEDECK_RUN_ID=run_id, whoever started them
    (tests and the soak use it to prove nothing of a run is left; `kill_run` kills only
    those of `run_processes`)."""
    exclude = exclude or set()
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid"]):
        if p.pid in exclude or p.pid == me:
            continue
        try:
            if p.environ().get(RUN_ID_ENV) == run_id:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def launched_processes(
    state: dict[str, Any], exclude: set[int] | None = None
) -> list[psutil.Process]:
    """Processes carrying one of the run's launch markers (`launch_matches`)."""
    if not state.get("launches"):
        return []
    return [p for p in marked_processes(str(state.get("run_id")), exclude) if _launch_ok(state, p)]


def _launch_ok(state: dict[str, Any], p: psutil.Process) -> bool:
    try:
        return launch_matches(state, p.environ(), start_ticks(p.pid))
    except (psutil.Error, OSError):
        return False


# -- signals --------------------------------------------------------------------------------


def signal_pids(pids, sig: int) -> None:
    """Signal pids as they are: only for pids just checked (`ours`) or known children."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_ours(state: dict[str, Any], pids, sig: int) -> list[int]:
    """Signal those of `pids` that are still the run's own processes; returns them."""
    mine = ours(state, pids)
    signal_pids(mine, sig)
    return mine


def catches(pid: int, sig: int) -> bool:
    """The process has a handler for `sig` installed (SigCgt in /proc/<pid>/status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def kill_groups(pgids, sig: int = signal.SIGKILL) -> None:
    """killpg each group as it is: only for groups just verified (`run_processes`)."""
    for pgid in set(pgids):
        if not pgid or pgid == os.getpgrp():
            continue
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def run_processes(
    state: dict[str, Any], roots=(), exclude: set[int] | None = None, sweep: bool = True
) -> tuple[dict[int, psutil.Process], set[int]]:
    """The run's live processes and process groups, each verified.

    `roots`: pids the caller knows are the run's (the agent's own child torchrun); the
    recorded torchrun, workers and rank pids count when their identity matches. Their live
    descendants are the run's too. Recorded process groups count when their leader's
    identity matches; groups read from a verified live process count as they are."""
    exclude = set(exclude or ()) | {os.getpid()}
    found: dict[int, psutil.Process] = {}
    tops = list(roots) + ours(
        state,
        [
            state.get("torchrun_pid"),
            *(state.get("worker_pids") or []),
            *(state.get("rank_pids") or {}).values(),
        ],
    )
    for r in dict.fromkeys(tops):
        try:
            p = psutil.Process(r)
            found[r] = p
            for c in p.children(recursive=True):
                found[c.pid] = c
        except psutil.Error:
            continue
    if sweep:
        for p in launched_processes(state, exclude):
            found[p.pid] = p
    for pid in exclude:
        found.pop(pid, None)
    groups = set(ours(state, state.get("pgids") or []))  # the leader is ours
    for pid in found:
        try:
            groups.add(os.getpgid(pid))
        except OSError:
            pass
    groups.discard(os.getpgrp())
    # the agent's own group is never a target; a group an excluded process leads neither
    groups -= exclude
    return found, groups


def kill_run(
    state: dict[str, Any], roots=(), exclude: set[int] | None = None, wait_s: float = 5.0
) -> list[int]:
    """SIGKILL every process of the run (`run_processes`); returns pids still alive after
    `wait_s` (should be []). `roots` are the caller's own children: killed but never waited
    for here, since a wait reaps them and the caller's own wait would then read exit code 0
    instead of the signal that ended them."""
    exclude = set(exclude or ()) | {os.getpid()}
    found, groups = run_processes(state, roots, exclude)
    kill_groups(groups)
    signal_pids(list(found), signal.SIGKILL)
    alive = _wait_gone(found, set(roots), wait_s)
    # a last sweep catches anything forked while we were killing
    late, _ = run_processes(state, roots, exclude)
    late = {pid: p for pid, p in late.items() if pid not in found}
    signal_pids(list(late), signal.SIGKILL)
    return sorted(alive | _wait_gone(late, set(roots), wait_s))


def _wait_gone(found: dict[int, psutil.Process], unreaped: set[int], wait_s: float) -> set[int]:
    """Wait until the processes are gone; the pids still alive. Those in `unreaped` are
    watched without a wait(): a zombie among them counts as gone."""
    _, alive = psutil.wait_procs(
        [p for pid, p in found.items() if pid not in unreaped], timeout=wait_s
    )
    left = {p.pid for p in alive}
    deadline = time.monotonic() + wait_s
    for pid in unreaped & set(found):
        while start_ticks(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        if start_ticks(pid) is not None:
            left.add(pid)
    return left


def kill_descendants(exclude: set[int] | None = None, wait_s: float = 5.0) -> list[int]:
    """SIGKILL every live descendant of this process except `exclude` and reap them; the
    pids still alive after `wait_s`. For an agent that is its run's subreaper: a rank's
    children that left its tree (setsid, a cleaned environment) are re-parented to it when
    the rank ends, and nothing else finds them."""
    exclude = set(exclude or ())
    try:
        found = {
            c.pid: c for c in psutil.Process().children(recursive=True) if c.pid not in exclude
        }
    except psutil.Error:
        return []
    signal_pids(list(found), signal.SIGKILL)
    _, alive = psutil.wait_procs(list(found.values()), timeout=wait_s)
    return sorted(p.pid for p in alive)


def descendants(pid: int | None) -> list[psutil.Process]:
    if not pid:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
