"""The per-node agent: owns one run from start to end, whether or not anyone is watching.

Started detached by `tunedeck launch` (`python -m tunedeck.core.supervisor.agent RUN_DIR`), or by any
tunedeck command that finds the run's agent gone (`... RUN_DIR --adopt`: core/supervisor/adopt.py).
It
  1. takes ownership: the run directory's owner lock, its pid and identity in state.json,
  2. prepares assets (builds the demo model on first use: plans never build anything),
  3. starts torchrun as its child in a new process group, output to files, with the run's
     launch marker (TUNEDECK_RUN_ID + a fresh TUNEDECK_LAUNCH_ID, recorded first),
  4. every tick: ingests rank events into run.db, records which pid runs which rank (each with
     its identity) and the progress in state.json, acts on stop requests (stop.json, or
     SIGTERM/SIGUSR1 to the agent; a graceful stop keeps sending SIGTERM to ranks that appear
     after it), and runs the monitors (telemetry, detectors, log diagnosis, backend ingesters),
  5. when torchrun ends: final ingest, kills any leftover process of the run (by identity),
     records the final status and exit code.

An adopting agent does the same from step 4 on, for a torchrun that is not its child.

Its own faults do not end the run: a full disk (ENOSPC/EDQUOT, SQLite's "disk is full") pauses
what failed (run.db ingest and telemetry; state.json writes are kept in memory) and says so in
state.json's message; it retries every IO_RETRY_S and resumes where run.db's offsets left off.
An unexpected crash leaves the run to be adopted when its processes live.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import secrets
import signal
import sqlite3
import subprocess
import tempfile
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

from tunedeck.core.alerts.watch import RunAlerts
from tunedeck.core.backend_traits import traits_of
from tunedeck.core.backends import backend_of
from tunedeck.core.backends.base import Restart
from tunedeck.core.demo import DataFileError
from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.queue.wait import queue_env, wait_turn
from tunedeck.core.stoprule.median import MedianRule
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.records import run_exit_code
from tunedeck.core.rundir.checkpoints import resume_point, step_of
from tunedeck.core.rundir.secrets import read_secrets
from tunedeck.core.supervisor import adopt, portmove, procs, restarts
from tunedeck.core.supervisor.monitors import DetectorMonitor, MonitorContext, make_monitors
from tunedeck.core.supervisor.trackfeed import RunDbPoll
from tunedeck.core.trackers import Mirror, open_mirror
from tunedeck.core.store.state import BEAT_S, TERMINAL, progress_from_event
from tunedeck.core.store.state import KEYS as STATE_KEYS
from tunedeck.core.store.store import Store
from tunedeck.core.spec import load_spec, mask_argv
from tunedeck.core.telemetry import proctree

log = logging.getLogger("tunedeck.agent")

TICK_S = 0.5
IO_RETRY_S = 2.0  # a paused write (full disk) is tried again this often
FINAL_WRITE_S = 24 * 3600  # how long the end of a run waits for state.json to be writable
FINAL_INGEST_WAIT_S = 60.0  # ... and for run.db, before recording the end without the rest


def io_error(e: BaseException) -> str | None:
    """A write that failed for want of space (or an I/O error writing run.db): what to say;
    None for any other error."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full ({e.strerror or e})"
    if isinstance(e, sqlite3.Error):
        code = getattr(e, "sqlite_errorcode", None)
        if code == 13 or "full" in str(e):  # SQLITE_FULL
            return f"disk full ({e})"
        if isinstance(code, int) and code & 0xFF == 10:  # SQLITE_IOERR_*
            return f"run.db I/O error ({e})"
    return None


class AdoptedTorchrun:
    """torchrun started by an agent that died: not our child, so never wait()ed for. It runs
    while its recorded identity (or that of a rank it left) matches; its exit code is read
    from what the attempt left (adopt.exit_code)."""

    def __init__(self, agent: "Agent", pid: int | None):
        self.agent = agent
        self.pid = pid
        self.returncode: int | None = None
        self.how = ""
        self.done = False

    def check(self) -> bool:
        if self.done:
            return True
        if procs.live_processes(self.agent.state):
            return False
        self.done = True
        launches = self.agent.state.get("launches") or [{}]
        since = float(launches[-1].get("t") or 0) if isinstance(launches[-1], dict) else 0.0
        self.agent.ingest_all()
        self.returncode, self.how = adopt.exit_code(self.agent.rundir, since, self.agent.node_rank)
        log.info(
            "adopted torchrun %s ended: exit code %s (%s)", self.pid, self.returncode, self.how
        )
        return True


# The demo model is built in a child process (torch and the model would otherwise stay in the
# agent's memory for the whole run); an OSError about the data file comes back as one JSON line,
# so the preparation finding names the file as it would had the agent read it itself.
_BUILD_OS_ERROR = 3
_BUILD_DEMO = f"""
import json, sys
from tunedeck.core.demo import ensure_tiny_model
try:
    ensure_tiny_model(sys.argv[1])
except OSError as e:
    kind, msg = type(e).__name__, str(e)
    print(json.dumps(dict(kind=kind, message=msg, errno=e.errno, strerror=e.strerror,
                          filename=e.filename)), file=sys.stderr)
    sys.exit({_BUILD_OS_ERROR})
"""


