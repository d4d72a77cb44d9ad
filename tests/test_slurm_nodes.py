"""Two Slurm nodes: the two network-namespace hosts of tests/multinode_hosts.py, each with its
own slurmd (the controller beside node 0's), node names resolved through a hosts file only
their processes see. `tunedeck launch` submits from node 0; srun starts one agent per node; the
ranks meet over the veth link; a restart after node 1's ranks die resumes both nodes from the
head's checkpoint (an allocation shares its filesystem); `stop` scancels the job.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w
import tomllib

from tests.conftest import REPO, wait_for
from tunedeck.core.rundir import RunDir
from tests.multinode_hosts import IFACE, demo_spec, make_hosts, unavailable
from tests.test_multinode import _cleanup, _events, _state
from tests.test_slurm import Slurm, slurm_missing

pytestmark = pytest.mark.slow
EXAMPLE = REPO / "docs" / "examples" / "two-nodes-slurm.toml"  # docs/multinode.md shows it
_why = (
    slurm_missing()
    or unavailable()
    or next(
        (
            f"{t} is not installed (util-linux)"
            for t in ("nsenter", "unshare")
            if not shutil.which(t)
        ),
        None,
    )
)
if _why:
    pytestmark = [pytestmark, pytest.mark.skip(reason=f"two Slurm nodes cannot run: {_why}")]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    hosts = make_hosts(tmp_path_factory.mktemp("hosts"))
    slurm = Slurm(
        hosts.root / "slurm", nodes=list(zip(hosts.aliases, hosts.addrs)), run=hosts.named_argv
    )
    try:
        slurm.start()
        yield hosts, slurm
    finally:
        slurm.close()
        hosts.close()


def _cli(hosts, slurm, home: Path, *args: str, timeout: float = 200):
    """The real `tunedeck` command line, run on node 0 (where sbatch and squeue reach the
    controller)."""
    env = dict(slurm.env, TUNEDECK_HOME=str(home))
    proc = subprocess.run(
        hosts.named_argv(0, [sys.executable, "-m", "tunedeck.tui", *args, "--json"]),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )
    assert proc.stdout.strip(), f"tunedeck {args} ({proc.returncode}): {proc.stderr}"
    return json.loads(proc.stdout)


def _netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _launch(hosts, slurm, tmp_path: Path, run: str, save_steps: int = 0):
    """The CPU demo over the two Slurm nodes, one rank each, launched from node 0: (run id,
    its folder, node 1's folder)."""
    spec = demo_spec(
        tmp_path / "s.toml",
        "slurm-two",
        100000,
        save_steps=save_steps,
        run=run,
        cluster=f'nnodes = 2\ncpu_procs = 1\nlauncher = "slurm"\n'
        f'slurm_args = ["--time=20"]\ninterface = "{IFACE}"',
    )
    out = _cli(hosts, slurm, tmp_path / "home", "launch", str(spec), "--no-preflight")
    run_dir = Path(out["run_dir"])
    return out["run_id"], run_dir, run_dir.parent / f"{out['run_id']}.node1"


def test_two_slurm_nodes_train_resume_from_the_heads_checkpoint_and_stop(nodes, tmp_path):
    hosts, slurm = nodes
    home = tmp_path / "home"
    run_id, run_dir, node_dir = _launch(
        hosts,
        slurm,
        tmp_path,
        "stop_grace_s = 30\nmax_restarts = 1\nrestart_pause_s = 1",
        save_steps=4,
    )
    try:
        wait_for(
            lambda: (
                list((run_dir / "output").glob("checkpoint-*"))
                and all((r["step"] or 0) >= 6 for r in _cli(hosts, slurm, home, "nodes", run_id))
            ),
            240,
            "a checkpoint and steps on both nodes",
        )
        head, node = _state(run_dir / "state.json"), _state(node_dir / "state.json")
        job = head["slurm_job"]
        # each node shown by its Slurm node name, never an address (issue 31)
        rows = _cli(hosts, slurm, home, "nodes", run_id)
        assert [r["host"] for r in rows] == list(hosts.aliases), rows
        assert [head["net"]["host"], node["net"]["host"]] == list(hosts.aliases)
        # each node's agent is the job's task on its own host, its ranks too
        for state, i in ((head, 0), (node, 1)):
            environ = Path(f"/proc/{state['agent_pid']}/environ").read_bytes().split(b"\0")
            assert f"SLURM_JOB_ID={job}".encode() in environ
            assert f"SLURM_NODEID={i}".encode() in environ
            ns = os.stat(f"/run/netns/{hosts.names[i]}").st_ino
            assert _netns_of(state["agent_pid"]) == f"net:[{ns}]", i
            assert all(_netns_of(p) == _netns_of(state["agent_pid"]) for p in state["worker_pids"])
        # node 1 met the rendezvous at the allocation's first host
        argv = RunDir(node_dir).read_plan()["nodes"][1]["argv"]
        assert argv[argv.index("--rdzv_endpoint") + 1].startswith("node0:"), argv
        # both nodes' losses are the same all-reduced numbers
        s0 = {e["step"]: e["loss"] for e in _events(run_dir / "events" / "rank0.jsonl", "step")}
        s1 = {e["step"]: e["loss"] for e in _events(run_dir / "events" / "rank1.jsonl", "step")}
        assert [s0[k] for k in range(1, 6)] == [s1[k] for k in range(1, 6)]

        killed_at = time.time()
        for pid in node["worker_pids"]:  # node 1's ranks die; its agent lives
            os.kill(pid, signal.SIGKILL)
        starts = wait_for(
            lambda: (s := _events(run_dir / "events" / "rank1.jsonl", "start"))[1:] and s,
            180,
            "node 1's ranks to start again",
        )
        again = starts[-1]
        print(f"node 1's ranks killed: attempt 1 started {again['t'] - killed_at:.1f}s later")
        # under Slurm the nodes share the run folder: both resume from the head's checkpoint
        assert again["restart"] == 1 and again["resumed_from"].startswith(
            str(run_dir / "output" / "checkpoint-")
        ), again
        resumed = again["start_step"]
        assert resumed >= 4 and resumed % 4 == 0
        # each rank writes its own start once its model is built: rank 0's may come later
        head0 = wait_for(
            lambda: (s := _events(run_dir / "events" / "rank0.jsonl", "start"))[1:] and s[-1],
            60,
            "the head's ranks to start again",
        )
        assert head0["restart"] == 1 and head0["start_step"] == resumed
        wait_for(
            lambda: (_cli(hosts, slurm, home, "nodes", run_id)[1]["step"] or 0) >= resumed + 3,
            120,
            "steps after the resume",
        )
        events = _events(run_dir / "events" / "rank1.jsonl", "")
        second = [i for i, e in enumerate(events) if e["kind"] == "start"][1]
        after = [e["step"] for e in events[second:] if e["kind"] == "step"]
        assert after[:3] == [resumed + 1, resumed + 2, resumed + 3], after

        done = _cli(hosts, slurm, home, "stop", run_id, "--wait")
        assert done["status"] == "stopped" and "lost" not in done["message"], done
        ends = _events(run_dir / "events" / "rank0.jsonl", "end")
        assert ends and ends[-1]["reason"] == "stopped"
        queue = subprocess.run(
            hosts.named_argv(0, ["squeue", "-h", "-j", job]),
            env=slurm.env,
            capture_output=True,
            text=True,
        ).stdout.strip()
        assert queue == ""
        assert _state(node_dir / "state.json")["status"] in ("stopped", "succeeded")
        # the user's stop is named as such, not as a time limit or preemption (issue 31)
        found = _cli(hosts, slurm, home, "diagnose", run_id)
        assert not [f for f in found if f["category"] == "launcher_signal"], found
        asked = [f for f in found if f["category"] == "stop_requested"]
        assert asked and "scancel" in asked[0]["summary"], found
    finally:
        _cleanup(run_id, f"{run_id}.node1", agents=(run_dir, node_dir))


@pytest.mark.parametrize("dies", ["node1", "head"])
def test_a_node_that_fails_for_good_ends_the_whole_job(nodes, tmp_path, dies):
    """No restarts left: a node whose run fails ends the head's as a failure that names it;
    a head whose run fails stops the nodes. Every agent exits 0, so without this the rest
    would wait in a collective until its timeout and the job would hold the allocation."""
    hosts, slurm = nodes
    home = tmp_path / "home"
    run_id, run_dir, node_dir = _launch(
        hosts, slurm, tmp_path, "stop_grace_s = 20\nmax_restarts = 0"
    )
    try:
        wait_for(
            lambda: all((r["step"] or 0) >= 3 for r in _cli(hosts, slurm, home, "nodes", run_id)),
            240,
            "steps on both nodes",
        )
        job = _state(run_dir / "state.json")["slurm_job"]
        victim = _state((node_dir if dies == "node1" else run_dir) / "state.json")
        t0 = time.monotonic()
        for pid in victim["worker_pids"]:
            os.kill(pid, signal.SIGKILL)
        ended = wait_for(
            lambda: all(
                _state(d / "state.json").get("status") in ("failed", "stopped")
                for d in (run_dir, node_dir)
            ),
            90,
            "both nodes' runs to end",
        )
        print(f"{dies}'s ranks killed: both ended {time.monotonic() - t0:.1f}s later")
        head, node = _state(run_dir / "state.json"), _state(node_dir / "state.json")
        assert ended and head["status"] == "failed", head
        # a failed or stopped run never says exit code 0, even where torchrun exited 0
        # after the stop the failure caused (its code stays in the attempt)
        assert head["exit_code"] not in (0, None) and node["exit_code"] not in (0, None)
        shown = subprocess.run(
            hosts.named_argv(0, [sys.executable, "-m", "tunedeck.tui", "status", run_id]),
            capture_output=True,
            text=True,
            env=dict(slurm.env, TUNEDECK_HOME=str(home)),
            cwd=REPO,
        ).stdout
        assert "exit code" in shown and "exit code 0" not in shown, shown
        if dies == "node1":
            # the head names node 1 whether its watch stopped it or its own ranks' end (gloo
            # sees a peer die at once; NCCL ranks would wait in the collective) came first
            assert node["status"] == "failed"
            assert (
                "node 1 (" in head["message"]
                and "was lost mid-run: its run ended failed" in head["message"]
            ), head["message"]
            from tunedeck.core.store.store import read_findings

            lost = [f for f in read_findings(run_dir) if f["category"] == "node_lost"]
            assert lost and lost[0]["node"] == 1 and lost[0]["severity"] == "error"
        else:  # the head failed: so did node 1's part, by its own ranks' end or its watch
            assert node["status"] == "failed", node
            if "the rest of the run was stopped" in node["message"]:  # the watch came first
                assert (
                    "the head's run ended failed: torchrun exited with code" in (node["message"])
                ), node["message"]
        # the agents are gone, and so is the job
        wait_for(
            lambda: (
                subprocess.run(
                    hosts.named_argv(0, ["squeue", "-h", "-j", job]),
                    env=slurm.env,
                    capture_output=True,
                    text=True,
                ).stdout.strip()
                == ""
            ),
            60,
            "the job to leave",
        )
    finally:
        _cleanup(run_id, f"{run_id}.node1", agents=(run_dir, node_dir))


def test_sbatch_of_the_exported_script_runs_the_demo_with_no_launch(nodes, tmp_path):
    """`tunedeck export --format slurm` is a job on its own: `sbatch` of it (no `tunedeck
    launch` before) writes the run folder, trains over both nodes and ends; the home both
    nodes share lists the run once."""
    hosts, slurm = nodes
    home = tmp_path / "home"
    # docs/examples/two-nodes-slurm.toml as it is, but for the data path and the length. No
    # `interface`: the hostname resolves to 127.0.0.1 on both hosts, so each node's task
    # names the one that routes to the allocation's first host (gloo would bind loopback)
    spec = tomllib.loads(EXAMPLE.read_text())
    spec["data"]["path"] = str(REPO / "presets" / "data" / "demo_chat.jsonl")
    spec["train"]["max_steps"] = 6
    (tmp_path / "s.toml").write_text(tomli_w.dumps(spec))
    spec = tmp_path / "s.toml"
    env = dict(slurm.env, TUNEDECK_HOME=str(home))
    script = tmp_path / "job.sh"
    script.write_text(
        subprocess.run(
            hosts.named_argv(
                0, [sys.executable, "-m", "tunedeck.tui", "export", str(spec), "--format", "slurm"]
            ),
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            check=True,
        ).stdout
    )
    assert not (home / "runs").exists()  # nothing written before the job runs
    job = subprocess.run(
        hosts.named_argv(0, ["sbatch", "--parsable", str(script)]),
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,  # Slurm's own output file lands here
    )
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip().split(";")[0]
    run_id = ""
    try:
        final = wait_for(
            lambda: (
                (runs := _cli(hosts, slurm, home, "ls"))
                and runs[0]["status"] in ("succeeded", "failed", "stopped")
                and runs
            ),
            240,
            "the exported job's run to end",
        )
        run_id = final[0]["run_id"]
        run_dir = home / "runs" / run_id
        assert [r["run_id"] for r in final] == [run_id]  # node 1's folder is not a run
        assert final[0]["status"] == "succeeded", (
            final,
            (tmp_path / f"tunedeck-two-nodes-slurm-{job_id}.out").read_text(errors="replace"),
        )
        head = _state(run_dir / "state.json")
        assert head["slurm_job"] == job_id and head["exit_code"] == 0
        for st in (head, _state(home / "runs" / f"{run_id}.node1" / "state.json")):
            assert st["net"]["ifname"] == IFACE and st["net"]["hostname_addr"] == "127.0.0.1"
        assert [e["step"] for e in _events(run_dir / "events" / "rank1.jsonl", "step")] == list(
            range(1, 7)
        )
        assert (run_dir / "spec.toml").is_file() and (run_dir / "plan.json").is_file()
    finally:
        subprocess.run(hosts.named_argv(0, ["scancel", job_id]), env=slurm.env, capture_output=True)
        if run_id:
            _cleanup(run_id, f"{run_id}.node1")
