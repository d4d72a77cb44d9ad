"""Slurm: the batch script that starts one tunedeck agent per node with srun, its submission,
its queue state, its cancellation, and the node task the script runs.

  #SBATCH --nodes=N --ntasks-per-node=1
  srun python -m tunedeck.core.nodes.slurm RUN_DIR     (one task per node)

The task on node 0 of the allocation runs the run's own agent on RUN_DIR, in the foreground
(srun ends a step whose task exits, so nothing may detach); a task on node k > 0 makes a run
folder of its own next to it (<run id>.node<k>, like an ssh node's: its processes carry their
own run id) and runs node k's agent there. Under Slurm the run folder is on a filesystem every
node shares, so each node's records are read in place. The rendezvous host is only known when
the job starts: the first host of the allocation; each task writes it, and its own address
towards it, into its node's command before its agent starts.

Stopping: `scancel --signal=TERM` first (srun passes it to each agent: a graceful stop that
checkpoints), then `scancel` (Slurm's TERM + KILL) after the grace period.

A node's run that ends without succeeding, and a head's that does, end the others too
(`NodesWatch`): every agent exits 0, so srun alone would let the rest wait in a collective
until its timeout.
"""

from __future__ import annotations

import copy
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.monitoring import MonitorContext
from tunedeck.core.nodes.folders import node_host
from tunedeck.core.nodes.link import STOP_GRACE_S
from tunedeck.core.nodes.remote import (
    TERMINAL,
    end_attempt_before,
    materialise,
    net_record,
    node_run_id,
    own_interface,
    route_addr,
    write_stop,
)
from tunedeck.core.nodes.roster import local_addr_index
from tunedeck.core.rundir import RunDir, ownership, read_json, write_json_atomic
from tunedeck.core.spec import RunSpec

TASK_MODULE = "tunedeck.core.nodes.slurm"
SCRIPT = "slurm.sh"
MASTER_ENV = "TUNEDECK_MASTER_ADDR"
# how long a failed head waits at its end for its nodes to record theirs (NodesWatch.close)
NODE_END_WAIT_S = 10.0


log = logging.getLogger("tunedeck.nodes")


class SlurmError(RuntimeError):
    pass


def _header(spec: RunSpec, output: str) -> list[str]:
    c = spec.cluster
    nproc = max(c.nproc_per_node, 1)
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={_sbatch_word(spec.name)}",
        f"#SBATCH --nodes={c.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={nproc if c.device == 'cpu' else max(4 * nproc, 4)}",
        f"#SBATCH --output={_sbatch_word(output)}",
    ]
    if c.device != "cpu":
        # a GPU run owns its nodes: every GPU the spec uses, the node's memory, no neighbour
        lines += [f"#SBATCH --gpus-per-node={nproc}", "#SBATCH --exclusive", "#SBATCH --mem=0"]
    return lines + [f"#SBATCH {_sbatch_word(a)}" for a in c.slurm_args]


def _agents(python: str, run_dir_word: str) -> list[str]:
    return [
        "# the rendezvous host: the first host of the allocation",
        f'export {MASTER_ENV}="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 "
        + shlex.join([python, "-m", TASK_MODULE])
        + f" {run_dir_word}",
    ]


def _sbatch_word(word: str) -> str:
    # #SBATCH lines are read by sbatch, not a shell: no quoting, so no newline may pass
    return word.replace("\n", " ").replace("\r", " ")


def write_script(spec: RunSpec, run: RunDir) -> Path:
    """slurm.sh in the run folder: what `tunedeck launch` submits (`job_script`)."""
    from tunedeck.core.rundir import write_text_private

    path = run.path / SCRIPT
    write_text_private(path, job_script(spec, run.path), mode=0o700)
    return path


def available() -> str | None:
    """Why Slurm cannot be used from here (None: it can)."""
    for tool in ("sbatch", "squeue", "scancel", "scontrol"):
        if not shutil.which(tool):
            return f"{tool} is not on PATH"
    return None


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"{argv[0]}: {e}") from None


def submit(script: Path) -> str:
    why = available()
    if why:
        raise SlurmError(f'cluster.launcher is "slurm" but {why}')
    # held: the run records its job id before any agent of it can start and write state.json
    r = _run(["sbatch", "--parsable", "--hold", str(script)])
    if r.returncode != 0:
        raise SlurmError(f"sbatch refused the job: {r.stderr.strip() or r.stdout.strip()}")
    job = r.stdout.strip().split(";")[0]
    if not job.isdigit():
        raise SlurmError(f"sbatch answered {r.stdout.strip()!r}, not a job id")
    return job


