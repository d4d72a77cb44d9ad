"""The registry: every run directory under the runs root.

Attaching is reading: the CLI and TUI only read these files, so any number of SSH sessions can
watch the same run and none of them can disturb it. One side effect is deliberate: a run whose
state.json says it is not over but whose agent is gone (by identity, on this host) shows as
`lost` ("agent lost, ranks still running (N processes)", or that they have ended and a new
agent will record how), and reading it starts a new agent that adopts it (core/supervisor/adopt.py;
TUNEDECK_NO_ADOPT=1 turns that off for a reader). Only a run no agent can adopt (recorded
before identities, its agent crashing again and again) shows `failed` (the agent is gone).

A run directory that is not this user's own (core/rundir/ownership.py: the run folder or its
state.json owned by someone else, writable by others, a symlink) is `foreign` ("foreign:
<why>"): listed read-only with the progress its state.json records (a team sharing a home
watches each other's runs), never adopted, and `needs_stop` is False (nothing is signalled).
Its state.json is read without following a symlink, never blocking on a FIFO, at most 4 MiB.

`list_runs` reads everything once (the CLI). A viewer that asks again and again (the TUI's runs
list, every second) keeps a `Registry`: it lists the runs root only when the root's mtime
changes, and re-reads a state.json only when its stat signature (mtime, size, inode, owner,
mode) changes; a changed one is checked against the ownership rule as it is read (two lstat
calls: the run folder and state.json).
A finished run is not even stat'ed every time: each scan looks at a tenth of them in turn, so
an idle TUI over thousands of finished runs costs a few hundred stats a second (which matters
on NFS), while a new or deleted run shows at once (the root's mtime moves).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunedeck.core.nodes.folders import head_of
from tunedeck.core.ingest.tail import tail_lines
from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import RunDir, json_problem, ownership
from tunedeck.core.supervisor import adopt, procs
from tunedeck.core.store.state import TERMINAL, clean_state, fatal_problem, pid_alive, stale_for


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
    stale_s: float | None = None  # a live run whose agent has not written for this long

    @property
    def run(self) -> RunDir:
        return RunDir(self.run_dir)

    @property
    def active(self) -> bool:
        return self.status not in TERMINAL

    @property
    def damaged(self) -> bool:
        return self.status == DAMAGED

    @property
    def foreign(self) -> bool:
        """Another user's run (or one others can write): shown, never acted on. It counts as
        `active`, so nothing that refuses a live run (delete, resume) touches it either."""
        return self.status == FOREIGN

    @property
    def needs_stop(self) -> bool:
        """Not ended as far as state.json records: its processes may still be alive even
        when the agent is gone (then `status` reads lost, or failed when none lives). A
        damaged state.json names no process that could be signalled safely; a foreign run's
        pids are not this user's to signal."""
        return not (self.damaged or self.foreign) and self.state.get("status") not in TERMINAL

    @property
    def recorded_live(self) -> bool:
        """state.json records no end (whatever this reader may do about it)."""
        return not self.damaged and self.state.get("status") not in TERMINAL

    def age_s(self, now: float | None = None) -> float:
        return (now or time.time()) - self.created

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "step": self.step,
            "max_steps": self.max_steps,
            "loss": self.loss,
            "tokens_per_s": self.tokens_per_s,
            "created": self.created,
            "started": self.started,
            "ended": self.ended,
            "exit_code": self.exit_code,
            "run_dir": str(self.run_dir),
            "agent_pid": self.state.get("agent_pid"),
            "torchrun_pid": self.state.get("torchrun_pid"),
            "worker_pids": self.state.get("worker_pids", []),
            "stop_requested": self.state.get("stop_requested"),
            "stale_s": self.stale_s,
            "output_shared_with": self.state.get("output_shared_with"),
        }


DAMAGED = "damaged"
FOREIGN = "foreign"
STATE_FILE = "state.json"