class Agent:
    def __init__(self, run_dir: Path):
        self.rundir = RunDir(run_dir)
        self.state: dict[str, Any] = self.rundir.read_state() or {}
        self.spec = load_spec(self.rundir.spec)
        # read once: fixed for the run's life but for a port move (core/supervisor/portmove)
        self.plan = self.rundir.read_plan()
        self.node_rank = self.spec.cluster.node_rank
        self.proc: subprocess.Popen | AdoptedTorchrun | None = None
        self.wake = False
        self.stop_mode: str | None = None
        self.stop_deadline: float | None = None
        self.killed_at: float | None = None
        self.forced: dict[str, Any] | None = None  # a graceful stop that had to SIGKILL
        self.grace_s = float(self.spec.run.stop_grace_s)
        self.subreaper = False  # orphans of the run re-parent to us
        self.termed: set[int] = set()  # ranks sent SIGTERM by a graceful stop
        self.store: Store | None = None
        self.ctx: MonitorContext | None = None
        self.monitors: list | None = None  # None: not made yet (they need run.db)
        self.rank_of_pid: dict[int, int | None] = {}  # the ranks' RANK, read once per pid
        self.adopted = False
        # a full disk: what is paused and why; state.json changes kept in memory meanwhile
        self.base_message = str(self.state.get("message") or "")
        self.paused: dict[str, str] = {}
        self.paused_at: dict[str, float] = {}
        self.unsaved = False
        self.next_io_try = 0.0
        self._save_lock = threading.RLock()
        self.alerts = RunAlerts(self.rundir, self.spec)  # core/alerts: sent off this loop
        self.median = MedianRule(self.rundir, self.state.get("sweep"))  # core/stoprule
        self.mirror: Mirror | None = None  # core/trackers: opened with the first events
        self.log_mark: int | None = None  # torchrun's log size when this agent started it

    # -- state --------------------------------------------------------------------------
    def save(self, **changes: Any) -> None:
        unknown = set(changes) - STATE_KEYS
        if unknown:  # a typo here would write a key no reader knows
            raise KeyError(
                f"state.json has no key {', '.join(sorted(unknown))}: declare it "
                f"in core/rundir/records.py RunState"
            )
        with self._save_lock:  # the preparing thread saves too
            if "message" in changes:
                self.base_message = str(changes["message"] or "")
            self.state.update(changes)
            self.state["message"] = self._message()
            self._write_state()

    def _message(self) -> str:
        if not self.paused:
            return self.base_message
        since = time.strftime("%H:%M:%S", time.localtime(min(self.paused_at.values())))
        why = next(iter(self.paused.values()))
        what = " and ".join(PAUSED_WHAT.get(k, k) for k in sorted(self.paused))
        note = f"{why} since {since}: {what} paused; the run goes on"
        return note + (f"; {self.base_message}" if self.base_message else "")

    def _write_state(self) -> bool:
        try:
            self.rundir.write_state(self.state)
        except OSError as e:
            why = io_error(e)
            if why is None:
                raise
            self.unsaved = True
            self._pause("state.json", why)
            return False
        self.unsaved = False
        return True

    def stop_requested(self) -> bool:
        return self.rundir.stop_request.exists()

    # -- a full disk --------------------------------------------------------------------
    def _pause(self, what: str, why: str) -> None:
        if what in self.paused:
            return
        log.warning("%s: %s paused until space returns; the run goes on", why, what)
        self.paused[what] = why
        self.paused_at[what] = time.time()
        self.next_io_try = time.monotonic() + IO_RETRY_S
        self.state["message"] = self._message()
        if what != "state.json":
            self._write_state()  # say why (in memory if state.json cannot be written)

    def _resume(self, what: str) -> None:
        why = self.paused.pop(what, None)
        t0 = self.paused_at.pop(what, time.time())
        if why is None:
            return
        log.info("%s written again after %.0fs (%s)", what, time.time() - t0, why)
        pauses = list(self.state.get("io_pauses") or [])
        pauses.append({"what": what, "why": why, "from": t0, "to": time.time()})
        self.save(io_pauses=pauses)

    def retry_io(self, force: bool = False) -> None:
        """Every IO_RETRY_S while something is paused: is there space again?"""
        if not (self.paused or self.unsaved):
            return
        now = time.monotonic()
        if not force and now < self.next_io_try:
            return
        self.next_io_try = now + IO_RETRY_S
        if "run.db" in self.paused and _space_for(self.rundir.db):
            if self.store is None:
                self._open_store()
            if self.store is not None:
                self._resume("run.db")
        if (self.unsaved or "state.json" in self.paused) and _space_for(self.rundir.state):
            why = self.paused.pop("state.json", None)
            t0 = self.paused_at.pop("state.json", None)
            self.state["message"] = self._message()
            if self._write_state() and why:
                self.paused["state.json"], self.paused_at["state.json"] = why, t0 or time.time()
                self._resume("state.json")

    def _open_store(self) -> bool:
        try:
            store = Store(self.rundir, write=True)
        except Exception as e:
            why = io_error(e)
            if why is None:
                raise
            self._pause("run.db", why)
            return False
        self.store = store
        if self.ctx is not None:  # the monitors write through the new connection
            self.ctx.store = store
            for m in self.monitors or []:
                if hasattr(m, "rebind"):
                    m.rebind(store)
        return True

    def check_db(self) -> None:
        """run.db deleted or replaced under the agent (a user's `rm`, a sync tool): the agent
        would write on into a file nobody can open. Put its database back at run.db (the
        open connection still holds all of it) and go on through a new connection; the gap
        is recorded in state.json `db_restored`."""
        if self.store is None:
            return
        gone = self.store.file_gone()
        if gone is None:
            return
        t0 = time.time()
        try:
            kept = self.store.restore_file()
        except Exception as e:
            log.exception("run.db was %s and could not be restored", gone)
            why = io_error(e)
            self._store_failed(why or f"run.db was {gone} and could not be restored ({e})")
            return
        self._close_store()
        self._open_store()
        note = {"t": t0, "why": gone, "restored": time.time()}
        if kept:
            note["kept"] = kept
        log.warning(
            "run.db was %s; restored from the agent's open connection%s",
            gone,
            f" (the file found there is kept as {kept})" if kept else "",
        )
        restored = [*(self.state.get("db_restored") or []), note]
        self.save(db_restored=restored)

    def _store_failed(self, why: str) -> None:
        """run.db cannot be written: drop the connection (a later one starts from the offsets
        run.db holds, so nothing that failed is lost) and pause until space returns."""
        if self.store is not None:
            try:
                self.store.close()
            except Exception:
                pass
        self.store = None
        self._pause("run.db", why)

    # -- signals ------------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        if signum == signal.SIGUSR1:
            self.wake = True  # the CLI wrote stop.json
        else:  # SIGTERM / SIGHUP / SIGINT to the agent itself: stop the run gracefully
            if self.stop_mode is None:
                self.stop_mode = "graceful_pending"

    def install_signals(self) -> None:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(s, self._on_signal)

    # -- main ---------------------------------------------------------------------------
    def take_ownership(self, adopted: bool) -> None:
        me = psutil.Process()
        table = dict(self.state.get("pid_identity") or {})
        prev = self.state.get("agent_pid")
        before = table.pop(str(prev), None) if prev else None
        ident = procs.identity(me.pid)
        if ident:
            table[str(me.pid)] = ident
        changes: dict[str, Any] = dict(
            agent_pid=me.pid,
            agent_pgid=os.getpgrp(),
            agent_create_time=me.create_time(),
            pid_identity=table,
        )
        if adopted:
            self.adopted = True
            history = list(self.state.get("adopted") or [])
            history.append(
                {
                    "t": time.time(),
                    "agent_pid": me.pid,
                    "lost_agent_pid": prev,
                    "lost_agent": before,
                }
            )
            # in the same write as the new pid: a reader never sees the new owner with the
            # lost agent's message (the adoption refines it once it has read the run)
            changes.update(adopted=history, message=f"adopted: agent {prev} was lost")
        elif self.state.get("status") != "queued":  # a queued run waits its turn (core/queue)
            changes.update(status="pending", message="preparing")
        self.save(**changes)

    def run(self) -> int:
        self.take_ownership(adopted=False)
        self.subreaper = _become_subreaper()
        self.install_signals()
        # open before preparing: a failed preparation is stored as a finding, so
        # `tunedeck diagnose` and the monitor show its cause and fix like any other failure
        self._open_store()
        return self._prepare_and_run()

    def adopt(self) -> int:
        """Take over a run whose agent died (core/supervisor/adopt.py says what can be known)."""
        st = self.state
        if st.get("status") in TERMINAL or procs.owner_alive(st):
            log.info(
                "nothing to adopt: the run is %s, its agent pid %s",
                st.get("status"),
                st.get("agent_pid"),
            )
            return 0
        lost = st.get("agent_pid")
        self.take_ownership(adopted=True)
        self.subreaper = _become_subreaper()  # for the torchruns it starts (restarts)
        self.install_signals()
        self._open_store()
        attempt = int(st.get("attempt") or 0)
        history = list(st.get("attempts") or [])
        launches = [x for x in st.get("launches") or [] if isinstance(x, dict)]
        if not launches:
            # the lost agent died before it started torchrun: do what it was doing
            log.info(
                "adopting run %s from lost agent %s: torchrun never started", st.get("run_id"), lost
            )
            self.save(message="adopted before start; preparing")
            return self._prepare_and_run()
        if "torchrun_pid" not in launches[-1]:
            # it died between recording the launch and recording torchrun: whatever carries
            # that launch's marker is the run's and unowned; start the attempt afresh
            left = procs.kill_run(st, exclude={os.getpid()})
            log.info(
                "adopting: launch %s has no recorded torchrun; cleared it (left: %s) "
                "and starting attempt %d again",
                launches[-1].get("id"),
                left,
                attempt,
            )
            return self._loop(attempt, history, start=True)
        self.proc = AdoptedTorchrun(self, st.get("torchrun_pid"))
        alive = procs.live_processes(st)
        log.info(
            "adopting run %s from lost agent %s: torchrun %s, live processes %s",
            st.get("run_id"),
            lost,
            st.get("torchrun_pid"),
            alive,
        )
        self.save(
            message=f"adopted: agent {lost} was lost; {len(alive)} processes of the run "
            f"still running"
            if alive
            else f"adopted: agent {lost} was lost; reading how the run ended"
        )
        return self._loop(attempt, history, start=False)

    def _prepare_and_run(self) -> int:
        if self.state.get("status") == "queued" and not self._wait_in_queue():
            return 0
        try:
            interrupted = self._prepare_unless_stopped()
        except Exception as e:  # a failed preparation is a failed run, with the reason
            log.exception("prepare failed")
            try:
                if self.store is not None:
                    self.store.save_finding(prepare_finding(e, self.spec.data.path))
            except Exception:
                log.exception("could not store the preparation failure")
            self._close_store()
            self._final_save(status="failed", ended=time.time(), message=f"preparation failed: {e}")
            self.alerts.ended("failed", f"preparation failed: {e}")
            return 1
        if interrupted or self.stop_mode or self.stop_requested():
            self._close_store()
            msg = "stopped before start"
            if interrupted:
                msg += f" (preparation had not finished: {interrupted})"
            self._final_save(status="stopped", ended=time.time(), message=msg)
            self.alerts.ended("stopped", msg)
            return 0
        return self._loop(0, [], start=True)

    def _wait_in_queue(self) -> bool:
        """core/queue: False when a stop ended the wait (the run never started)."""
        stopped = lambda: bool(self.stop_mode or self.stop_requested())  # noqa: E731
        if (
            wait_turn(self.rundir, self.spec, self.state, self.save, self._sleep, stopped)
            is not None
        ):
            return True
        self._close_store()
        self._final_save(status="stopped", ended=time.time(), message="stopped while queued")
        self.alerts.ended("stopped", "stopped while queued")
        return False

    def _prepare_unless_stopped(self) -> str:
        """Prepare in a thread while this one watches for a stop, so a preparation that
        blocks (a slow file system, a data path that never answers) never makes the run
        unstoppable. '' when it finished; what it was doing when a stop came first (the
        thread is abandoned: the agent exits soon after). Raises what preparation raised."""
        box: dict[str, BaseException] = {}

        def work() -> None:
            try:
                self.prepare()
            except BaseException as e:  # handed to the watching thread
                box["error"] = e

        worker = threading.Thread(target=work, name="prepare", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            self.heartbeat()
            if worker.is_alive() and (self.stop_mode or self.stop_requested()):
                log.warning(
                    "stop requested while preparing (%s); not waiting for it",
                    self.base_message or "preparing",
                )
                return self.base_message or "preparing"
        if "error" in box:
            raise box["error"]
        return ""

    def _loop(self, attempt: int, history: list[dict[str, Any]], start: bool) -> int:
        rc: int | None = None
        how = ""
        where: Restart | None = None
        while True:
            if start:
                self.start_torchrun(attempt, where)
            start = True
            rc, how = self.supervise()
            if rc and not self.stop_mode and self.port_moved():
                continue  # the same attempt, on another port: it never began
            entry: dict[str, Any] = {"attempt": attempt, "exit_code": rc, "ended": time.time()}
            if how:
                entry["exit_code_from"] = how
            history.append(entry)
            self.save(attempts=history)
            if rc == 0 or self.stop_mode or attempt >= self.spec.run.max_restarts:
                break
            # A failed attempt: clear what is left of it, pause, start again from where the
            # backend (on several nodes, the head) says it continues.
            self.kill_all()
            _reap()
            attempt += 1
            pause = self.spec.run.restart_pause_s
            where = self.restart_point(attempt)
            self.monitors_restarted(where.step)
            self.save(
                attempt=attempt,
                message=f"attempt {attempt - 1} failed (exit code {rc});"
                f" restart {attempt}/{self.spec.run.max_restarts} in {pause:g}s"
                + (f", {where.note}" if where.note else ""),
            )
            log.info(
                "attempt %d failed with %s; restarting in %.1fs %s",
                attempt - 1,
                rc,
                pause,
                where.note,
            )
            if self.pause_unless_stopped(pause):
                break
        return self.finish(rc, how)

    def launch_command(
        self, node: dict[str, Any], attempt: int, launch_id: str, where: Restart | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """The command torchrun starts with: plan.json's node with the real values of what it
        masks (the run's 0600 secrets.json, tunedeck.core.rundir.secrets), on this agent's
        environment, then the run's own TUNEDECK_* variables, which nothing above overrides
        (the plan puts TUNEDECK_RUN_ID/RUN_DIR last already; an inherited environment or a
        secrets file cannot change them either). `where`: the checkpoint a restart goes on
        from, for a backend that is told it (ms-swift's flag, a script's variable)."""
        argv, node_env = read_secrets(self.rundir).node_command(node)
        env = {**os.environ, **node_env}
        env["TUNEDECK_RUN_ID"] = self.rundir.run_id
        env["TUNEDECK_RUN_DIR"] = str(self.rundir.path)
        env["TUNEDECK_ATTEMPT"] = str(attempt)
        env["TUNEDECK_LAUNCH_ID"] = launch_id
        env.update(queue_env(self.state))  # the GPUs a queued run took
        if where is not None:
            argv = where.argv(argv)
            env.update(where.environ())
        return argv, env

    def restart_point(self, attempt: int) -> Restart:
        """Where attempt N > 0 continues: the backend's reading of the output folder (the
        attempt before it has ended, so the folder holds still while it is read); on several
        nodes, for a trainer told from outside, what the head decided (core/supervisor/restarts)."""
        try:
            mine = backend_of(self.spec).restart(self.spec, self.rundir, attempt)
            if not restarts.agreement_needed(self.spec, mine):
                # the trainer finds its checkpoint itself (the head's rank 0 broadcasts it);
                # the nodes still start after the head's attempt has ended
                if self.spec.cluster.nnodes > 1 and self.node_rank == 0:
                    restarts.announce(self.rundir, attempt, mine)
                elif (
                    self.spec.cluster.nnodes > 1
                    and (head := restarts.head_folder(self.rundir)) is not None
                ):
                    self.wait_for_head(head, attempt)
                return mine
            if self.node_rank == 0:
                return restarts.head_decides(self.rundir, self.spec, mine, attempt)
            head = restarts.head_folder(self.rundir)
            if head is None:
                return restarts.apart_here(mine)
            return restarts.follow(mine, self.wait_for_head(head, attempt))
        except Exception:  # never the run's end: the attempt starts as planned
            log.exception("could not tell where attempt %d continues", attempt)
            return Restart(None, "")

    def wait_for_head(self, head: Path, attempt: int) -> Restart | None:
        """The head's decision for this restart, read from its folder; None when a stop comes
        first or it says nothing within cluster.join_timeout_s (the rendezvous would fail)."""
        launches = [x for x in self.state.get("launches") or [] if isinstance(x, dict)]
        since = float(launches[-1].get("t") or 0) if launches else 0.0
        end = time.monotonic() + self.spec.cluster.join_timeout_s
        self.save(message=f"attempt {attempt - 1} ended; waiting for the head's restart")
        while time.monotonic() < end:
            said = restarts.head_said(head, attempt, since)
            if said is not None:
                return said
            if self.stop_mode or self.stop_requested():
                return None
            self.retry_io()
            self._sleep(TICK_S)
        return None

    def resumed_step(self) -> int:
        """The checkpoint step a run made to resume (train.resume_from) starts after."""
        want = self.spec.train.resume_from
        path = resume_point(want, self.rundir.output_dir(self.spec), 0) if want else None
        return step_of(path) if path else 0

    def monitors_restarted(self, step: int) -> None:
        for m in self.monitors or []:
            if hasattr(m, "restarted"):
                try:
                    m.restarted(step)
                except Exception:
                    log.exception("monitor %s failed at a restart", type(m).__name__)

    def start_torchrun(self, attempt: int, where: Restart | None = None) -> None:
        node = self.plan["nodes"][self.node_rank]
        # the launch is recorded before torchrun exists: a process carrying its marker is
        # then always known to be the run's, even if this agent dies the next instant
        launch_id = secrets.token_hex(8)
        if where is None and attempt > 0:
            where = self.restart_point(attempt)
        launches = [x for x in self.state.get("launches") or [] if isinstance(x, dict)]
        launches.append(
            {
                "id": launch_id,
                "attempt": attempt,
                "boot": procs.boot_id(),
                "after": procs.start_ticks(os.getpid()) or 0,
                "t": time.time(),
            }
        )
        # the step it goes on after (a restart's, or a resumed run's first attempt): where
        # the monitors that number steps themselves count from, an adopting agent's too
        first = where.step if where is not None else self.resumed_step()
        if first:
            launches[-1]["from_step"] = first
        self.save(launches=launches)
        argv, env = self.launch_command(node, attempt, launch_id, where)
        self.log_mark = portmove.log_size(self.rundir.torchrun_log(self.node_rank))
        out = open(self.rundir.torchrun_log(self.node_rank), "ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=node["cwd"],
                env=env,
                start_new_session=True,
            )
        finally:
            out.close()
        pid = self.proc.pid
        table = {
            k: v for k, v in (self.state.get("pid_identity") or {}).items() if k == str(os.getpid())
        }
        ident = procs.identity(pid)
        if ident:
            table[str(pid)] = ident
        launches[-1]["torchrun_pid"] = pid
        changes: dict[str, Any] = dict(
            status="running",
            torchrun_pid=pid,
            pgids=[pid],
            worker_pids=[],
            rank_pids={},
            pid_identity=table,
            launches=launches,
        )
        if attempt == 0 and not self.state.get("started"):
            changes.update(started=time.time(), message="")
        self.rank_of_pid = {}
        self.save(**changes)
        log.info("attempt %d: torchrun pid %d: %s", attempt, pid, " ".join(mask_argv(argv)))

    def port_moved(self) -> bool:
        """torchrun failed to listen on a single-node run's port before any rank started:
        another process took it after the launch picked it. The run moves to a free port."""
        node = self.plan["nodes"][self.node_rank]
        port = portmove.port_of(node)
        moves = list(self.state.get("port_moves") or [])
        log_path = self.rundir.torchrun_log(self.node_rank)
        if (
            port is None
            or self.log_mark is None
            or len(moves) >= portmove.MAX_MOVES
            or self.state.get("worker_pids")
            or not portmove.taken_at_start(log_path, self.log_mark, port)
        ):
            return False
        new = portmove.move(self.rundir, self.plan, node, port)
        moves.append({"from": port, "to": new, "t": time.time()})
        said = f"port {port} was taken before torchrun listened on it; starting on port {new}"
        self.save(master_port=new, port_moves=moves, message=said)
        log.warning("%s", said)
        return True

    def pause_unless_stopped(self, seconds: float) -> bool:
        """Sleep before a restart; True if a stop was asked for meanwhile."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.stop_mode or self.stop_requested():
                self.stop_mode = self.stop_mode or "graceful"
                return True
            self.retry_io()
            self._sleep(min(TICK_S, max(end - time.monotonic(), 0)))
        return False

    def prepare(self) -> None:
        # script runs bring their own model; the others build the demo model on first use
        if traits_of(self.spec.backend).builds_demo_model and self.spec.model.path.startswith(
            "builtin:"
        ):
            self.save(message="building the demo model (first use only)")
            # in a child process: torch and the model would stay in the agent's memory for
            # the whole run (~400 MiB against ~40 without)
            done = subprocess.run(
                [sys.executable, "-c", _BUILD_DEMO, self.spec.data.path],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
            )
            if done.returncode == _BUILD_OS_ERROR:  # the data file: raised here as it was there
                e = json.loads(done.stderr.strip().splitlines()[-1])
                if e["kind"] == "DataFileError":
                    raise DataFileError(e["filename"], e["message"], e["errno"])
                raise OSError(e["errno"], e["strerror"], e["filename"])
            if done.returncode:
                raise RuntimeError(f"building the demo model failed: {done.stderr[-2000:]}")

    def _torchrun_done(self) -> tuple[bool, int | None, str]:
        if isinstance(self.proc, AdoptedTorchrun):
            done = self.proc.check()
            return done, self.proc.returncode, self.proc.how
        assert self.proc is not None
        rc = self.proc.poll()
        return rc is not None, rc, ""

    def supervise(self) -> tuple[int | None, str]:
        assert self.proc is not None
        last_progress = 0.0
        while True:
            began = time.monotonic()
            done, rc, how = self._torchrun_done()
            new = self.ingest(live=True)
            if done:
                return rc, how
            self.retry_io()
            if self.monitors is None and self.store is not None:
                self.monitors = self.make_monitors()
            self.check_stop()
            now = time.time()
            if now - last_progress >= 1.0:
                self.record_pids()
                self.check_db()
                last_progress = now
            self.tick_monitors(now, new)
            self.alerts.tick(now)
            self.median.tick(now)
            # ticks 0.5 s apart, not 0.5 s plus the tick's work: a line waits at most
            # one period before it is in run.db
            self._sleep(max(TICK_S - (time.monotonic() - began), 0.05))

    def heartbeat(self) -> None:
        """state.json's `beat`: the agent is alive and not frozen, even while nothing else
        changes (readers mark a run whose beat is older than 3 × BEAT_S as stale)."""
        now = time.time()
        if now - float(self.state.get("beat") or 0) >= BEAT_S:
            self.save(beat=now)

    def _sleep(self, s: float) -> None:
        self.heartbeat()
        end = time.monotonic() + s
        while time.monotonic() < end and not self.wake:
            time.sleep(0.05)
        self.wake = False

    def tick_monitors(self, now: float, new_events: list[dict[str, Any]]) -> None:
        """Telemetry samplers and live detectors; one failing never disturbs the run, and a
        full disk pauses them all until space returns."""
        if self.store is None or not self.monitors:
            return
        for m in list(self.monitors):
            try:
                m.tick(now, new_events)
            except Exception as e:
                why = io_error(e)
                if why is not None:
                    self._store_failed(why)
                    return
                log.exception("monitor %s failed; disabled", type(m).__name__)
                self.monitors.remove(m)

    def ingest(self, live: bool = False) -> list[dict[str, Any]]:
        """New events; `live`: only the step events the monitors read (each rank's newest,
        every one of the loss watch's rank), the rest never decoded."""
        if self.store is None:
            return []
        try:
            new = self.store.ingest(
                *(
                    (
                        DetectorMonitor.STEPS_PER_TICK,
                        self.node_rank * max(self.spec.cluster.nproc_per_node, 1),
                    )
                    if live
                    else ()
                )
            )
        except Exception as e:
            why = io_error(e)
            if why is None:
                raise
            self._store_failed(why)
            return []
        if new and self.mirror is None and self.node_rank == 0:
            self.mirror = open_mirror(self.spec, self.rundir.path, RunDbPoll(self.rundir.path))
        if self.mirror is not None:
            self.mirror.feed(new)  # never blocks: a full queue drops points, counted
        # rank 0's newest step with a usable step number: looked for from the end
        old = self.state.get("progress") or {}
        prog = next(
            (
                p
                for e in reversed(new)
                if e.get("kind") == "step" and e.get("rank", 0) == 0
                if (p := progress_from_event(e, old)) is not None
            ),
            None,
        )
        if prog is not None:
            self.save(progress=prog)
        return new

    def ingest_all(self) -> list[dict[str, Any]]:
        """Everything the ranks wrote, however much is left."""
        new: list[dict[str, Any]] = []
        while batch := self.ingest():
            new.extend(batch)
        return new

    def record_pids(self) -> None:
        """The ranks (torchrun's children), which rank each runs as, and the process groups
        of everything below torchrun, each with its identity; read from /proc, not by
        walking the process table. torchrun's children are read only while torchrun is
        still the process the run recorded (an adopted one may be long gone)."""
        if not self.proc:
            return
        st = self.state
        old = st.get("pid_identity") or {}
        tr = self.proc.pid
        if tr and procs.is_ours(st, tr):
            workers = proctree.children(tr)
            below = proctree.descendants(tr)
            groups = {tr}
        else:  # torchrun is gone: the ranks it left, if they still are the run's
            workers = procs.ours(st, st.get("worker_pids") or [])
            below = workers + [d for w in workers for d in proctree.descendants(w)]
            groups = set()
        for pid in below:
            try:
                groups.add(os.getpgid(pid))
            except OSError:
                pass
        groups.discard(os.getpgrp())

        def ident(pid: int) -> dict[str, Any] | None:
            known = old.get(str(pid))
            return known if procs.same_process(pid, known) else procs.identity(pid)

        table = {k: v for k, v in old.items() if k in (str(os.getpid()), str(tr))}
        for pid in workers:
            if (i := ident(pid)) is not None:
                table[str(pid)] = i
        pgids = []
        for pgid in sorted(groups):
            if (i := ident(pgid)) is not None:  # a group whose leader lives (and is ours)
                table[str(pgid)] = i
                pgids.append(pgid)
        workers = [p for p in workers if str(p) in table]
        self.rank_of_pid = proctree.ranks_of(workers, self.rank_of_pid)
        # rank → pid: this is the one record of it (monitors, telemetry and stacks read it)
        rank_pids = proctree.rank_table(self.rank_of_pid)
        if (
            workers != st.get("worker_pids")
            or pgids != st.get("pgids")
            or rank_pids != st.get("rank_pids")
            or table != old
        ):
            self.save(worker_pids=workers, pgids=pgids, rank_pids=rank_pids, pid_identity=table)

    def rank_pids(self) -> dict[int, int]:
        return {int(r): pid for r, pid in (self.state.get("rank_pids") or {}).items()}

    def make_monitors(self) -> list:
        """The agent's own monitors and the backend's; they never take the run down."""
        assert self.store is not None
        self.ctx = MonitorContext(
            run=self.rundir,
            spec=self.spec,
            store=self.store,
            node_rank=self.node_rank,
            rank_pids=self.rank_pids,
            stopping=lambda: self.stop_mode is not None,
            signal_ours=procs.signal_ours,
        )
        try:
            return make_monitors(self.ctx)
        except Exception:
            log.exception("monitors could not start; the run goes on without them")
            return []

    # -- stopping -----------------------------------------------------------------------
    def check_stop(self) -> None:
        req = self.rundir.read_stop()
        if self.stop_mode == "graceful_pending":
            req = req or {"mode": "graceful"}
        now = time.monotonic()
        if req and self.stop_deadline is None:
            mode = "hard" if req.get("mode") == "hard" else "graceful"
            grace = _grace(req.get("grace_s"), self.spec.run.stop_grace_s)
            self.grace_s = grace
            self.stop_mode = mode
            by = _stop_cause(req)
            self.save(
                stop_requested=mode, message=f"{mode} stop requested" + (f": {by}" if by else "")
            )
            self.stop_deadline = now if mode == "hard" else now + grace
            log.info("%s stop requested%s", mode, f"; grace {grace:.0f}s" if mode != "hard" else "")
        elif req and req.get("mode") == "hard" and self.stop_mode != "hard":
            self.stop_mode = "hard"
            self.stop_deadline = now
            self.save(stop_requested="hard", message="hard stop requested")
        if (
            self.stop_mode == "graceful"
            and self.stop_deadline is not None
            and now < self.stop_deadline
        ):
            self.term_ranks()
        if (
            self.stop_deadline is not None
            and now >= self.stop_deadline
            and (self.killed_at is None or now - self.killed_at >= 5.0)
        ):
            if self.stop_mode == "graceful" and self.forced is None:
                left, _ = procs.run_processes(self.state, self._roots(), exclude={os.getpid()})
                if left:  # the grace is over and part of the run has not ended by itself
                    self.forced = {"pids": sorted(left), "grace_s": self.grace_s}
                    log.warning(
                        "graceful stop: %d processes still running after %.0fs; SIGKILL",
                        len(left),
                        self.grace_s,
                    )
            log.info("stop: SIGKILL to the whole run")
            self.killed_at = now
            self.kill_all()

    def term_ranks(self) -> None:
        """A graceful stop: SIGTERM to the rank processes themselves (not their groups, whose
        DataLoader workers would die mid-batch); the trainer finishes its step and
        checkpoints. Asked again every tick until the deadline, so ranks that appear after
        the request (a stop in the first second) get it too. The built-in trainer's ranks
        get it once they handle it (it also reads stop.json before its first step); other
        backends' ranks at once."""
        self.record_pids()
        builtin = traits_of(self.spec.backend).rank_handlers
        fresh = [
            p
            for p in self.state.get("worker_pids") or []
            if p not in self.termed and (not builtin or procs.catches(p, signal.SIGTERM))
        ]
        sent = procs.signal_ours(self.state, fresh, signal.SIGTERM)
        if sent:
            self.termed.update(sent)
            log.info("graceful stop: SIGTERM to ranks %s", sent)

    def _roots(self) -> list[int]:
        # torchrun as a root only while it is our unreaped child (its pid cannot be reused)
        return (
            [self.proc.pid]
            if isinstance(self.proc, subprocess.Popen) and self.proc.returncode is None
            else []
        )

    def kill_all(self) -> list[int]:
        return procs.kill_run(self.state, roots=self._roots(), exclude={os.getpid()})

    def _close_store(self) -> None:
        if self.store is not None:
            try:
                self.store.close()
            except Exception:
                log.exception("closing run.db failed")
            self.store = None

    def _final_save(self, **changes: Any) -> None:
        """The run's end must reach state.json: with a full disk, wait for space."""
        self.save(**changes)
        deadline = time.monotonic() + FINAL_WRITE_S
        while self.unsaved and time.monotonic() < deadline:
            time.sleep(IO_RETRY_S)
            self.retry_io(force=True)

    def finish(self, rc: int | None, how: str = "") -> int:
        # ranks orphaned by torchrun (it died first) or late DataLoader workers: none may stay
        leftovers = self.kill_all()
        _reap()
        # a full disk: give run.db a while to take the rest (the end is recorded either way)
        deadline = time.monotonic() + FINAL_INGEST_WAIT_S
        while "run.db" in self.paused and time.monotonic() < deadline:
            time.sleep(IO_RETRY_S)
            self.retry_io(force=True)
        new = self.ingest_all()
        notes: list[str] = []
        for m in self.monitors or []:
            try:
                m.close(new)
                notes += list(getattr(m, "end_notes", None) or [])
            except Exception:
                log.exception("monitor %s failed at close", type(m).__name__)
        # what the monitors wrote as they closed (a backend's last steps, its end) is in
        # run.db too
        self.ingest_all()
        if self.mirror is not None:
            self.mirror.close()
            log.info(
                "trackers: %d points dropped%s",
                self.mirror.dropped,
                "; failed: " + "; ".join(self.mirror.failures) if self.mirror.failures else "",
            )
        self._close_store()
        if self.subreaper:
            # the monitors' own helpers have ended with them: whatever still hangs below the
            # agent is what the run's processes left behind (re-parented to us)
            orphans = [c.pid for c in psutil.Process().children(recursive=True)]
            if orphans:
                log.info("killing %d processes the run left behind: %s", len(orphans), orphans)
            leftovers = sorted(set(leftovers) | set(procs.kill_descendants()))
            _reap()
        req = self.rundir.read_stop()
        if not self.stop_mode and req:
            # asked to stop while no agent watched (an adopted run that ended meanwhile)
            self.stop_mode = "hard" if req.get("mode") == "hard" else "graceful"
        by = _stop_cause(req)
        if self.stop_mode and req and req.get("failed"):
            # the run stopped itself because part of it failed (a node was lost): a failure
            # that names its cause, not a stop someone asked for
            status, msg = (
                "failed",
                f"{by}; the rest of the run was stopped ({self.stop_mode.replace('_pending', '')})",
            )
        elif self.stop_mode and self.forced:
            status = "stopped"
            msg = (
                f"stopped (forced after grace): {len(self.forced['pids'])} processes had "
                f"not ended {self.forced['grace_s']:.0f}s after the graceful stop and were "
                f"killed (SIGKILL), so no final checkpoint was written"
            )
            if by:
                msg += f"; asked by {by}"
        elif self.stop_mode:
            status, msg = "stopped", f"stopped ({self.stop_mode.replace('_pending', '')})"
            if by:
                msg += f": {by}"
        elif rc == 0:
            status, msg = "succeeded", "completed"
        elif rc is None:
            status, msg = (
                "failed",
                f"torchrun ended while no agent watched it; its exit code is unknown ({how})",
            )
        else:
            status, msg = "failed", f"torchrun {exit_words(rc)}"
        if self.adopted and rc is not None and how:
            msg += (
                f"; adopted after its agent was lost: exit code {rc} from what the ranks "
                f"left ({how})"
            )
        for note in notes:  # e.g. a node that could not be reached to stop it
            msg += f"; {note}"
        if leftovers:
            msg += f"; could not kill pids {leftovers}"
        if self.forced:
            self.state["forced_stop"] = self.forced
        if "run.db" in self.paused:
            msg += (
                "; run.db lacks the events written while the disk was full (the event "
                "files have them)"
            )
        elif self.state.get("io_pauses"):
            secs = sum(p["to"] - p["from"] for p in self.state["io_pauses"])
            msg += f"; writes paused {secs:.0f}s for a full disk"
        self.paused.pop("run.db", None)
        self.paused_at.pop("run.db", None)
        self._final_save(
            status=status,
            exit_code=run_exit_code(status, rc),
            ended=time.time(),
            message=msg,
            worker_pids=[],
            survivors=leftovers,
        )
        log.info("run ended: %s (%s)", status, msg)
        self.alerts.ended(status, msg)
        return 0


def exit_words(rc: int) -> str:
    """How a process ended, from Popen's code (a negative one is the signal that ended it)."""
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"was killed by {name} (signal {-rc}; exit code {rc})"
    return f"exited with code {rc}"


PAUSED_WHAT = {"run.db": "run.db ingest and telemetry", "state.json": "state.json writes"}


def _stop_cause(req: dict[str, Any] | None) -> str:
    """Who or what asked for a stop, when the request says (a lost node names itself;
    "head"/"scancel" are only routes and say nothing to the user)."""
    by = (req or {}).get("by")
    return by if isinstance(by, str) and by not in ("head", "scancel") else ""


def _grace(value: Any, default: float) -> float:
    try:
        g = float(value if value is not None else default)
    except (TypeError, ValueError):
        g = float(default)
    return g if g == g and 0 <= g < float("inf") else float(default)


def _space_for(path: Path, probe: int = 64 << 10) -> bool:
    """Is there room next to `path` (its real folder) again? Writes and removes a small file."""
    folder = Path(os.path.realpath(path)).parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=".space.", dir=folder)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * probe)
            f.flush()
            os.fsync(f.fileno())
        return True
    except OSError:
        return False
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def prepare_finding(e: BaseException, data_path: str) -> Finding:
    """What a failed preparation means for the user: a missing or unreadable data file (the
    demo model is built from it), or a demo model that could not be built."""
    # the exception first, then the frames that raised it (the whole traceback is in
    # logs/agent.log); the ^^^ marker lines say nothing on their own
    frames = [
        ln
        for chunk in traceback.format_tb(e.__traceback__)[-3:]
        for ln in chunk.rstrip("\n").splitlines()
        if ln.strip(" ^~")
    ]
    evidence = [f"{type(e).__name__}: {e}", *frames]
    common = dict(severity="error", t=time.time(), source="logs/agent.log", evidence=evidence)
    fname = getattr(e, "filename", None)
    about_data = isinstance(e, OSError) and (fname is None or _same_path(fname, data_path))
    if isinstance(e, FileNotFoundError) and about_data:
        return Finding(
            category="data_missing",
            summary=f"the training data does not exist: {data_path}",
            cause=f"data.path points at {data_path}, which does not exist on this host, so "
            f"nothing could be built or trained; no rank was started.",
            fix="Point data.path at an existing JSONL file (the demo's is "
            "presets/data/demo_chat.jsonl), or copy the data to this host; "
            "`tunedeck preflight SPEC` checks inputs before a launch.",
            **common,
        )
    if about_data and type(e).__name__ == "DataFileError":  # core/demo.py: named what it is
        return Finding(
            category="data_unreadable",
            summary=str(e),
            cause=f"{e}; it was refused before reading (a pipe or a device can block or never "
            f"end), so nothing was built or trained; no rank was started.",
            fix="Point data.path at a regular JSONL file (copy a stream to a file first); "
            "`tunedeck preflight SPEC` checks inputs before a launch.",
            **common,
        )
    if about_data:
        return Finding(
            category="data_unreadable",
            summary=f"the training data cannot be read: {e}",
            cause=f"Reading {data_path} failed ({type(e).__name__}), so the demo model could "
            f"not be built from it; no rank was started.",
            fix="Make the file readable by this user (permissions, a file rather than a "
            "folder, a mounted file system), then launch again.",
            **common,
        )
    if isinstance(e, (OSError, RuntimeError, ValueError)):
        return Finding(
            category="model_unreadable",
            summary=f"the demo model could not be built: {e}",
            cause=f"Building the tiny demo model from {data_path} failed with "
            f"{type(e).__name__}; no rank was started.",
            fix="Check that the cache folder ($TUNEDECK_CACHE, else ~/.cache/tunedeck) is "
            "writable and has free space and that the data file is valid JSONL; "
            "logs/agent.log has the whole traceback.",
            **common,
        )
    return Finding(
        category="prepare_failed",
        summary=f"preparation failed: {type(e).__name__}: {e}",
        cause="The agent failed while preparing the run's assets, before starting torchrun; "
        "no rank was started.",
        fix="Read the traceback in logs/agent.log (the evidence below is its end), fix the "
        "spec or the environment, and launch again.",
        **common,
    )


def _same_path(a: str, b: str) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except (OSError, RuntimeError):
        return str(a) == str(b)


def _become_subreaper() -> bool:
    """Orphaned ranks (and whatever a rank started that left its tree) re-parent to the agent
    instead of init, so it still sees, kills and reaps them. True when the kernel agreed."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str] | None = None) -> int:
    from tunedeck.core.rundir import ownership

    argv = sys.argv[1:] if argv is None else argv
    given = Path(os.path.abspath(argv[0]))  # not resolved: a planted symlink stays one
    adopting = "--adopt" in argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s agent: %(message)s")
    # only the user's own run: its plan is what this agent would run, as this user
    # (core/rundir/ownership.py); refused before anything is locked, read or written
    foreign = ownership.problem(given)
    if foreign is not None:
        log.error("refusing %s: %s; an agent runs only its own user's runs", given, foreign)
        return 2
    run_dir = given.resolve()
    # one agent per run: held for this process's life, released by the kernel at its death
    lock = adopt.lock_owner(run_dir, wait_s=5.0 if adopting else 30.0)
    if lock is None:
        log.info("another agent owns %s; leaving it to that one", run_dir)
        return 0
    if adopting:  # asked by a reader or a remote node: the same gate adopt.request applies
        why = adopt.why_not(run_dir, RunDir(run_dir).read_state() or {})
        if why is not None:
            log.info("not adopting %s: %s", run_dir, why)
            return 0
    agent = None
    try:
        agent = Agent(run_dir)
        return agent.adopt() if adopting else agent.run()
    except Exception:
        traceback.print_exc()
        _record_crash(run_dir, agent)
        return 1


def _record_crash(run_dir: Path, agent: Agent | None) -> None:
    """An unexpected error ended this agent. When processes of the run live on, the run is
    left for the next tunedeck command to adopt (up to adopt.MAX_AGENT_CRASHES times);
    otherwise it failed."""
    msg = "agent crashed: " + traceback.format_exc(limit=1).strip()[-300:]
    try:
        run = RunDir(run_dir)
        state = (agent.state if agent is not None else None) or run.read_state() or {}
        if state.get("status") in TERMINAL:
            return
        if procs.live_processes(state):
            state["agent_crashes"] = int(state.get("agent_crashes") or 0) + 1
            state["message"] = (
                msg + "; its processes live on and the next tunedeck command adopts the run"
            )
        else:
            state.update(status="failed", ended=time.time(), message=msg)
        run.write_state(state)
    except Exception:
        traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