def release(job: str) -> None:
    r = _run(["scontrol", "release", str(job)])
    if r.returncode != 0:
        raise SlurmError(f"scontrol release {job}: {r.stderr.strip()}")


def queue_state(job: str) -> dict[str, Any] | None:
    """{"state": PENDING|RUNNING|..., "reason": ..., "nodes": ...}, or None once the job has
    left the queue (or Slurm cannot be asked)."""
    if available():
        return None
    try:
        r = _run(["squeue", "-h", "-j", str(job), "-o", "%T|%r|%N"], timeout=10)
    except SlurmError:
        return None
    line = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
    if not line:
        return None
    state, _, rest = line.partition("|")
    reason, _, nodes = rest.partition("|")
    return {"job": str(job), "state": state, "reason": reason, "nodes": nodes}


def cancel(job: str, graceful: bool) -> str | None:
    """scancel: TERM to every step (the agents stop gracefully) or the whole job. Returns
    scancel's complaint, None when it took the request."""
    argv = ["scancel", "--signal=TERM", str(job)] if graceful else ["scancel", str(job)]
    try:
        r = _run(argv)
    except SlurmError as e:
        return str(e)
    return (r.stderr.strip() or f"scancel exited {r.returncode}") if r.returncode else None


JOB_MODULE = "tunedeck.core.supervisor.slurm_job"
SPEC_END = "TUNEDECK_SPEC"
EXPORT_OUTPUT = "tunedeck-%x-%j.out"  # beside where sbatch runs: a folder that exists


def job_script(
    resolved: RunSpec,
    run_dir: str | Path | None = None,
    spec: RunSpec | None = None,
    python: str | None = None,
) -> str:
    """The batch script of a Slurm run: the one `tunedeck launch` submits and `tunedeck export
    --format slurm` prints. `resolved`: the spec as planned (its node, process and GPU
    counts size the allocation). Only the run folder differs:

    - `run_dir` given (launch): the folder launch wrote; Slurm's own output goes into its logs;
    - else (export): the job's first step writes the folder under the job's TUNEDECK_HOME
      from `spec`, the spec as the user wrote it (resolved on the allocation's first node):
      spec, plan, state naming the job (tunedeck.core.supervisor.slurm_job). So the script
      stands alone. Slurm's output goes next to where sbatch runs. Secrets are ****: the job
      takes them from its environment.

    Then one agent per node runs the folder, node 0's owning the run."""
    python = python or sys.executable
    if run_dir is not None:
        output = str(run_dir) + "/logs/slurm-%j.out"
        folder = [
            f"# the run folder `tunedeck launch` wrote ({Path(run_dir).name})",
            f"RUN_DIR={shlex.quote(str(run_dir))}",
        ]
    else:
        output = EXPORT_OUTPUT
        folder = _folder_step(spec or resolved, python)
    lines = _header(resolved, output) + ["set -euo pipefail", *folder]
    lines.append('echo "tunedeck run folder: $RUN_DIR"')
    return "\n".join(lines + _agents(python, '"$RUN_DIR"')) + "\n"


def _folder_step(spec: RunSpec, python: str) -> list[str]:
    """The job's first step: it writes the run folder from the spec the script carries."""
    from tunedeck.core.spec import mask_env

    saved = copy.deepcopy(spec)
    saved.env = mask_env(saved.env)
    text = saved.to_toml()
    if any(line.strip() == SPEC_END for line in text.splitlines()):
        raise ValueError(f"the spec holds a line {SPEC_END!r}, which ends the script's copy")
    return [
        "# a tunedeck run that needs no `tunedeck launch`: this job writes its run folder",
        f"RUN_DIR=\"$({shlex.join([python, '-m', JOB_MODULE])} <<'{SPEC_END}'",
        text.rstrip("\n"),
        SPEC_END,
        ')"',
    ]


# -- the nodes of a running job, through the shared filesystem --------------------------------