def read_run(run_dir: Path) -> RunInfo | None:
    """The run in `run_dir`; None when the folder holds no state.json (not a run, or not yet);
    a `foreign` RunInfo when the folder or its state.json is not this user's own, a `damaged`
    one when state.json cannot be trusted."""
    foreign = ownership.problem(run_dir, files=(STATE_FILE,))
    if foreign is not None:
        return foreign_info(run_dir, foreign)
    state, why = json_problem(RunDir(run_dir).state)
    if why == "missing":
        return None
    return info_from_state(run_dir, state, why)


def damaged_info(run_dir: Path, file: str, why: str) -> RunInfo:
    """A run whose `file` cannot be read: listed (so the user sees it and `tunedeck doctor`
    can say more), never adopted or signalled, every other run unaffected."""
    try:
        created = os.stat(run_dir).st_mtime
    except OSError:
        created = 0.0
    return RunInfo(
        run_id=run_dir.name,
        run_dir=run_dir,
        name="",
        status=DAMAGED,
        message=f"damaged: {file}: {why}",
        created=created,
        started=None,
        ended=None,
        step=0,
        max_steps=0,
        loss=None,
        tokens_per_s=None,
        exit_code=None,
        state={"status": DAMAGED},
    )


def foreign_info(run_dir: Path, why: str, state: dict[str, Any] | None = None) -> RunInfo | None:
    """Another user's run as its state.json says (read here without trusting it: no symlink,
    no FIFO, bounded; or `state` as the caller read it), status `foreign`; None when there is
    no state.json (not a run). Its id is its folder's name, whatever the file claims. Nothing
    here adopts or signals."""
    if state is None:
        try:
            raw = ownership.read_untrusted(RunDir(run_dir).state)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            raw = b""
        try:
            state = json.loads(raw.decode("utf-8")) if raw.strip() else None
        except (ValueError, RecursionError):
            state = None
    state = clean_state(state) if isinstance(state, dict) and fatal_problem(state) is None else {}
    try:
        created = state.get("created") or os.lstat(run_dir).st_mtime
    except OSError:
        created = 0.0
    prog = state.get("progress") or {}
    return RunInfo(
        run_id=run_dir.name,
        run_dir=run_dir,
        name=str(state.get("name") or ""),
        status=FOREIGN,
        message=f"foreign: {why}",
        created=created,
        started=state.get("started"),
        ended=state.get("ended"),
        step=int(prog.get("step") or 0),
        max_steps=int(prog.get("max_steps") or 0),
        loss=prog.get("loss"),
        tokens_per_s=prog.get("tokens_per_s"),
        exit_code=state.get("exit_code"),
        state={**state, "status": state.get("status", "pending")},
    )


def info_from_state(
    run_dir: Path, state: dict[str, Any] | None, why: str | None = None
) -> RunInfo | None:
    """A run's info from its state.json content: a damaged one when a vital key cannot be
    trusted; any other key of the wrong type reads as missing (core/store/state.py)."""
    why = why or fatal_problem(state)
    if why:
        return damaged_info(run_dir, "state.json", why)
    assert isinstance(state, dict)
    state = clean_state(state)
    status = state.get("status", "pending")
    message = state.get("message", "")
    if status not in TERMINAL and state.get("agent_pid") and not _owner_alive(state):
        # the agent died without recording an end (SIGKILL, a crash, a host reboot)
        blocked = adopt.why_not(run_dir, state)
        if blocked is not None and blocked.startswith(adopt.FOREIGN_PREFIX):
            # a file the adoption would read (plan.json, spec.toml, ...) is not the user's
            return foreign_info(run_dir, blocked.removeprefix(adopt.FOREIGN_PREFIX), state)
        alive = procs.live_processes(state)
        adoptable = blocked is None
        if alive:
            status = "lost"
            message = f"agent lost, ranks still running ({len(alive)} processes)"
        elif adoptable:  # how it ended is in its files: not known before an agent reads them
            status = "lost"
            message = "agent lost, its processes have ended; a new agent records how the run ended"
        else:
            status, message = "failed", "the run's agent is gone (killed or host restarted)"
        if adoptable:
            # reading the run is what brings its owner back: a new agent adopts it (or, when
            # nothing of it lives, records how it ended); see core/supervisor/adopt.py
            adopt.request(run_dir, state)
    prog = state.get("progress") or {}
    return RunInfo(
        run_id=state["run_id"],
        run_dir=run_dir,
        name=state.get("name", ""),
        status=status,
        message=message,
        created=state.get("created") or 0.0,
        started=state.get("started"),
        ended=state.get("ended"),
        step=int(prog.get("step") or 0),
        max_steps=int(prog.get("max_steps") or 0),
        loss=prog.get("loss"),
        tokens_per_s=prog.get("tokens_per_s"),
        exit_code=state.get("exit_code"),
        state=state,
        stale_s=_stale(status, state),
    )


