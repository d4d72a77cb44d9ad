"""The head's side of a multi-node run: one ssh link per other node, and the monitor that the
head's agent ticks (tunedeck.core.supervisor.monitors adds it when cluster.launcher is "ssh").

A link starts its node (op "start" the first time), then receives the node's records into
the head's run directory at the offsets the frames name; when ssh drops it reconnects (op
"attach") and sends the sizes of what it has, so the node resumes from there. Links run in
threads: the monitor's tick only reads their state (it must stay well under 50 ms).

What the monitor decides:
- a node that has not joined when cluster.join_timeout_s has passed: `rendezvous_unreachable`
  naming it (and why, when ssh said);
- a node lost mid-run (its agent died, or no answer for cluster.node_silence_s while no step
  advanced on the head either): `node_lost` naming it, and the rest of the run is stopped. A
  silent link while the head's ranks still step is the link alone (the ranks' collectives
  need every node): the run goes on, the link reconnects and back-fills from its offsets;
- a stop of the head goes to every node; when the head's run ends, the nodes still running are
  stopped, and the links wait (bounded) for the nodes' last records.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.monitoring import MonitorContext
from tunedeck.core.nodes import wire
from tunedeck.core.nodes.remote import TERMINAL, end_attempt_before, node_run_id, write_stop
from tunedeck.core.nodes.roster import Node, roster
from tunedeck.core.nodes.ssh import ssh_argv
from tunedeck.core.rundir import RunDir, read_json, write_json_atomic
from tunedeck.core.spec import RunSpec

log = logging.getLogger("tunedeck.nodes")

RETRY_MAX_S = 5.0
STOP_GRACE_S = 15.0  # a node lost: the others get this long to checkpoint and go
FINAL_WAIT_S = 30.0  # the head's run is over: how long the nodes' last records may take
REMOTE_MODULE = "tunedeck.core.nodes.remote"


def link_file(run: RunDir, node: int) -> Path:
    return run.path / "nodes" / f"node{node}" / "link.json"


def node_state_file(run: RunDir, node: int) -> Path:
    return run.path / "nodes" / f"node{node}" / "state.json"


def shared_marker(run: RunDir) -> dict[str, str]:
    """A file with a fresh token in the run folder: a node that reads it back at the same
    path shares the filesystem, and writes its records here in place of streaming them."""
    import secrets

    path = run.path / "nodes" / "shared-fs.marker"
    token = secrets.token_hex(16)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token, encoding="utf-8")
    return {"path": str(path), "token": token}


class NodeLink(threading.Thread):
    def __init__(
        self, run: RunDir, spec: RunSpec, node: Node, marker: dict[str, str] | None = None
    ):
        super().__init__(name=f"node{node.rank}-link", daemon=True)
        self.marker = marker  # the shared-filesystem test (remote.sees_head_dir)
        self.shared = False  # the node writes its records into our folder
        self.rundir = run
        self.spec = spec
        self.node = node
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.started = False  # the node acknowledged its start once
        self.connected = False
        self.connects = 0
        self.drops = 0
        self.last_seen = time.time()
        self.first_error = ""
        self.last_error = ""
        self.refused = False
        self.gone = ""
        self.gone_at = 0.0
        self.reviving: float | None = None  # since when the head asks the node back
        self.ended = False  # the node's run is over and all was received
        self.quit = threading.Event()
        self.pending_stop: dict[str, Any] | None = None
        self.remote_state: dict[str, Any] = {}
        self.received = 0

    # -- what the monitor asks ---------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "node": self.node.rank,
            "host": self.node.host,
            "connected": self.connected,
            "started": self.started,
            "connects": self.connects,
            "drops": self.drops,
            "last_seen": self.last_seen,
            "error": self.last_error,
            "gone": self.gone,
            "ended": self.ended,
            "bytes": self.received,
            "shared": self.shared,
            "remote_status": self.remote_state.get("status"),
        }

    def stop_node(
        self,
        mode: str,
        grace_s: float | None,
        asked: float | None = None,
        failed_node: int | None = None,
    ) -> None:
        """`failed_node`: the run stops because that node failed (or the head's run ended
        on its own), so the node's record is not a stop someone asked for."""
        cmd = {"op": "stop", "mode": mode, "grace_s": grace_s, "t": asked or time.time()}
        if failed_node is not None:
            cmd["failed_node"] = failed_node
        with self.lock:
            self.pending_stop = cmd  # also sent in the hello of a reconnect
            proc = self.proc
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.write(wire.frame(cmd))
                proc.stdin.flush()
            except (OSError, ValueError):
                pass

    def revive(self) -> None:
        """Ask the node to take part again (its agent adopts its run and starts the next
        attempt); sent now when connected, else in the next hello."""
        with self.lock:
            self.reviving = time.time()
            proc = self.proc
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.write(wire.frame({"op": "revive"}))
                proc.stdin.flush()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        self.quit.set()
        with self.lock:
            proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except OSError:
                pass

    # -- the thread --------------------------------------------------------------------
    def offsets(self) -> dict[str, int]:
        """The sizes of what the head holds: the node resumes after them."""
        out: dict[str, int] = {}
        root = self.rundir.path
        for top in ("logs", "events", "stacks", f"nodes/node{self.node.rank}"):
            for dirpath, _dirs, names in os.walk(root / top):
                for n in names:
                    p = os.path.join(dirpath, n)
                    try:
                        out[os.path.relpath(p, root)] = os.path.getsize(p)
                    except OSError:
                        pass
        return out

    def hello(self) -> dict[str, Any]:
        h: dict[str, Any] = {
            "op": "attach" if self.started else "start",
            "run_id": self.rundir.run_id,
            "node": self.node.rank,
            "home": self.node.home,
            "offsets": self.offsets(),
        }
        if not self.started:
            import sys

            h.update(
                spec=self.rundir.spec.read_text(encoding="utf-8"),
                plan=self.rundir.read_plan(),
                secrets=read_json(self.rundir.secrets, {}),
                head_dir=str(self.rundir.path),
                head_python=sys.executable,
                master_addr=self.spec.cluster.master_addr,
                shared_marker=self.marker,
                master_port=self.spec.cluster.master_port,
            )
        with self.lock:
            if self.pending_stop:
                h["stop"] = self.pending_stop
            if self.reviving is not None:
                h["revive"] = True
        return h

    def run(self) -> None:
        delay = 0.5
        while not self.quit.is_set() and not self.ended:
            if self.gone and self.reviving is None:
                self.quit.wait(0.5)  # nothing to reach until the head asks it back
                continue
            self._connect_once()
            if self.quit.is_set() or self.ended:
                break
            self.quit.wait(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            if self.connected_once_recently():
                delay = 0.5

    def connected_once_recently(self) -> bool:
        return time.time() - self.last_seen < 2.0

    def _connect_once(self) -> None:
        argv = ssh_argv(self.node.host, [self.node.python, "-m", REMOTE_MODULE])
        errlog = self.rundir.path / "logs" / f"ssh-node{self.node.rank}.log"
        err = open(errlog, "ab")
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        except OSError as e:
            self._error(f"ssh could not start: {e}")
            return
        finally:
            err.close()
        with self.lock:
            self.proc = proc
        self.connects += 1
        self.refused = False  # the node said why it refused (kept over ssh's exit)
        try:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(wire.frame(self.hello()))
                proc.stdin.flush()
            except OSError:
                pass
            for line in proc.stdout:
                self._handle(wire.parse(line))
                if self.ended:
                    break
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            with self.lock:
                self.proc = None
            if self.connected and not self.ended:
                self.drops += 1
                log.warning(
                    "node %d (%s): connection dropped (ssh exit %s)",
                    self.node.rank,
                    self.node.host,
                    proc.returncode,
                )
            self.connected = False
            if proc.returncode and not self.ended and not self.refused:
                self._error(_ssh_error(errlog, proc.returncode))  # the newest reason

    def _error(self, why: str) -> None:
        self.last_error = why
        if not self.first_error:
            self.first_error = why

    def _handle(self, msg: dict[str, Any] | None) -> None:
        if msg is None:
            return
        self.last_seen = time.time()
        k = msg.get("k")
        if k == "data":
            rel = wire.safe_rel(msg.get("f"))
            off = msg.get("o")
            if rel is None or not isinstance(off, int) or off < 0:
                return
            import base64

            data = base64.b64decode(msg.get("d") or "")
            wire.write_at(self.rundir.path, rel, off, data)
            self.received += len(data)
        elif k == "state" and isinstance(msg.get("data"), dict):
            self.remote_state = msg["data"]
            write_json_atomic(node_state_file(self.rundir, self.node.rank), self.remote_state)
        elif k == "hello":
            self.shared = bool(msg.get("shared"))
            self.connected = True
            self.started = True
            self.last_error = ""
        elif k == "gone":
            self.gone = str(msg.get("why") or "the node's agent is gone")
            self.gone_at = time.time()
        elif k == "alive":  # an agent owns the node's run again
            self.gone = ""
        elif k == "end":
            self.ended = True
        elif k == "error":
            self.refused = True
            self._error(str(msg.get("why") or "the node refused"))


def _died_fix(k: int) -> str:
    return (
        f"Look at node {k}'s logs (logs/node{k}/, logs/agent-node{k}.log) for why it died "
        f"(OOM killer, hardware, preemption); resume the run from its newest checkpoint once "
        f"the node is back (run.max_restarts > 0 does it by itself)."
    )


def _ssh_error(errlog: Path, rc: int) -> str:
    try:
        with open(errlog, "rb") as f:
            f.seek(max(0, errlog.stat().st_size - 2000))
            lines = [x.strip() for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        lines = []
    last = lines[-1] if lines else ""
    return f"ssh exited with {rc}" + (f": {last}" if last else "")


class NodesMonitor:
    """Ticked by the head's agent: starts the links, writes what they know to
    nodes/node<k>/link.json, turns missing and lost nodes into findings, carries stops."""

    def __init__(self, ctx: MonitorContext):
        self.ctx = ctx
        self.spec: RunSpec = ctx.spec
        self.run: RunDir = ctx.run
        self.t0 = time.time()
        marker = shared_marker(self.run)
        self.links = [NodeLink(self.run, self.spec, n, marker) for n in roster(self.spec)[1:]]
        self.written: dict[int, dict] = {}
        self.reported: set[tuple[str, int]] = set()
        self.stop_sent: str | None = None
        self.end_notes: list[str] = []  # said in the run's end message (the agent adds)
        self.head_stopped_for: str | None = None
        self.closing = False  # the head's run is over (close): stop.json needs no signal
        self.silence_s = float(self.spec.cluster.node_silence_s)
        self.stepped = time.time()  # this node's newest step: the collectives still advance
        for link in self.links:
            link.start()

    # -- the tick ----------------------------------------------------------------------
    def tick(self, now: float, new_events: list[dict]) -> None:
        if any(e.get("kind") == "step" for e in new_events):
            self.stepped = now
        if self.ctx.stopping():
            self._forward_stop()
        for link in self.links:
            self._write(link)
            self._judge(link, now)

    def close(self, new_events: list[dict]) -> None:
        """The head's run is over: the nodes still running stop too; wait (bounded) for the
        last records, then hang up."""
        self.closing = True
        req = self.run.read_stop() or {}
        mode = "hard" if req.get("mode") == "hard" else "graceful"
        # no stop asked: the head's run ended by itself (its ranks failed, or finished first)
        failed = _failed_node(req) if req else 0
        for link in self.links:
            if not link.ended and not link.gone:
                link.stop_node(
                    mode,
                    req.get("grace_s") if mode == "graceful" else None,
                    req.get("t"),
                    failed,
                )
        grace = (
            0.0
            if mode == "hard"
            else float(req.get("grace_s") or min(self.spec.run.stop_grace_s, 60.0))
        )
        deadline = time.monotonic() + grace + FINAL_WAIT_S
        # a node silent for cluster.node_silence_s from now is not waited for (named below);
        # one back before (an ssh outage) gets the stop in its next hello and sends the rest
        since = time.time()
        while time.monotonic() < deadline and any(
            not (k.ended or k.gone)
            and (
                k.connected or k.started and time.time() - max(k.last_seen, since) < self.silence_s
            )
            for k in self.links
        ):
            time.sleep(0.2)
        now = time.time()
        for link in self.links:
            self._judge(link, now, final=True)
            link.close()
            self._write(link, force=True)
            if link.reviving is not None and not self.head_stopped_for:
                self.end_notes.append(
                    f"node {link.node.rank} ({link.node.host}) was lost and had not come back"
                )
            elif link.started and not link.ended and not link.gone:
                self._unstopped(link, now)

    def _unstopped(self, link: NodeLink, now: float) -> None:
        """The run is over here, but this node never said its part ended: name it."""
        k, host = link.node.rank, link.node.host
        why = link.last_error or f"no answer for {now - link.last_seen:.0f}s"
        self.end_notes.append(f"node {k} ({host}) could not be reached to stop it: {why}")
        self._finding(
            Finding(
                category="node_not_stopped",
                severity="warning",
                summary=f"node {k} ({host}) could not be reached to stop it: {why}",
                cause=f"The run ended on this node, but node {k} did not confirm that its part "
                f"ended; its processes may still run there.",
                fix=f"ssh {host} and run `tunedeck stop {node_run_id(self.run.run_id, k)}` "
                f"(with that node's TUNEDECK_HOME), or kill its ranks by hand.",
                node=k,
                host=host,
                t=now,
                evidence=[why],
                source=f"nodes/node{k}/link.json",
            )
        )

    # -- what the tick decides -----------------------------------------------------------
    def _forward_stop(self) -> None:
        req = self.run.read_stop() or {"mode": "graceful"}
        mode = "hard" if req.get("mode") == "hard" else "graceful"
        if self.stop_sent == mode or self.stop_sent == "hard":
            return
        self.stop_sent = mode
        for link in self.links:
            link.stop_node(mode, req.get("grace_s"), req.get("t"), _failed_node(req))

    def _write(self, link: NodeLink, force: bool = False) -> None:
        st = link.status()
        key = {k: v for k, v in st.items() if k not in ("last_seen", "bytes")}
        if force or self.written.get(link.node.rank) != key:
            self.written[link.node.rank] = key
            write_json_atomic(link_file(self.run, link.node.rank), st)

    def joined(self, node: int) -> bool:
        """torchrun makes a node's rank log folders once the rendezvous let it in."""
        d = self.run.node_log_dir(node)
        try:
            return any(d.iterdir())
        except OSError:
            return False

    def _judge(self, link: NodeLink, now: float, final: bool = False) -> None:
        k = link.node.rank
        join_s = self.spec.cluster.join_timeout_s
        if (
            ("join", k) not in self.reported
            and not self.joined(k)
            and (now - self.t0 >= join_s or (final and now - self.t0 >= join_s * 0.9))
        ):
            self.reported.add(("join", k))
            why = (
                link.first_error
                or link.last_error
                or (
                    "its agent started but its torchrun did not reach the rendezvous at "
                    f"{self.spec.cluster.master_addr}:{self.spec.cluster.master_port}"
                    if link.started
                    else "it was never reached"
                )
            )
            self._finding(
                Finding(
                    category="rendezvous_unreachable",
                    severity="error",
                    summary=f"node {k} ({link.node.host}) did not join the rendezvous within "
                    f"{join_s}s: {why}",
                    cause=f"Node {k} never joined: {why}. The other nodes wait for every node "
                    f"until cluster.join_timeout_s, then torchrun gives up.",
                    fix=f"Check that `ssh {link.node.host}` works without a prompt from this "
                    f"node, that tunedeck and the same torch are installed there "
                    f"(cluster.remote_python), and that it reaches "
                    f"{self.spec.cluster.master_addr}:{self.spec.cluster.master_port} "
                    f"(firewall, cluster.master_addr, cluster.interface); "
                    f"`tunedeck preflight` checks each node.",
                    node=k,
                    host=link.node.host,
                    t=now,
                    evidence=[why],
                    source=f"logs/ssh-node{k}.log",
                )
            )
        if not self.joined(k):
            return
        if final:
            self._judge_end(link, now)
            return
        if self.ctx.stopping():
            return  # stopping: a node not reached is named at close
        host = link.node.host
        if link.reviving is not None:
            self._judge_revival(link, now)
            return
        if ("lost", k) in self.reported:
            return
        lost = ""
        status = link.remote_state.get("status")
        if link.gone:
            lost = link.gone
        elif (
            not link.connected
            and now - link.last_seen > self.silence_s
            and now - self.stepped > self.silence_s  # the link alone is down: ranks step
            and not link.ended
        ):
            lost = f"no answer for {now - link.last_seen:.0f}s" + (
                f" ({link.last_error})" if link.last_error else ""
            )
        elif status in TERMINAL and status != "succeeded":
            lost = f"its run ended {status}: {link.remote_state.get('message') or ''}".strip()
        if not lost:
            return
        self.reported.add(("lost", k))
        lost_at = link.gone_at if link.gone else link.last_seen
        if status not in TERMINAL and self._restart_left(lost_at):
            # restarts left: the run goes on when the node is back (its agent adopts its
            # run and starts the next attempt; the head's next attempt hosts the rendezvous
            # again and waits up to join_timeout_s; rank 0 resumes from the newest checkpoint)
            self._finding(
                Finding(
                    category="node_lost",
                    severity="warning",
                    summary=f"node {k} ({host}) was lost mid-run: {lost}; the run restarts "
                    f"from its newest checkpoint once the node is back",
                    cause=f"Node {k} stopped taking part in the run ({lost}). run.max_restarts "
                    f"allows another attempt: the head asks node {k} back over ssh and "
                    f"every node starts the next attempt, which resumes from the newest "
                    f"checkpoint.",
                    fix=f"Nothing, if the node comes back within cluster.join_timeout_s "
                    f"({self.spec.cluster.join_timeout_s}s); else look at node {k}'s logs "
                    f"(logs/node{k}/, logs/agent-node{k}.log) for why it died.",
                    node=k,
                    host=host,
                    t=now,
                    evidence=[lost],
                    source=f"nodes/node{k}/link.json",
                )
            )
            self._end_attempt(lost_at)
            link.revive()
            return
        self._lost_for_good(
            link,
            now,
            lost,
            cause=f"Node {k} stopped taking part in the run ({lost}); the ranks of the other "
            f"nodes cannot finish a collective without it, so they were stopped.",
            fix=_died_fix(k),
        )

    def _judge_end(self, link: NodeLink, now: float) -> None:
        """The head's run is over. A node whose agent died while its run was not (the
        streamer's `gone`) is named lost even when no tick saw it first: the head's ranks fail
        within a second of the node's, before the link may have told the head."""
        k = link.node.rank
        if not link.gone or link.reviving is not None or ("lost", k) in self.reported:
            return
        self.reported.add(("lost", k))
        self._lost_for_good(
            link,
            now,
            link.gone,
            cause=f"Node {k} stopped taking part in the run ({link.gone}); the ranks of the "
            f"other nodes could not finish a collective without it.",
            fix=_died_fix(k),
        )

    def _judge_revival(self, link: NodeLink, now: float) -> None:
        """A node asked back: back once an agent owns its run again and the link is up; not
        back within join_timeout_s (what the head's attempt waits at the rendezvous) ends the
        run as a failure that names it."""
        k, host = link.node.rank, link.node.host
        assert link.reviving is not None
        if not link.gone and link.connected:
            log.info("node %d (%s) is back after %.1fs", k, host, now - link.reviving)
            link.reviving = None
            self.reported.discard(("lost", k))
            return
        join_s = self.spec.cluster.join_timeout_s
        if now - link.reviving < join_s or ("gone for good", k) in self.reported:
            return
        self.reported.add(("gone for good", k))
        why = f"it did not come back within {join_s}s" + (
            f" ({link.last_error or link.gone})" if link.last_error or link.gone else ""
        )
        self._lost_for_good(
            link,
            now,
            why,
            cause=f"Node {k} was lost and asked back for the next attempt, but {why}; the "
            f"other nodes cannot train without it, so they were stopped.",
            fix=f"Bring node {k} back (or replace it in cluster.hosts) and resume the run "
            f"from its newest checkpoint (`tunedeck resume`).",
        )

    def _restart_left(self, lost_at: float) -> bool:
        """Will the head run another attempt with the node back? Yes while run.max_restarts
        allows one more, or when its current attempt started after the loss (its ranks
        failed first and it restarted already: that attempt waits for the node)."""
        st = self.run.read_state() or {}
        attempt = int(st.get("attempt") or 0)
        launches = [x for x in st.get("launches") or [] if isinstance(x, dict)]
        since = float(launches[-1].get("t") or 0) if launches else 0.0
        return attempt < self.spec.run.max_restarts or (attempt > 0 and since >= lost_at)

    def _end_attempt(self, lost_at: float) -> None:
        """The head's attempt that ran with the lost node cannot finish a collective (its
        ranks may hang in one): SIGKILL it, so the agent starts the next attempt. An attempt
        started after the loss is that next attempt, waiting at the rendezvous: left alone."""
        killed = end_attempt_before(self.run, self.ctx, lost_at)
        if killed:
            log.warning("ended the head's attempt (pids %s) for the lost node", killed)

    def _stop_head(self, why: str, node: int) -> None:
        """stop.json names the node (the agent's status line and end message say it), and
        `failed` makes the end a failure, not a stop someone asked for."""
        if self.head_stopped_for or self.ctx.stopping():
            return
        self.head_stopped_for = why
        log.warning("%s: stopping the other nodes", why)
        write_stop(self.run, "graceful", STOP_GRACE_S, by=why, node=node)
        if not self.closing:  # closing: the agent reads stop.json once its monitors closed
            os.kill(os.getpid(), signal.SIGUSR1)  # the agent (this process) reads it now

    def _lost_for_good(self, link: NodeLink, now: float, why: str, cause: str, fix: str) -> None:
        """A node the run cannot go on without: the finding names it, and the other nodes
        are stopped with the same words."""
        k, host = link.node.rank, link.node.host
        summary = f"node {k} ({host}) was lost mid-run: {why}"
        self._finding(
            Finding(
                category="node_lost",
                severity="error",
                summary=summary,
                cause=cause,
                fix=fix,
                node=k,
                host=host,
                t=now,
                evidence=[why],
                source=f"nodes/node{k}/link.json",
            )
        )
        self._stop_head(summary, k)

    def _finding(self, f: Finding) -> None:
        log.warning("finding %s: %s", f.category, f.summary)
        try:
            self.ctx.store.save_finding(f)
        except Exception:
            log.exception("could not store the finding")


def read_links(run: RunDir) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for p in sorted((run.path / "nodes").glob("node*/link.json")):
        d = read_json(p)
        if isinstance(d, dict) and isinstance(d.get("node"), int):
            out[d["node"]] = d
    return out


__all__ = ["NodesMonitor", "NodeLink", "read_links", "link_file", "node_state_file", "node_run_id"]


def _failed_node(req: dict) -> int | None:
    """The node a stop.json says the run stops for (written by `remote.write_stop`), or None
    for a stop someone asked for."""
    if not req.get("failed"):
        return None
    node = req.get("node")
    return node if isinstance(node, int) and not isinstance(node, bool) else 0