class NodesWatch:
    """Ticked by each agent of a Slurm run over several nodes. The head reads the other
    nodes' state.json (their folders sit next to its own): one whose run ended without
    succeeding (its restarts spent, or stopped alone) ends the head's run as a failure naming
    it, and one whose attempt failed (it restarts) ends the head's attempt so that all start
    the next one. A node reads the head's: a head that ended without succeeding stops this
    node."""

    def __init__(self, ctx: MonitorContext):
        self.ctx = ctx
        self.run: RunDir = ctx.run
        c = ctx.spec.cluster
        if ctx.node_rank == 0:
            self.watched = {
                k: self.run.path.parent / node_run_id(self.run.run_id, k)
                for k in range(1, c.nnodes)
            }
        else:
            head = read_json(self.run.path / "node.json", {}).get("head_dir")
            self.watched = {0: Path(head)} if head else {}
        self.seen: dict[int, int] = {}  # state.json mtimes already read
        self.ended_for = 0.0  # the node attempt's end the head's was ended for
        self.done = False
        self.end_notes: list[str] = []

    def tick(self, now: float, new_events: list[dict]) -> None:
        if self.done or self.ctx.stopping():
            return
        for k, folder in self.watched.items():
            st = self._changed(k, folder / "state.json")
            if st and k > 0 and st.get("status") not in TERMINAL:
                self._node_restarting(k, st)
            if st and st.get("status") in TERMINAL and st["status"] != "succeeded":
                self.done = True
                if k == 0:
                    why = _ended("the head's run", st)
                    log.warning("%s: stopping this node", why)
                    # a head that failed makes this node's end a failure, not an asked stop
                    self._stop(why, node=0 if st["status"] == "failed" else None)
                else:
                    self._node_failed(k, node_host(st) or "?", _ended("its run", st), now)
                return

    def close(self, new_events: list[dict]) -> None:
        """The head's run is over: a node that failed before the tick saw it (its ranks'
        end also ended the head's) is still named. A node sees the head's end by itself.

        When the head's own attempt failed, a node's failure may be its cause though the
        node's agent has not recorded it yet (gloo ends the head's ranks the moment a peer
        dies): the head waits up to NODE_END_WAIT_S for every node to reach its end."""
        if self.done or self.ctx.node_rank != 0 or self.ctx.stopping():
            return  # a stop someone asked for ends every node: not a loss
        deadline = time.monotonic() + (NODE_END_WAIT_S if self._head_failed() else 0.0)
        while True:
            states = {k: read_json(f / "state.json", {}) for k, f in self.watched.items()}
            for k, st in states.items():
                if isinstance(st, dict) and st.get("status") == "failed":
                    summary = self._node_failed(
                        k, node_host(st) or "?", _ended("its run", st), time.time(), stop=False
                    )
                    self.end_notes.append(summary)
                    return
            ended = all(
                isinstance(st, dict) and st.get("status") in TERMINAL for st in states.values()
            )
            if ended or time.monotonic() >= deadline:
                return
            time.sleep(0.2)

    def _head_failed(self) -> bool:
        """Whether this node's last attempt ended with a failing exit code."""
        attempts = (self.run.read_state() or {}).get("attempts") or [{}]
        last = attempts[-1] if isinstance(attempts[-1], dict) else {}
        return last.get("exit_code") not in (0, None)

    def _changed(self, k: int, path: Path) -> dict[str, Any] | None:
        try:
            m = path.stat().st_mtime_ns
        except OSError:
            return None
        if self.seen.get(k) == m:
            return None
        self.seen[k] = m
        if ownership.problem(path.parent, files=(path.name,)) is not None:
            return None  # not this user's: it must not end this run (a shared home)
        st = read_json(path, {})
        return st if isinstance(st, dict) else None

    def _node_restarting(self, k: int, st: dict[str, Any]) -> None:
        """Node k's attempt failed and it waits for the head's next one: the head's attempt,
        started before that, cannot finish a collective without node k (NCCL ranks would wait
        in it until the watchdog's timeout), so it ends now and the agent starts the next."""
        ended = [
            a
            for a in st.get("attempts") or []
            if isinstance(a, dict) and a.get("exit_code") != 0 and a.get("ended")
        ]
        if not ended or self.ended_for >= float(ended[-1]["ended"]):
            return
        killed = end_attempt_before(self.run, self.ctx, float(ended[-1]["ended"]))
        if killed is None:
            return
        self.ended_for = float(ended[-1]["ended"])
        log.warning(
            "node %d's attempt %s failed: ended this node's attempt (pids %s)",
            k,
            ended[-1].get("attempt"),
            killed,
        )

    def _node_failed(self, k: int, host: str, why: str, now: float, stop: bool = True) -> str:
        summary = f"node {k} ({host}) was lost mid-run: {why}"
        try:
            self.ctx.store.save_finding(
                Finding(
                    category="node_lost",
                    severity="error",
                    summary=summary,
                    cause=f"Node {k}'s part of the run ended ({why}); the ranks of the other nodes "
                    f"cannot finish a collective without it, so they were stopped.",
                    fix=f"Look at node {k}'s logs (logs/node{k}/, logs/agent-node{k}.log) for why "
                    f"it failed; resume the run from its newest checkpoint "
                    f"(`tunedeck resume {self.run.run_id}`).",
                    node=k,
                    host=host,
                    t=now,
                    evidence=[why],
                    source=f"{node_run_id(self.run.run_id, k)}/state.json",
                )
            )
        except Exception:
            log.exception("could not store the finding")
        if stop:
            log.warning("%s: stopping the run", summary)
            self._stop(summary, node=k)
        return summary

    def _stop(self, by: str, node: int | None = None) -> None:
        """This agent's run stops (remote.write_stop), read now rather than next tick."""
        write_stop(self.run, "graceful", STOP_GRACE_S, by=by, node=node)
        os.kill(os.getpid(), signal.SIGUSR1)


