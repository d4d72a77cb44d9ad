"""The per-node agent: owns one run from start to end, whether or not anyone is watching.

Started detached by `tunedeck launch` (`python -m tunedeck.core.runs.agent RUN_DIR`). It
  1. takes ownership (writes its pid into state.json),
  2. prepares assets (builds the demo model on first use: plans never build anything),
  3. starts torchrun as its child in a new process group, output to files,
  4. every tick: ingests rank events into run.db, records which pid runs which rank and the
     progress in state.json, acts on stop requests (stop.json, or SIGTERM/SIGUSR1 to the
     agent), and runs the monitors (telemetry, detectors, log diagnosis, backend ingesters),
  5. when torchrun ends: final ingest, kills any leftover process of the run, records the
     final status and exit code.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.rundir import RunDir
from tunedeck.core.runs import procs
from tunedeck.core.runs.monitors import MonitorContext, make_monitors
from tunedeck.core.runs.store import Store
from tunedeck.core.spec import load_spec
from tunedeck.core.telemetry import proctree

log = logging.getLogger("tunedeck.agent")

TICK_S = 0.5


class Agent:
    def __init__(self, run_dir: Path):
        self.rundir = RunDir(run_dir)
        self.state: dict[str, Any] = self.rundir.read_state() or {}
        self.spec = load_spec(self.rundir.spec)
        self.plan = self.rundir.read_plan()      # read once: fixed for the run's life
        self.node_rank = self.spec.cluster.node_rank
        self.proc: subprocess.Popen | None = None
        self.wake = False
        self.stop_mode: str | None = None
        self.stop_deadline: float | None = None
        self.store: Store | None = None
        self.monitors: list = []
        self.rank_of_pid: dict[int, int | None] = {}   # the ranks' RANK, read once per pid

    # -- state --------------------------------------------------------------------------
    def save(self, **changes: Any) -> None:
        self.state.update(changes)
        self.rundir.write_state(self.state)

    def stop_requested(self) -> bool:
        return self.rundir.stop_request.exists()

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
    def run(self) -> int:
        me = psutil.Process()
        self.save(agent_pid=os.getpid(), agent_pgid=os.getpgrp(),
                  agent_create_time=me.create_time(), status="pending",
                  message="preparing")
        _become_subreaper()
        self.install_signals()
        # open before preparing: a failed preparation is stored as a finding, so
        # `tunedeck diagnose` and the monitor show its cause and fix like any other failure
        self.store = Store(self.rundir, write=True)
        try:
            self.prepare()
        except Exception as e:  # a failed preparation is a failed run, with the reason
            log.exception("prepare failed")
            try:
                self.store.save_finding(prepare_finding(e, self.spec.data.path))
            except Exception:
                log.exception("could not store the preparation failure")
            self.store.close()
            self.save(status="failed", ended=time.time(), message=f"preparation failed: {e}")
            return 1
        if self.stop_mode or self.stop_requested():
            self.store.close()
            self.save(status="stopped", ended=time.time(), message="stopped before start")
            return 0
        attempt, history = 0, []
        while True:
            self.start_torchrun(attempt)
            if attempt == 0:
                self.monitors = self.make_monitors()
            rc = self.supervise()
            history.append({"attempt": attempt, "exit_code": rc, "ended": time.time()})
            self.save(attempts=history)
            if rc == 0 or self.stop_mode or attempt >= self.spec.run.max_restarts:
                break
            # A failed attempt: clear what is left of it, pause, start again. The trainer
            # resumes from its newest checkpoint when TUNEDECK_ATTEMPT > 0.
            self.kill_all()
            _reap()
            attempt += 1
            pause = self.spec.run.restart_pause_s
            self.save(attempt=attempt, message=f"attempt {attempt - 1} failed (exit code {rc});"
                      f" restart {attempt}/{self.spec.run.max_restarts} in {pause:g}s")
            log.info("attempt %d failed with %d; restarting in %.1fs", attempt - 1, rc, pause)
            if self.pause_unless_stopped(pause):
                break
        return self.finish(rc)

    def start_torchrun(self, attempt: int) -> None:
        node = self.plan["nodes"][self.node_rank]
        env = dict(os.environ)
        env.update(self.spec.env)  # plan.json has secrets masked; take real values from spec
        env.update({k: v for k, v in node["env"].items() if k not in self.spec.env})
        env["TUNEDECK_ATTEMPT"] = str(attempt)
        out = open(self.rundir.torchrun_log(self.node_rank), "ab")
        try:
            self.proc = subprocess.Popen(node["argv"], stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, cwd=node["cwd"], env=env,
                                         start_new_session=True)
        finally:
            out.close()
        changes: dict[str, Any] = dict(status="running", torchrun_pid=self.proc.pid,
                                       pgids=[self.proc.pid], worker_pids=[], rank_pids={})
        if attempt == 0:
            changes.update(started=time.time(), message="")
        self.save(**changes)
        log.info("attempt %d: torchrun pid %d: %s", attempt, self.proc.pid, " ".join(node["argv"]))

    def pause_unless_stopped(self, seconds: float) -> bool:
        """Sleep before a restart; True if a stop was asked for meanwhile."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.stop_mode or self.stop_requested():
                self.stop_mode = self.stop_mode or "graceful"
                return True
            self._sleep(min(TICK_S, max(end - time.monotonic(), 0)))
        return False

    def prepare(self) -> None:
        # script runs bring their own model; the others build the demo model on first use
        if self.spec.backend != "script" and self.spec.model.path.startswith("builtin:"):
            self.save(message="building the demo model (first use only)")
            from tunedeck.core.demo import ensure_tiny_model

            ensure_tiny_model(self.spec.data.path)

    def supervise(self) -> int:
        assert self.proc is not None
        last_progress = 0.0
        while True:
            rc = self.proc.poll()
            new = self.ingest()
            if rc is not None:
                return rc
            self.check_stop()
            now = time.time()
            if now - last_progress >= 1.0:
                self.record_pids()
                last_progress = now
            self.tick_monitors(now, new)
            self._sleep(TICK_S)

    def _sleep(self, s: float) -> None:
        end = time.monotonic() + s
        while time.monotonic() < end and not self.wake:
            time.sleep(0.05)
        self.wake = False

    def tick_monitors(self, now: float, new_events: list[dict[str, Any]]) -> None:
        """Telemetry samplers and live detectors; one failing never disturbs the run."""
        for m in list(self.monitors):
            try:
                m.tick(now, new_events)
            except Exception:
                log.exception("monitor %s failed; disabled", type(m).__name__)
                self.monitors.remove(m)

    def ingest(self) -> list[dict[str, Any]]:
        assert self.store is not None
        new = self.store.ingest()
        steps = [e for e in new if e.get("kind") == "step" and e.get("rank", 0) == 0]
        if steps:
            e = steps[-1]
            prog = dict(self.state.get("progress") or {})
            prog.update(step=e.get("step"), loss=e.get("loss"), lr=e.get("lr"),
                        tokens_per_s=e.get("tokens_per_s"), t=e.get("t"))
            self.save(progress=prog)
        return new

    def record_pids(self) -> None:
        """The ranks (torchrun's children), which rank each runs as, and the process groups
        of everything below torchrun; read from /proc, not by walking the process table."""
        if not self.proc:
            return
        workers = proctree.children(self.proc.pid)
        pgids = {self.proc.pid}
        for pid in proctree.descendants(self.proc.pid):
            try:
                pgids.add(os.getpgid(pid))
            except OSError:
                pass
        pgids.discard(os.getpgrp())
        known = self.rank_of_pid
        self.rank_of_pid = {pid: known[pid] if pid in known else proctree.rank_of(pid)
                            for pid in workers}
        # rank → pid: this is the one record of it (monitors, telemetry and stacks read it)
        rank_pids = {str(r if r is not None else i): pid
                     for i, (pid, r) in enumerate(self.rank_of_pid.items())}
        if workers != self.state.get("worker_pids") or sorted(pgids) != self.state.get("pgids") \
                or rank_pids != self.state.get("rank_pids"):
            self.save(worker_pids=workers, pgids=sorted(pgids), rank_pids=rank_pids)

    def rank_pids(self) -> dict[int, int]:
        return {int(r): pid for r, pid in (self.state.get("rank_pids") or {}).items()}

    def make_monitors(self) -> list:
        """The agent's own monitors and the backend's; they never take the run down."""
        assert self.store is not None
        ctx = MonitorContext(run=self.rundir, spec=self.spec, store=self.store,
                             node_rank=self.node_rank, rank_pids=self.rank_pids,
                             stopping=lambda: self.stop_mode is not None)
        try:
            return make_monitors(ctx)
        except Exception:
            log.exception("monitors could not start; the run goes on without them")
            return []

    # -- stopping -----------------------------------------------------------------------
    def check_stop(self) -> None:
        req = self.rundir.read_stop()
        if self.stop_mode == "graceful_pending":
            req = req or {"mode": "graceful"}
        if req and self.stop_deadline is None:
            mode = req.get("mode", "graceful")
            grace = float(req.get("grace_s", self.spec.run.stop_grace_s))
            self.stop_mode = mode
            self.save(stop_requested=mode, message=f"{mode} stop requested")
            if mode == "hard":
                self.stop_deadline = time.monotonic()
            else:
                # SIGTERM to the rank processes themselves (not their groups, whose DataLoader
                # workers would die mid-batch); the trainer finishes its step and checkpoints
                self.record_pids()
                procs.signal_pids(self.state.get("worker_pids", []), signal.SIGTERM)
                self.stop_deadline = time.monotonic() + grace
                log.info("graceful stop: SIGTERM to ranks %s, grace %.0fs",
                         self.state.get("worker_pids"), grace)
        elif req and req.get("mode") == "hard" and self.stop_mode != "hard":
            self.stop_mode = "hard"
            self.stop_deadline = time.monotonic()
            self.save(stop_requested="hard", message="hard stop requested")
        if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
            log.info("stop: SIGKILL to the whole run")
            self.kill_all()

    def kill_all(self) -> list[int]:
        roots = [self.proc.pid] if self.proc else []
        return procs.kill_run(self.state["run_id"], pgids=self.state.get("pgids", []),
                              roots=roots, exclude={os.getpid()})

    def finish(self, rc: int) -> int:
        # ranks orphaned by torchrun (it died first) or late DataLoader workers: none may stay
        leftovers = self.kill_all()
        _reap()
        new: list[dict[str, Any]] = []
        while batch := self.ingest():   # everything the ranks wrote, however much is left
            new.extend(batch)
        for m in self.monitors:
            try:
                m.close(new)
            except Exception:
                log.exception("monitor %s failed at close", type(m).__name__)
        if self.store:
            self.store.close()
        if self.stop_mode:
            status, msg = "stopped", f"stopped ({self.stop_mode.replace('_pending', '')})"
        elif rc == 0:
            status, msg = "succeeded", "completed"
        else:
            status, msg = "failed", f"torchrun exited with code {rc}"
        if leftovers:
            msg += f"; could not kill pids {leftovers}"
        self.save(status=status, exit_code=rc, ended=time.time(), message=msg,
                  worker_pids=[])
        log.info("run ended: %s (%s)", status, msg)
        return 0