def _stale(status: str, state: dict[str, Any]) -> float | None:
    """Whole seconds since a running run's agent last wrote its beat, once that is too long
    (a frozen or hung agent: the progress shown is old); None otherwise."""
    if status not in ("pending", "running"):
        return None
    age = stale_for(state)
    return None if age is None else float(int(age))


def _owner_alive(state: dict[str, Any]) -> bool:
    """The agent lives, or this host cannot tell (the run was recorded on another host)."""
    if (
        isinstance(state.get("pid_identity"), dict)
        and str(state.get("agent_pid")) in state["pid_identity"]
    ):
        return procs.owner_alive(state) is not False
    return pid_alive(state["agent_pid"], state.get("agent_create_time"))


def _sig(st: os.stat_result) -> tuple[int, ...]:
    """What a state.json's stat says that changes what the run shows: its content (mtime,
    size, inode) and who may write it (owner, mode: core/rundir/ownership.py). A file swapped
    for a symlink has another inode, so it is read again, and `read_run` lstats it."""
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_uid, st.st_mode)


def _newest_first(runs: list[RunInfo]) -> list[RunInfo]:
    return sorted(runs, key=lambda r: r.created, reverse=True)


# A file changed this recently may change again within the filesystem's timestamp granularity
# (a few ms locally, up to seconds over NFS) without its mtime moving: look again next time.
RACY_S = 2.0


@dataclass
class _Entry:
    path: str  # its state.json (a str: os.stat takes it as it is)
    sig: tuple[int, ...]  # state.json's `_sig` when it was read
    info: RunInfo | None  # None: a folder whose state.json is not a run's (yet)
    recheck: bool  # read again next scan (racy mtime)
    live: bool  # state.json does not record an end
    slot: int  # which of `finished_every` scans looks at it when ended