def _ended(whose: str, state: dict[str, Any]) -> str:
    msg = state.get("message") or ""
    return f"{whose} ended {state.get('status')}" + (f": {msg}" if msg else "")


# -- the task srun starts on each node ---------------------------------------------------------


def _set_rendezvous(plan: dict[str, Any], node: int, master: str) -> None:
    """Node `node`'s command meets the allocation's first host, from its own address."""
    argv = plan["nodes"][node]["argv"]
    if master:
        for flag in ("--rdzv_endpoint",):
            if flag in argv:
                i = argv.index(flag) + 1
                argv[i] = f"{master}:{argv[i].rpartition(':')[2]}"
        if "--master_addr" in argv:
            argv[argv.index("--master_addr") + 1] = master
    i = local_addr_index(argv)
    if i is not None:
        addr = route_addr(master, 0) if master else None
        if addr:
            argv[i] = addr


def host_name() -> str:
    """This node's name as Slurm knows it (the name squeue and scontrol show; the machine's
    host name on a usual cluster), never an address."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def prepare_node(run_dir: str | Path, node: int, master: str) -> RunDir:
    """The run folder node `node`'s agent runs in: the run's own for node 0, else
    <run id>.node<k> next to it, its records written into the run's folder (the allocation
    shares the filesystem: remote.share_records), so node 0's agent ingests and diagnoses
    every node's as an ssh run's head does."""
    head = RunDir(Path(run_dir).resolve())
    if node == 0:
        plan = head.read_plan()
        _set_rendezvous(plan, 0, master)
        plan["nodes"][0]["host"] = host_name()  # the plan knew no host: Slurm picks it
        spec = tomllib.loads(head.spec.read_text(encoding="utf-8"))
        env = plan["nodes"][0]["env"]
        own_interface(spec, env, master)  # node k's: materialise
        write_json_atomic(head.plan, plan)
        st = head.read_state() or {}
        st["net"] = net_record(spec, env, master) | {"host": host_name()}
        head.write_state(st)
        return head
    run = RunDir(head.path.parent / node_run_id(head.run_id, node))
    if not run.state.exists():
        plan = head.read_plan()
        _set_rendezvous(plan, node, master)
        plan["nodes"][node]["host"] = host_name()
        materialise(
            run,
            {
                "node": node,
                "head_dir": str(head.path),
                "run_id": head.run_id,
                "spec": head.spec.read_text(encoding="utf-8"),
                "plan": plan,
                "secrets": read_json(head.secrets, {}),
                "in_place": True,
                "head_python": sys.executable,
                "master_addr": master,
            },
        )
        st = run.read_state() or {}
        st["net"] = dict(st.get("net") or {}, host=host_name())  # `tunedeck nodes` shows it
        run.write_state(st)
    return run


def node_task(run_dir: str) -> int:
    node = int(os.environ.get("SLURM_NODEID", "0") or 0)
    # the run folder, and a node's folder next to it, must be this user's own: the agent runs
    # its plan (core/rundir/ownership.py; the agent refuses too, this keeps agent.log closed)
    head = Path(os.path.abspath(run_dir))
    real = head.resolve()
    for folder in [head] + ([real.parent / node_run_id(real.name, node)] if node else []):
        why = ownership.problem(folder) if os.path.lexists(folder) else None
        if why is not None:
            print(f"tunedeck: refusing {folder}: {why}", file=sys.stderr)
            return 2
    run = prepare_node(run_dir, node, os.environ.get(MASTER_ENV, ""))
    # a node's agent.log is the link prepare_node made into the head's logs, inside folders
    # just checked to be this user's alone: followed on purpose
    log = os.open(run.agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.umask(0o077)
    os.chdir(run.path)
    os.execv(
        sys.executable, [sys.executable, "-m", "tunedeck.core.supervisor.agent", str(run.path)]
    )
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tunedeck.core.nodes.slurm RUN_DIR (run by srun)", file=sys.stderr)
        return 2
    return node_task(argv[0])


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "job_script",
    "write_script",
    "submit",
    "queue_state",
    "cancel",
    "node_task",
    "SlurmError",
    "NodesWatch",
]