def prepare_finding(e: BaseException, data_path: str) -> Finding:
    """What a failed preparation means for the user: a missing or unreadable data file (the
    demo model is built from it), or a demo model that could not be built."""
    # the exception first, then the frames that raised it (the whole traceback is in
    # logs/agent.log); the ^^^ marker lines say nothing on their own
    frames = [ln for chunk in traceback.format_tb(e.__traceback__)[-3:]
              for ln in chunk.rstrip("\n").splitlines() if ln.strip(" ^~")]
    evidence = [f"{type(e).__name__}: {e}", *frames]
    common = dict(severity="error", t=time.time(), source="logs/agent.log", evidence=evidence)
    fname = getattr(e, "filename", None)
    about_data = isinstance(e, OSError) and (fname is None or _same_path(fname, data_path))
    if isinstance(e, FileNotFoundError) and about_data:
        return Finding(
            category="data_missing", summary=f"the training data does not exist: {data_path}",
            cause=f"data.path points at {data_path}, which does not exist on this host, so "
                  f"nothing could be built or trained; no rank was started.",
            fix="Point data.path at an existing JSONL file (the demo's is "
                "presets/data/demo_chat.jsonl), or copy the data to this host; "
                "`tunedeck preflight SPEC` checks inputs before a launch.", **common)
    if about_data:
        return Finding(
            category="data_unreadable", summary=f"the training data cannot be read: {e}",
            cause=f"Reading {data_path} failed ({type(e).__name__}), so the demo model could "
                  f"not be built from it; no rank was started.",
            fix="Make the file readable by this user (permissions, a file rather than a "
                "folder, a mounted file system), then launch again.", **common)
    if isinstance(e, (OSError, RuntimeError, ValueError)):
        return Finding(
            category="model_unreadable", summary=f"the demo model could not be built: {e}",
            cause=f"Building the tiny demo model from {data_path} failed with "
                  f"{type(e).__name__}; no rank was started.",
            fix="Check that the cache folder ($TUNEDECK_CACHE, else ~/.cache/tunedeck) is "
                "writable and has free space and that the data file is valid JSONL; "
                "logs/agent.log has the whole traceback.", **common)
    return Finding(
        category="prepare_failed", summary=f"preparation failed: {type(e).__name__}: {e}",
        cause="The agent failed while preparing the run's assets, before starting torchrun; "
              "no rank was started.",
        fix="Read the traceback in logs/agent.log (the evidence below is its end), fix the "
            "spec or the environment, and launch again.", **common)


def _same_path(a: str, b: str) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except (OSError, RuntimeError):
        return str(a) == str(b)


def _become_subreaper() -> None:
    """Orphaned ranks re-parent to the agent instead of init, so it still sees and reaps them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0]).resolve()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s agent: %(message)s")
    try:
        return Agent(run_dir).run()
    except Exception:
        traceback.print_exc()
        run = RunDir(run_dir)
        state = run.read_state() or {}
        state.update(status="failed", ended=time.time(),
                     message="agent crashed: " + traceback.format_exc(limit=1).strip()[-300:])
        run.write_state(state)
        return 1


if __name__ == "__main__":
    sys.exit(main())
