"""A real Slurm on this machine (the Debian slurm-wlm daemons, configured for localhost by the
test in its own folder and ports) runs the batch script `tunedeck launch` submits: sbatch,
srun starting one agent per node; tunedeck shows the queue state while the job pends,
watches the run, and `stop` scancels it (TERM first: the agents stop gracefully and
checkpoint). Skips with the reason when the daemons cannot start here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_for
from tests.multinode_hosts import demo_spec

pytestmark = pytest.mark.slow


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Slurm:
    """slurmctld and one slurmd per node, all on this machine, configured in `root` with free
    ports. nodes: (name, address) pairs; run(i, argv): the argv that runs a command on node i
    (default: as it is; tests/test_slurm_nodes.py puts each node in a network namespace).
    The controller runs on node 0."""

    def __init__(self, root: Path, nodes=(("localhost", "127.0.0.1"),), run=None):
        self.root = root
        self.conf = root / "slurm.conf"
        self.nodes = list(nodes)
        self.run = run or (lambda i, argv: argv)
        self.procs: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def start(self) -> None:
        r = self.root
        (r / "state").mkdir(parents=True, exist_ok=True)
        cpus = os.cpu_count() or 2
        names = ",".join(n for n, _ in self.nodes)
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=tunedecktest",
                    f"SlurmctldHost=localhost({self.nodes[0][1]})",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "AuthType=auth/none",
                    "CredType=cred/none",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool-%n'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
                    f"SlurmctldLogFile={r / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'slurmd-%n.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "MpiDefault=none",
                    "SchedulerType=sched/backfill",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "ReturnToService=2",
                    "KillWait=5",
                    "JobCompType=jobcomp/none",
                    "AccountingStorageType=accounting_storage/none",
                    *(
                        f"NodeName={n} NodeAddr={a} CPUs={cpus} State=UNKNOWN"
                        for n, a in self.nodes
                    ),
                    f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        daemons = [(0, "slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])]
        daemons += [
            (i, f"slurmd-{n}", ["slurmd", "-D", "-f", str(self.conf), "-N", n])
            for i, (n, _) in enumerate(self.nodes)
        ]
        for i, name, argv in daemons:
            self.procs.append(
                subprocess.Popen(
                    self.run(i, argv),
                    env=self.env,
                    stdout=subprocess.DEVNULL,
                    stderr=open(r / f"{name}.out", "wb"),
                )
            )
            time.sleep(0.5)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            out = subprocess.run(
                self.run(0, ["sinfo", "-h", "-N", "-o", "%t"]),
                env=self.env,
                capture_output=True,
                text=True,
            ).stdout.split()
            if len(out) == len(self.nodes) and set(out) <= {"idle", "mix", "alloc"}:
                return
            time.sleep(0.3)
        logs = " ".join(f.read_text(errors="replace")[-300:] for f in sorted(r.glob("*.out")))
        raise RuntimeError(f"the Slurm daemons did not come up: {logs.strip()}")

    def scontrol(self, *args: str) -> None:
        subprocess.run(
            self.run(0, ["scontrol", *args]), env=self.env, check=True, capture_output=True
        )

    def close(self) -> None:
        subprocess.run(self.run(0, ["scancel", "--user=root"]), env=self.env, capture_output=True)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def slurm_missing() -> str | None:
    """Why a test Slurm cannot run here (None: it can)."""
    missing = [
        t
        for t in ("slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel")
        if not shutil.which(t)
    ]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing; Debian: "
            f"apt-get install slurm-wlm)"
        )
    if os.geteuid() != 0:
        return "the test's slurmd runs jobs as root and needs root"
    return None


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = slurm_missing()
    if why:
        pytest.skip(why)
    s = Slurm(tmp_path_factory.mktemp("slurm"))
    try:
        s.start()
    except (RuntimeError, OSError) as e:
        s.close()
        pytest.skip(f"Slurm's daemons cannot start here: {e}")
    try:
        yield s
    finally:
        s.close()


def _cli(slurm, home: Path, *args: str, timeout: float = 200):
    env = dict(slurm.env, TUNEDECK_HOME=str(home))
    proc = subprocess.run(
        [sys.executable, "-m", "tunedeck.tui", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )
    assert proc.stdout.strip(), f"tunedeck {args} ({proc.returncode}): {proc.stderr}"
    return json.loads(proc.stdout)


def _spec(path: Path, steps: int) -> Path:
    return demo_spec(
        path,
        "slurm-demo",
        steps,
        run="stop_grace_s = 30",
        cluster='cpu_procs = 2\nlauncher = "slurm"\nslurm_args = ["--time=20"]',
    )


def test_export_slurm_starts_one_agent_per_node_with_srun(tmp_path):
    spec = _spec(tmp_path / "s.toml", 10)
    text = spec.read_text().replace("[cluster]\n", "[cluster]\nnnodes = 4\n")
    spec.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "tunedeck.tui", "export", str(spec), "--format", "slurm"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, TUNEDECK_HOME=str(tmp_path / "h")),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "#SBATCH --nodes=4" in lines and "#SBATCH --ntasks-per-node=1" in lines
    assert "#SBATCH --time=20" in lines
    srun = [x for x in lines if x.startswith("exec srun")]
    assert srun and "-m tunedeck.core.nodes.slurm" in srun[0]
    assert "torch.distributed.run" not in proc.stdout  # the agents start torchrun


def test_launch_submits_shows_pending_watches_and_scancels(slurm, tmp_path):
    home = tmp_path / "home"
    spec = _spec(tmp_path / "s.toml", 100000)
    slurm.scontrol("update", "PartitionName=debug", "State=DOWN")  # the job must wait
    try:
        out = _cli(slurm, home, "launch", str(spec), "--no-preflight")
        run_id, run_dir = out["run_id"], Path(out["run_dir"])
        st = json.loads((run_dir / "state.json").read_text())
        job = st["slurm_job"]
        assert (run_dir / "slurm.sh").exists() and st["status"] == "pending"
        rows = wait_for(
            lambda: (
                (r := _cli(slurm, home, "nodes", run_id))[0].get("slurm", {}).get("state")
                == "PENDING"
                and r
            ),
            30,
            "the job to pend",
        )
        assert rows[0]["slurm"]["job"] == job and rows[0]["status"] == "pending"
        assert _cli(slurm, home, "status", run_id)["status"] == "pending"
    finally:
        slurm.scontrol("update", "PartitionName=debug", "State=UP")
    # released: srun starts the agent, which trains like any other run
    wait_for(lambda: _cli(slurm, home, "status", run_id)["step"] >= 3, 240, "steps under Slurm")
    st = json.loads((run_dir / "state.json").read_text())
    assert st["status"] == "running" and st["slurm_job"] == job
    assert (run_dir / "events" / "rank1.jsonl").exists()
    environ = Path(f"/proc/{st['agent_pid']}/environ").read_bytes().split(b"\0")
    assert f"SLURM_JOB_ID={job}".encode() in environ  # the agent is the job's task
    t0 = time.monotonic()
    done = _cli(slurm, home, "stop", run_id, "--wait")
    assert done["status"] == "stopped", done
    assert time.monotonic() - t0 < 60
    ends = [json.loads(x) for x in (run_dir / "events" / "rank0.jsonl").open() if '"end"' in x]
    assert ends and ends[-1]["reason"] == "stopped"  # graceful: the trainer ended
    assert list((run_dir / "output").glob("checkpoint-*")), "a graceful stop checkpoints"
    gone = subprocess.run(
        ["squeue", "-h", "-j", job], env=slurm.env, capture_output=True, text=True
    ).stdout.strip()
    assert gone == ""


def _apart(script: str, output: str) -> tuple[list[str], list[str]]:
    """A batch script less what launch's and the export's must differ in: (the lines
    left, the lines taken out). Those are Slurm's own output file (the run's logs for a
    launch; beside where sbatch runs for an export, whose run folder does not exist yet) and
    the run folder (the one launch wrote; the export's job writes its own from the spec it
    carries), the lines from `set -euo pipefail` to the one that echoes it."""
    lines = script.splitlines(keepends=True)
    start = lines.index("set -euo pipefail\n") + 1
    end = lines.index('echo "tunedeck run folder: $RUN_DIR"\n')
    out = [i for i, x in enumerate(lines) if x.startswith("#SBATCH --output=")]
    assert out == [5] and lines[5] == f"#SBATCH --output={output}\n", lines[:8]
    return lines[:5] + lines[6:start] + lines[end:], lines[5:6] + lines[start:end]


def test_stop_of_a_queued_job_cancels_it(slurm, tmp_path):
    home = tmp_path / "home"
    slurm.scontrol("update", "PartitionName=debug", "State=DOWN")
    try:
        spec = _spec(tmp_path / "s.toml", 10)
        out = _cli(slurm, home, "launch", str(spec), "--no-preflight")
        run_id = out["run_id"]
        # launch submitted the script `export --format slurm` prints (one function builds
        # both), byte for byte but for its output file and the run folder's lines
        run_dir = Path(out["run_dir"])
        export = subprocess.run(
            [sys.executable, "-m", "tunedeck.tui", "export", str(spec), "--format", "slurm"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=dict(slurm.env, TUNEDECK_HOME=str(home)),
        )
        assert export.returncode == 0, export.stderr
        launched, folder = _apart(
            (run_dir / "slurm.sh").read_text(), f"{run_dir}/logs/slurm-%j.out"
        )
        exported, job_step = _apart(export.stdout, "tunedeck-%x-%j.out")
        assert "".join(launched) == "".join(exported)
        assert folder[1:] == [
            f"# the run folder `tunedeck launch` wrote ({run_id})\n",
            f"RUN_DIR={run_dir}\n",
        ]
        assert job_step[2].startswith('RUN_DIR="$(') and "slurm_job" in job_step[2]
        done = _cli(slurm, home, "stop", run_id, "--wait")
        assert done["status"] == "stopped" and "before it started" in done["message"]
        job = json.loads((Path(out["run_dir"]) / "state.json").read_text())["slurm_job"]
        gone = subprocess.run(
            ["squeue", "-h", "-j", job], env=slurm.env, capture_output=True, text=True
        ).stdout.strip()
        assert gone == ""
    finally:
        slurm.scontrol("update", "PartitionName=debug", "State=UP")
