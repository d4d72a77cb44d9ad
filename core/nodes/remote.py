"""The node side of a multi-node run: `python -m tunedeck.core.nodes.remote`, started by the
head over ssh (tunedeck.core.nodes.link), its first stdin line a JSON hello.

  op "start"   make this node's run folder (<TUNEDECK_HOME>/runs/<run id>.node<k>) from the
               head's spec, plan and secrets, start a detached agent for node k, then stream
  op "attach"  the run is here already (a reconnect): stream from the head's offsets

The agent is detached (own session, output to a file), so a dropped ssh connection ends only
this streamer: the node's run goes on, its records wait in its own run folder, and the next
attach sends what the head lacks. The folder has its own run id (".node<k>"): its processes
carry that id, so a stop sweep on one node never reaches another's ranks, even where two
"nodes" share one kernel (containers, network namespaces).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

from tunedeck.core.monitoring import MonitorContext
from tunedeck.core.nodes import wire
from tunedeck.core.nodes.folders import node_run_id
from tunedeck.core.nodes.roster import IFNAME_KEYS, local_addr_index
from tunedeck.core.rundir import (
    FILE_MODE,
    TERMINAL,
    RunDir,
    ownership,
    write_json_atomic,
    write_text_private,
)
from tunedeck.core.rundir.records import run_exit_code
from tunedeck.core.telemetry.store import read_latest_file

TICK_S = 0.25
TELEMETRY_S = 2.0
AGENT_MODULE = "tunedeck.core.supervisor.agent"


def route_addr(host: str, port: int) -> str | None:
    """This machine's address on the way to host:port (no packet is sent: a UDP connect
    only picks the route)."""
    try:
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect((host, port or 9))
            return s.getsockname()[0]
    except OSError:
        return None


def _rewrite(obj: Any, old: str, new: str) -> Any:
    """Every string that names the head's run folder names this node's instead."""
    if isinstance(obj, str):
        return new + obj[len(old) :] if obj == old or obj.startswith(old + "/") else obj
    if isinstance(obj, list):
        return [_rewrite(x, old, new) for x in obj]
    if isinstance(obj, dict):
        return {k: _rewrite(v, old, new) for k, v in obj.items()}
    return obj


def sees_head_dir(marker: Any) -> bool:
    """Is the head's run folder on a filesystem this node shares, at the same path? The head
    wrote a marker file with a fresh token there; this node reads it back."""
    if not isinstance(marker, dict) or not isinstance(marker.get("path"), str):
        return False
    try:
        with open(marker["path"], encoding="utf-8") as f:
            return f.read().strip() == str(marker.get("token") or "")
    except OSError:
        return False


def share_records(run: RunDir, head_dir: str, node: int, nproc: int) -> None:
    """The head's run folder is visible here: this node's records are written straight into
    it, where the head reads them in place (its rank logs, its torchrun and agent logs, its
    ranks' event files, its telemetry), through links from this node's own folder. Nothing
    of them is streamed (the streamer skips links)."""
    head = Path(head_dir)
    targets = {
        run.logs / f"node{node}": head / "logs" / f"node{node}",
        run.torchrun_log(node): head / "logs" / f"torchrun-node{node}.log",
        run.agent_log: head / "logs" / f"agent-node{node}.log",
        run.path / "telemetry.jsonl": head / "nodes" / f"node{node}" / "telemetry.jsonl",
    }
    for r in range(node * nproc, (node + 1) * nproc):
        targets[run.event_file(r)] = head / "events" / f"rank{r}.jsonl"
    for mine, theirs in targets.items():
        if theirs.suffix:  # a file: made now, so no reader meets a dangling link
            theirs.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(theirs, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE))
        else:
            theirs.mkdir(parents=True, exist_ok=True)
        mine.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(theirs, mine)


def shared(run: RunDir) -> bool:
    """Does this node write its records into the head's folder (share_records)?"""
    return run.agent_log.is_symlink()


def own_interface(spec: dict, env: dict, master: str) -> None:
    """Where the spec names no interface (cluster.interface, or the variable in its env):
    this node's ranks talk through the one it routes to `master` through, whatever the head
    chose (roster.auto_interface: an interface of the head's, maybe named otherwise here) or
    could not choose (under Slurm the head is a login node that knows no master yet)."""
    from tunedeck.core.nodes.iface import route_interface

    if spec.get("cluster", {}).get("interface") or not master:
        return
    mine = route_interface(master)
    user_env = spec.get("env") or {}
    for key in IFNAME_KEYS:
        if key not in user_env and mine:
            env[key] = mine


def net_record(spec: dict, env: dict, master: str) -> dict:
    """state.json `net` of this node: what its ranks start with (iface.record)."""
    from tunedeck.core.nodes.iface import record

    return record(master, env, str(spec.get("cluster", {}).get("dist_backend") or ""))


def materialise(run: RunDir, hello: dict[str, Any]) -> None:
    """This node's run folder from the head's files, with node k's rank and paths (its
    records written into the head's folder when this node sees it: share_records)."""
    import tomli_w

    k = int(hello["node"])
    head_dir = str(hello["head_dir"]).rstrip("/")
    mine = str(run.path)
    run.create()
    spec = tomllib.loads(hello["spec"])
    spec.setdefault("cluster", {})["node_rank"] = k
    if spec.get("run", {}).get("output_dir", "").startswith(head_dir):
        spec["run"]["output_dir"] = mine + spec["run"]["output_dir"][len(head_dir) :]
    write_text_private(run.spec, tomli_w.dumps(spec))
    plan = _rewrite(hello["plan"], head_dir, mine)
    node = plan["nodes"][k]
    argv = node["argv"]
    if argv and argv[0] == hello.get("head_python"):
        argv[0] = sys.executable  # this node's Python (remote_python ran us)
    i = local_addr_index(argv)
    if i is not None and i < len(argv):
        addr = route_addr(str(hello.get("master_addr") or ""), int(hello.get("master_port") or 0))
        if addr:
            argv[i] = addr
    master = str(hello.get("master_addr") or "")
    own_interface(spec, node["env"], master)
    for key in ("TUNEDECK_RUN_ID", "TUNEDECK_RUN_DIR"):
        node["env"].pop(key, None)  # the agent sets this node's own
    write_json_atomic(run.plan, plan)
    write_json_atomic(run.secrets, _rewrite(hello.get("secrets") or {}, head_dir, mine))
    # Slurm says so itself (an allocation shares its filesystem); ssh nodes test it
    in_place = hello.get("in_place") is True or sees_head_dir(hello.get("shared_marker"))
    if in_place:
        share_records(run, head_dir, k, int(plan.get("nproc_per_node") or 1))
    write_json_atomic(
        run.path / "node.json",
        {"head_run_id": hello["run_id"], "node": k, "head_dir": head_dir, "shared": in_place},
    )
    run.write_state(
        {
            "run_id": run.run_id,
            "name": spec.get("name", "run"),
            "status": "pending",
            "message": f"node {k} of {hello['run_id']}",
            "created": time.time(),
            "started": None,
            "ended": None,
            "agent_pid": None,
            "worker_pids": [],
            "pgids": [],
            "pid_identity": {},
            "launches": [],
            "host": os.uname().nodename,
            "net": net_record(spec, node["env"], master),
            "attempt": 0,
            "exit_code": None,
            "stop_requested": None,
            "progress": {
                "step": 0,
                "max_steps": spec.get("train", {}).get("max_steps", 0),
                "loss": None,
            },
        }
    )


# a run's markers (tunedeck.core.supervisor.procs): an agent started here never inherits another's
RUN_MARKERS = ("TUNEDECK_RUN_ID", "TUNEDECK_LAUNCH_ID", "TUNEDECK_RUN_DIR", "TUNEDECK_ATTEMPT")


def spawn_agent(run: RunDir, *args: str) -> subprocess.Popen:
    """This node's agent for `run`, detached (its own session, output to agent.log)."""
    env = {k: v for k, v in os.environ.items() if k not in RUN_MARKERS}
    log = os.open(run.agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", AGENT_MODULE, str(run.path), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=str(run.path),
            env=env,
            umask=0o077,
        )
    finally:
        os.close(log)


def start_agent(run: RunDir, timeout_s: float = 30.0) -> int:
    proc = spawn_agent(run)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run.read_state() or {}).get("agent_pid") == proc.pid:
            return proc.pid
        if proc.poll() is not None:
            raise RuntimeError(
                f"the node's agent exited at once (code {proc.returncode}): "
                f"{run.agent_log.read_text(errors='replace')[-800:]}"
            )
        time.sleep(0.05)
    raise RuntimeError(f"the node's agent did not start within {timeout_s:.0f}s")


