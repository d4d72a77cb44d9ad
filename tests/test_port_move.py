"""A single-node run whose rendezvous port is taken when torchrun starts (another process bound
it after the launch picked it): the agent moves the run to a free port and the same attempt
trains, with the move recorded in state.json, plan.json, launch.sh and the agent's log, and
the clash told as handled; the live monitor stores the clash only once the agent answered it. A
multi-node command's port is every node's, so nothing moves it."""

from __future__ import annotations

import json
import re
import shutil
import socket

from conftest import DEMO, REPO, cli

from tunedeck.core.backends import plan_run
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import load_spec
from tunedeck.core.store.store import Store
from tunedeck.core.supervisor import portmove


def test_a_taken_port_moves_the_run_and_it_trains(td_home):
    with socket.socket() as held:  # the process that took the port meanwhile
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = cli(
            "launch", str(DEMO), "--json", "--no-preflight", "--wait",
            "--set", "train.max_steps=3", "--set", "train.save_steps=0",
            "--set", f"cluster.master_port={port}", home=td_home,
        )  # fmt: skip
    run_dir = td_home / "runs" / json.loads(out.stdout.splitlines()[0])["run_id"]
    st = json.loads((run_dir / "state.json").read_text())
    assert st["status"] == "succeeded" and st["progress"]["step"] == 3, st["message"]
    [moved] = st["port_moves"]
    assert moved["from"] == port and moved["to"] == st["master_port"] != port
    assert [a["attempt"] for a in st["attempts"]] == [0]  # not counted as a restart
    plan = json.loads((run_dir / "plan.json").read_text())
    assert portmove.port_of(plan["nodes"][0]) == moved["to"]
    assert f"--master_port {moved['to']} " in (run_dir / "launch.sh").read_text()
    said = (run_dir / "logs" / "agent.log").read_text()
    assert f"port {port} was taken before torchrun listened on it" in said
    assert "EADDRINUSE" in (run_dir / "logs" / "torchrun-node0.log").read_text()
    # the clash is in torchrun's log for good, told as handled: no error, no root cause
    found = json.loads(cli("diagnose", str(run_dir), "--json", home=td_home).stdout)
    [clash] = [f for f in found if f["category"] == "port_in_use"]
    assert clash["severity"] == "info" and f"moved to port {moved['to']}" in clash["summary"]
    assert not [f for f in found if f["severity"] == "error"]
    with Store(run_dir) as viewer:  # what the monitor shows
        assert [f["severity"] for f in viewer.findings("port_in_use")] == ["info"]


def test_a_multi_node_command_has_no_port_to_move(tmp_path):
    spec = load_spec(
        DEMO,
        ["cluster.nnodes=2", "cluster.master_addr=127.0.0.1", "cluster.master_port=29400"],
    )
    _, plan = plan_run(spec, RunDir(tmp_path / "run"))
    assert all(portmove.port_of(n) is None for n in plan.to_json()["nodes"])
    one, plan1 = plan_run(load_spec(DEMO), RunDir(tmp_path / "one"))
    assert portmove.port_of(plan1.to_json()["nodes"][0]) == one.cluster.master_port


def test_the_live_monitor_waits_for_the_agent_to_answer_a_clash(tmp_path):
    """While torchrun still runs, a one-node clash is not stored (an `errors` alert would go
    out for what the agent is about to answer); once the agent moved the run it is stored as
    handled, and a clash nobody moved off is the error when the monitor closes."""
    from tests.test_manage import make_run
    from tunedeck.core.monitoring import MonitorContext
    from tunedeck.core.supervisor.monitors import DiagnosisMonitor

    console = REPO / "tests" / "corpus" / "recorded" / "port_clash.log"  # a real torchrun's
    port = int(re.search(r"port: (\d+)", console.read_text())[1])
    stored = {}
    for moved in (True, False):
        run = RunDir(make_run(tmp_path / str(moved), f"20261210-01000{int(moved)}-demo-1a1a",
                              status="running", step=0))  # fmt: skip
        (run.path / "logs").mkdir(exist_ok=True)
        shutil.copy(console, run.torchrun_log(0))
        store = Store(run, write=True)
        ctx = MonitorContext(run=run, spec=load_spec(run.spec), store=store, node_rank=0,
                             rank_pids=dict, stopping=lambda: False,
                             signal_ours=lambda *a: [])  # fmt: skip
        mon = DiagnosisMonitor(ctx)
        mon.tick(1e9, [])
        assert store.findings("port_in_use") == []  # torchrun has not exited yet
        if moved:
            st = run.read_state()
            st["port_moves"] = [{"from": port, "to": port + 1, "t": 1.0}]
            run.write_state(st)
            mon.tick(2e9, [])
        else:
            mon.close([])
        stored[moved] = [f["severity"] for f in store.findings("port_in_use")]
        store.close()
    assert stored == {True: ["info"], False: ["error"]}