class Registry:
    """The runs under one root, kept up to date incrementally for a long-lived viewer.

    `scan()` returns the same list as `list_runs` (newest first). Between scans it lists the
    root only when the root's mtime changed, and reads a run's state.json only when its stat
    signature changed. A run that is not over is stat'ed and re-checked every scan even without
    a write (its agent may have died: `info_from_state`); a finished one is stat'ed every
    `finished_every` scans (a finished run's state.json rarely changes again) unless
    `scan(full=True)`. Not thread-safe: one scanner at a time (the runs screen's worker holds a
    lock).
    """

    def __init__(self, root: Path | None = None, finished_every: int = 10):
        self.root = root or runs_root()
        self.finished_every = max(1, finished_every)
        self._scans = 0
        self._root_sig: tuple[int, int] | None = None
        self._names: list[str] = []
        self._entries: dict[str, _Entry] = {}
        self._sorted: list[RunInfo] = []
        self.generation = 0  # bumps whenever the list or any run's info changed
        self.reads = 0  # state.json files read (tests and bench/tui_idle.py count them)
        self.listings = 0  # listings of the root

    def scan(self, full: bool = False) -> list[RunInfo]:
        """The runs, newest first. `full`: stat every run and list the root now."""
        now = time.time()
        if full:
            self._root_sig = None
        changed = self._relist(now)
        self._scans += 1
        turn = self._scans % self.finished_every
        entries, stat = self._entries, os.stat
        for name in self._names:
            # the idle path, run for every run every refresh: one stat, no Path objects
            e = entries.get(name)
            if e is not None and not e.recheck:
                if not (e.live or full or e.slot == turn):
                    continue
                try:
                    st = stat(e.path)
                except OSError:
                    st = None
                if (
                    st is not None
                    and (st.st_mtime_ns, st.st_size, st.st_ino, st.st_uid, st.st_mode) == e.sig
                ):
                    if e.live:
                        changed |= self._rederive(e)
                    continue
            changed |= self._refresh(name, now)
        if changed:
            self._sorted = _newest_first([e.info for e in entries.values() if e.info])
            self.generation += 1
        return self._sorted

    def _relist(self, now: float) -> bool:
        try:
            st = os.stat(self.root)
        except OSError:
            had = bool(self._entries)
            self._root_sig, self._names, self._entries = None, [], {}
            return had
        sig = (st.st_mtime_ns, st.st_ino)
        if sig == self._root_sig:
            return False
        try:
            with os.scandir(self.root) as it:
                # a node's folder in a shared home is part of the head's run, not a run
                names = sorted(e.name for e in it if e.is_dir() and head_of(Path(e.path)) is None)
        except OSError:
            return False
        self.listings += 1
        self._root_sig = None if now - st.st_mtime < RACY_S else sig
        self._names = names
        gone = self._entries.keys() - set(names)
        for name in gone:
            del self._entries[name]
        return bool(gone)

    def _refresh(self, name: str, now: float) -> bool:
        """Read one run again (new, changed, or racy); True when what it shows changed."""
        run_dir = self.root / name
        path = str(RunDir(run_dir).state)
        entry = self._entries.get(name)
        old = entry.info if entry else None
        try:
            st = os.stat(path)
        except OSError:  # not a run (yet), or deleted
            if entry is not None:
                del self._entries[name]
            return old is not None
        info = read_run(run_dir)
        self.reads += 1
        # a foreign run that is not over is looked at every scan too (its progress is shown)
        live = info is not None and info.recorded_live
        slot = entry.slot if entry else len(self._entries) % self.finished_every
        self._entries[name] = entry = _Entry(
            path, _sig(st), info, now - st.st_mtime < RACY_S, live, slot
        )
        if info == old:
            entry.info = old  # keep the object: viewers compare identities
            return False
        return True

    def _rederive(self, entry: _Entry) -> bool:
        """No write, but the agent may have died since: derive the info from the same state."""
        old = entry.info
        assert old is not None
        if old.damaged or old.foreign:  # nothing to derive: only a new write can change it
            return False
        info = info_from_state(old.run_dir, old.state)
        if info == old:
            return False
        entry.info = info
        return True


def list_runs(root: Path | None = None) -> list[RunInfo]:
    """All runs, newest first."""
    return Registry(root).scan()


def find_run(ref: str, root: Path | None = None) -> RunInfo:
    """A run by id, unique id prefix, or name (the newest run of that name, this user's own
    first)."""
    root = root or runs_root()
    direct = root / ref
    head = head_of(direct)
    if head is not None:  # a node's folder: the run it is part of
        direct, ref = root / head, head
    if RunDir(direct).state.exists():
        info = read_run(direct)
        if info:
            return info
    runs = list_runs(root)
    by_prefix = [r for r in runs if r.run_id.startswith(ref)]
    if len(by_prefix) == 1:
        return by_prefix[0]
    by_name = [r for r in runs if r.name == ref]
    if by_name:  # in a shared home, a name means this user's own run before another's
        return next((r for r in by_name if not r.foreign), by_name[0])
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