def agent_alive(state: dict[str, Any], run: RunDir) -> bool:
    pid = state.get("agent_pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return AGENT_MODULE.encode() in cmd and str(run.path).encode() in cmd


def write_stop(
    run: RunDir, mode: str, grace_s: Any = None, by: str = "head", node: int | None = None
) -> None:
    """stop.json for `run`'s agent (it polls it). `by` is said in its end message; `node`: the
    run stops because that node failed, which makes its end a failure naming it."""
    req: dict[str, Any] = {
        "mode": "hard" if mode == "hard" else "graceful",
        "t": time.time(),
        "by": by,
    }
    if isinstance(grace_s, (int, float)):
        req["grace_s"] = float(grace_s)
    if node is not None:
        req.update(failed=True, node=node)
    write_json_atomic(run.stop_request, req)


def _heard_late(run: RunDir, st: dict[str, Any], mode: str, asked: Any) -> None:
    """This node's run ended before the head's stop reached it. Where it ended after the
    stop was asked (its ranks failed because the other nodes had stopped, or it ran on to
    a `succeeded` short of the end), its record says what happened: stopped, and heard late."""
    ended = st.get("ended")
    if (
        not isinstance(asked, (int, float))
        or not isinstance(ended, (int, float))
        or ended < asked
        or st.get("status") == "stopped"
    ):
        return
    was = st.get("status")
    st.update(
        status="stopped",
        message=f"stopped ({'hard' if mode == 'hard' else 'graceful'}): the head was stopped; "
        f"this node heard it late (unreachable), after its ranks ended {was}",
        stop_requested={"mode": mode, "t": asked, "by": "head", "late": True},
    )
    st["exit_code"] = run_exit_code("stopped", st.get("exit_code") or 0)
    run.write_state(st)


def request_stop(
    run: RunDir, mode: str, grace_s: Any = None, asked: Any = None, failed_node: Any = None
) -> None:
    """The head's stop for this node's run: stop.json, and its agent woken now. `asked`: when
    the head was asked to stop (a stop that reaches us late, after an ssh outage);
    `failed_node`: the run stops because that node failed, not on anyone's request."""
    st = run.read_state() or {}
    if st.get("status") in TERMINAL:
        _heard_late(run, st, mode, asked)
        return
    node = (
        failed_node if isinstance(failed_node, int) and not isinstance(failed_node, bool) else None
    )
    write_stop(run, mode, grace_s, node=node)
    if agent_alive(st, run):
        try:
            os.kill(st["agent_pid"], signal.SIGUSR1)
        except OSError:
            pass


def end_attempt_before(run: RunDir, ctx: MonitorContext, t: float) -> list[int] | None:
    """SIGKILL this node's attempt (torchrun and ranks) when it started before `t`, when
    another node's part of it ended: its ranks could wait in a collective for that node until
    a timeout; the agent then starts the next. None when the attempt started after `t` (the
    next one already, waiting at the rendezvous): left alone. ctx: the agent's monitor
    context (its identity-checked `signal_ours`)."""
    st = run.read_state() or {}
    launches = [x for x in st.get("launches") or [] if isinstance(x, dict)]
    if not launches or float(launches[-1].get("t") or 0) >= t:
        return None
    pids = [
        p for p in [st.get("torchrun_pid"), *(st.get("worker_pids") or [])] if isinstance(p, int)
    ]
    return ctx.signal_ours(st, pids, signal.SIGKILL)


def revive(run: RunDir) -> bool:
    """The head asks this node back after losing it: when the node's agent is dead and its
    run not over, a new agent adopts the run (its torchrun is gone, so it records the failed
    attempt and starts the next one, which rejoins the head's rendezvous). True if started."""
    st = run.read_state() or {}
    if st.get("status") in TERMINAL or agent_alive(st, run):
        return False
    try:
        spawn_agent(run, "--adopt")  # the agent's adoption takes the run's lock and checks
    except OSError:
        return False
    return True


class Streamer:
    """Sends what this node's records gained since the head's offsets."""

    def __init__(self, run: RunDir, node: int, offsets: dict[str, int], out):
        self.run = run
        self.node = node
        self.sent: dict[str, int] = {}
        self.offsets = {k: int(v) for k, v in offsets.items() if isinstance(v, int)}
        self.out = out
        self.state_sig: tuple | None = None
        self.tel_t = self._last_tel_t()
        self.next_tel = 0.0

    def head_rel(self, rel: str) -> str:
        if rel == "logs/agent.log":
            return f"logs/agent-node{self.node}.log"
        if rel == "telemetry.jsonl":
            return f"nodes/node{self.node}/telemetry.jsonl"
        return rel

    def files(self) -> list[str]:
        out = []
        root = self.run.path
        for top in ("logs", "events", "stacks"):
            for dirpath, _dirs, names in os.walk(root / top):  # never into a linked dir
                for n in names:
                    p = os.path.join(dirpath, n)
                    if not n.startswith(".") and not os.path.islink(p):  # shared: in place
                        out.append(os.path.relpath(p, root))
        tel = root / "telemetry.jsonl"
        if tel.exists() and not tel.is_symlink():
            out.append("telemetry.jsonl")
        return out

    def send(self, obj: bytes) -> None:
        self.out.write(obj)

    def pump(self, final: bool) -> bool:
        """One pass; True when everything there is was sent."""
        caught_up = True
        for rel in self.files():
            head = self.head_rel(rel)
            off = self.sent.get(rel)
            if off is None:
                off = self.offsets.get(head, 0)
            try:
                size = os.path.getsize(self.run.path / rel)
            except OSError:
                continue
            if size == 0 and rel not in self.sent:
                self.send(wire.data_frame(head, 0, b""))  # the file exists: say so
            while off < size:
                with open(self.run.path / rel, "rb") as f:
                    f.seek(off)
                    data = f.read(min(wire.CHUNK, size - off))
                if not final:
                    cut = data.rfind(b"\n") + 1
                    if cut:
                        data = data[:cut]
                    elif len(data) < wire.CHUNK:
                        break  # half a line: wait for its end (readers parse lines)
                self.send(wire.data_frame(head, off, data))
                off += len(data)
            self.sent[rel] = off
            caught_up = caught_up and off >= size
        self.out.flush()
        return caught_up

    def state(self) -> dict[str, Any]:
        st = self.run.read_state() or {}
        try:
            s = os.stat(self.run.state)
            sig = (s.st_mtime_ns, s.st_size)
        except OSError:
            sig = None
        if sig != self.state_sig:
            self.state_sig = sig
            self.send(wire.frame({"k": "state", "data": st}))
        return st

    def _last_tel_t(self) -> float:
        p = self.run.path / "telemetry.jsonl"
        try:
            with open(p, "rb") as f:
                f.seek(max(0, p.stat().st_size - 65536))
                last = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
            return float(json.loads(last)["t"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0.0

    def telemetry(self, now: float) -> None:
        """The node agent's newest telemetry snapshot (run.db's tel_latest), one line per new
        sample, into telemetry.jsonl: streamed like a log, so a reconnect resumes it too."""
        if now < self.next_tel or not self.run.db.exists():
            return
        self.next_tel = now + TELEMETRY_S
        snap, times = read_latest_file(self.run.db, timeout=0.5)
        newest = max((times[k] for k in snap if k in times), default=0.0)
        if not snap or newest <= self.tel_t:
            return
        self.tel_t = newest
        line = json.dumps({"t": newest, "node": self.node, **snap}, separators=(",", ":"))
        with open(self.run.path / "telemetry.jsonl", "a", encoding="utf-8") as f:
            f.write(line + "\n")


def serve(stdin, out) -> int:
    hello = wire.parse(stdin.readline() or b"") or {}
    if hello.get("home"):
        os.environ["TUNEDECK_HOME"] = str(hello["home"])
    from tunedeck.core.paths import runs_root

    try:
        k = int(hello["node"])
        run = RunDir(runs_root() / node_run_id(str(hello["run_id"]), k))
    except (KeyError, TypeError, ValueError):
        out.write(wire.frame({"k": "error", "why": "a hello without run_id and node"}))
        out.flush()
        return 2
    started = False
    try:
        if os.path.lexists(run.path):
            # a folder already there must be this user's (a shared home: another user could
            # have made it first, with a plan and pids of their choosing)
            ownership.check(run.path)
        if not run.state.exists():
            if hello.get("op") != "start":
                raise RuntimeError(f"{run.path} does not exist on {os.uname().nodename}")
            materialise(run, hello)
            start_agent(run)
            started = True
    except Exception as e:  # one line for the head's finding, not a traceback
        out.write(wire.frame({"k": "error", "why": f"{type(e).__name__}: {e}"}))
        out.flush()
        return 1
    if isinstance(hello.get("stop"), dict):  # asked while we were unreachable
        stop = hello["stop"]
        request_stop(
            run,
            stop.get("mode", "graceful"),
            stop.get("grace_s"),
            stop.get("t"),
            stop.get("failed_node"),
        )
    elif hello.get("revive"):
        revive(run)
    out.write(
        wire.frame(
            {
                "k": "hello",
                "run": str(run.path),
                "pid": os.getpid(),
                "started": started,
                "host": os.uname().nodename,
                "shared": shared(run),
            }
        )
    )
    out.flush()
    closed = threading.Event()

    def commands() -> None:
        for line in iter(stdin.readline, b""):
            cmd = wire.parse(line) or {}
            if cmd.get("op") == "stop":
                request_stop(
                    run,
                    str(cmd.get("mode")),
                    cmd.get("grace_s"),
                    cmd.get("t"),
                    cmd.get("failed_node"),
                )
            elif cmd.get("op") == "revive":
                revive(run)
        closed.set()  # the head hung up: the run goes on without us

    threading.Thread(target=commands, daemon=True).start()
    st = Streamer(run, k, hello.get("offsets") or {}, out)
    gone_sent = False
    try:
        while not closed.is_set():
            now = time.time()
            state = st.state()
            alive = agent_alive(state, run)
            st.telemetry(now)
            over = state.get("status") in TERMINAL and not alive
            done = st.pump(final=over)
            if over and done:
                st.state()
                out.write(wire.frame({"k": "end"}))
                out.flush()
                return 0
            if alive and gone_sent:  # the head asked the node back: an agent owns it
                gone_sent = False
                out.write(wire.frame({"k": "alive"}))
                out.flush()
            if not alive and not over and not gone_sent:
                gone_sent = True
                out.write(
                    wire.frame(
                        {
                            "k": "gone",
                            "why": f"the agent of node {k} "
                            f"(pid {state.get('agent_pid')}) is gone while its run "
                            f"is {state.get('status')}",
                        }
                    )
                )
                out.flush()
            closed.wait(TICK_S)
    except (BrokenPipeError, OSError):
        pass  # the connection dropped: the head reattaches
    return 0


def main() -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    sys.exit(main())
