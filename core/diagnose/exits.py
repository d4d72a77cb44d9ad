"""How the run's launcher ended, as the agent recorded it: a finding when a signal ended it.

A torchrun killed by SIGKILL (the kernel's OOM killer, a scheduler, someone's `kill -9`) writes
nothing: no line of its log and no rank's says why the run ended. The agent records torchrun's
exit code in state.json (`exit_code`, and per attempt in `attempts`) the Popen way: a negative
code is the signal that ended it. That record is the evidence this module turns into a finding,
with what sends such a signal and how to check which one did. The same records say which
stop was asked for (`asked_stop`) and which port clashes the agent answered by moving a
single-node run (`port_moves`, `handled_port`).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.diagnose.rules import SIGKILL_CHECK
from tunedeck.core.ingest.parsers.torchrun import signal_name
from tunedeck.core.rundir import RunDir

CATEGORY = "launcher_killed"
ASKED_STOP = "stop_requested"

_WORDS = {
    "SIGKILL": (
        "torchrun was killed by SIGKILL (exit code -9; the kernel's OOM killer or a kill -9 "
        "from outside)",
        "The launcher was ended by SIGKILL, which no process can catch or log, so neither "
        "torchrun nor the ranks wrote why and nothing in the logs failed first. SIGKILL comes "
        "from outside the run: the kernel's OOM killer (the host ran out of RAM, or the job's "
        "cgroup hit its memory limit; a cgroup set to kill as a group takes torchrun with the "
        "ranks), a scheduler or container runtime ending the job, or a `kill -9` by a user or "
        "a script. It was not tunedeck's own stop (none was requested).",
    ),
    "SIGTERM": (
        "torchrun was ended by SIGTERM (exit code -15) from outside the run",
        "The launcher received SIGTERM before it could shut its ranks down: a scheduler's time "
        "limit or preemption, a container stop, or a `kill` by a user or a script. No rank "
        "failed first. It was not tunedeck's own stop (none was requested).",
    ),
    "SIGHUP": (
        "torchrun was hung up (SIGHUP, exit code -1)",
        "The launcher received SIGHUP, which a shell sends to its jobs when the terminal or "
        "SSH session closes, or someone sent it. No rank failed first.",
    ),
    "SIGINT": (
        "torchrun was interrupted (SIGINT, exit code -2)",
        "The launcher received SIGINT (Ctrl-C or a `kill -INT`) and ended. No rank failed first.",
    ),
}
_CRASH = ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE")


def recorded_exits(run_dir: str | Path) -> list[Finding]:
    """Findings for torchrun attempts that a signal ended, from state.json; [] when none did,
    when the run was stopped on request (`tunedeck stop --hard` sends SIGKILL too), or when
    state.json cannot be read."""
    run = RunDir(run_dir)
    try:
        state = run.read_state()
    except (OSError, ValueError):
        return []
    if (
        not isinstance(state, dict)
        or state.get("stop_requested")
        or state.get("status") == "stopped"
    ):
        return []
    ends: list[dict[str, Any]] = [a for a in state.get("attempts") or [] if isinstance(a, dict)]
    code = state.get("exit_code")
    final = state.get("status") in ("failed", "succeeded") and _is_int(code)
    if final and (not ends or ends[-1].get("exit_code") != code):
        ends.append(
            {"attempt": state.get("attempt"), "exit_code": code, "ended": state.get("ended")}
        )
    out = []
    for i, a in enumerate(ends):
        code = a.get("exit_code")
        if not _is_int(code) or code >= 0:
            continue
        last = final and i == len(ends) - 1
        out.append(_finding(run, state, -code, a, last))
    return out


def _finding(run: RunDir, state: dict, signum: int, attempt: dict, last: bool) -> Finding:
    sig = signal_name(signum)
    pid = state.get("torchrun_pid") if last else None
    t = attempt.get("ended") if isinstance(attempt.get("ended"), (int, float)) else None
    when = _stamp(t) if t else ""
    if sig in _WORDS:
        summary, cause = _WORDS[sig]
    elif sig in _CRASH:
        summary = f"torchrun itself crashed with {sig} (exit code {-signum})"
        cause = (
            "The launcher (not a rank) ended on a fatal signal of its own: native code in "
            "its process failed (a broken torch/Python install, corrupted memory)."
        )
    else:
        summary = f"torchrun was ended by {sig} (exit code {-signum})"
        cause = (
            f"The launcher received {sig} from outside the run and ended before it "
            "could report anything. No rank failed first."
        )
    if sig == "SIGKILL":
        pid_words = f" {pid}" if _is_int(pid) else ""
        # the kernel logs the kill when it happens, up to a tick before the agent saw the end
        since = f" --since '{_stamp(t - 60)}'" if t else ""
        fix = (
            f"{SIGKILL_CHECK.format(pid=pid_words, since=since)} Then relaunch or resume "
            "from the last checkpoint (`tunedeck resume RUN`)."
        )
    elif sig in _CRASH:
        fix = (
            "Run the same launch by hand (`launch.sh` in the run folder) with "
            "PYTHONFAULTHANDLER=1 to see where it fails; reinstall torch if it persists."
        )
    else:
        fix = (
            "Check the scheduler's log (time limit, preemption), the container's events "
            "and who else can signal your processes; resume from the last checkpoint."
        )
    att = attempt.get("attempt")
    if not last:
        summary += (
            f" in attempt {att}; the run restarted" if att is not None else "; the run restarted"
        )
    code = -signum
    ev = (
        f"{run.state}: exit_code {code} ({sig}"
        + (f", torchrun pid {pid}" if _is_int(pid) else "")
        + (f", attempt {att}" if att is not None else "")
        + (f", at {when}" if when else "")
        + ")"
    )
    if state.get("message") and last:
        ev2 = [f"{run.state}: message: {str(state['message'])[:200]}"]
    else:
        ev2 = []
    return Finding(
        category=CATEGORY,
        severity="error" if last else "warning",
        summary=summary,
        cause=cause,
        fix=fix,
        rank=None,
        node=0,
        evidence=[ev, *ev2],
        t=t,
        source=str(run.state),
        root_cause=last,
        host=state.get("host") if isinstance(state.get("host"), str) else None,
    )


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def asked_stop(run_dir: str | Path) -> Finding | None:
    """The stop someone asked for (`tunedeck stop`, the TUI, a stop rule), from the run's
    stop.json and state.json `stop_requested`: what ended the run when it ended so, whatever
    signals that stop sent (under Slurm `tunedeck stop` is an `scancel --signal=TERM`, which
    torchrun reports as a death signal like a time limit's). None when no stop was asked,
    or when it was the run's own (a lost node's: `failed` in stop.json)."""
    run = RunDir(run_dir)
    try:
        state = run.read_state() or {}
        req = run.read_stop()
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        state = {}
    if not isinstance(req, dict):
        req = {"mode": state["stop_requested"]} if state.get("stop_requested") else None
    if req is None or req.get("failed"):
        return None
    mode = "hard" if req.get("mode") == "hard" else "graceful"
    t = req.get("t") if isinstance(req.get("t"), (int, float)) else None
    by = req.get("by") if isinstance(req.get("by"), str) else ""
    route = {"scancel": " (sent on to the Slurm job as scancel --signal=TERM)", "head": ""}
    who = route.get(by, f" ({by})" if by else "")
    when = f" at {_stamp(t)}" if t else ""
    ended = state.get("status")
    return Finding(
        category=ASKED_STOP,
        severity="info",
        summary=f"the run was stopped on request: a {mode} stop asked{when}{who}",
        cause="A stop was asked for (`tunedeck stop`, the TUI's stop, or a stop rule): "
        "tunedeck ended the ranks"
        + (" after a checkpoint" if mode == "graceful" else "")
        + "; the signals that did it (SIGTERM to torchrun and the ranks"
        + (", Slurm's cancel of the job's steps" if by == "scancel" else "")
        + ") follow from it, not from a time limit or a preemption.",
        fix="Nothing failed because of it; `tunedeck resume RUN` continues from the newest "
        "checkpoint.",
        node=0,
        evidence=[
            f"{run.stop_request}: {mode} stop" + (f", by {by}" if by else "") + when,
            f"{run.state}: status {ended}, stop_requested {state.get('stop_requested')}",
        ],
        t=t,
        source=str(run.stop_request),
        root_cause=True,
        host=state.get("host") if isinstance(state.get("host"), str) else None,
    )


def port_moves(run_dir: str | Path) -> dict[int, int]:
    """The rendezvous ports the agent moved a single-node run off (state.json `port_moves`,
    core/supervisor/portmove.py): the taken port and the one the run went on with."""
    try:
        state = RunDir(run_dir).read_state() or {}
    except (OSError, ValueError):
        return {}
    moves = state.get("port_moves") if isinstance(state, dict) else None
    return {
        int(m["from"]): int(m["to"])
        for m in moves or []
        if isinstance(m, dict) and _is_int(m.get("from")) and _is_int(m.get("to"))
    }


def handled_port(f: Finding, moves: dict[int, int]) -> Finding:
    """A port clash the agent answered by moving the run: what happened, not a failure. It
    keeps the clash's key (its first summary as ident), so the stored error is replaced."""
    m = re.search(r"rendezvous port (\d+)", f.summary)
    if f.category != "port_in_use" or m is None or int(m[1]) not in moves:
        return f
    port, new = int(m[1]), moves[int(m[1])]
    return replace(
        f,
        severity="info",  # told, never picked as the root cause (errors only)
        ident=f.ident or f.summary,
        summary=f"rendezvous port {port} was taken at start; the run moved to port {new}",
        cause=f"Another process bound port {port} between the launch's pick and torchrun's "
        "listen (a busy machine). On one node the port is the run's own, so tunedeck started "
        f"the same attempt again on port {new}; no rank had started.",
        fix="Nothing to do. To keep a fixed port, name a free one in cluster.master_port.",
    )
