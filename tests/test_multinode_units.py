"""The multi-node parts that need no second host: roster checks, the per-node plan touches,
the ssh command line, the frames' paths and resumable writes, the node view's reads."""

from __future__ import annotations

import io
import json
import shlex

import pytest

from tunedeck.core.nodes import wire
from tunedeck.core.nodes.remote import Streamer, _rewrite, node_run_id
from tunedeck.core.nodes.roster import place, roster, roster_problems
from tunedeck.core.nodes.ssh import ssh_argv
from tunedeck.core.nodes.view import last_step
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import SpecError, loads_spec

BASE = 'backend = "script"\n[script]\npath = "/x/train.py"\n[cluster]\nnnodes = 3\n'


def _spec(extra: str):
    return loads_spec(BASE + extra)


def test_roster_problems_name_the_key_and_the_count():
    s = _spec(
        'launcher = "ssh"\nhosts = ["a", "b"]\nmaster_addr = "10.0.0.1"\nnode_gpus = ["0,1"]\n'
    )
    probs = roster_problems(s)
    assert any("cluster.hosts has 2 entries" in p and "(3)" in p for p in probs)
    assert any(p.startswith("cluster.node_gpus has 1 entries; it needs 3") for p in probs)
    s = _spec('launcher = "ssh"\nhosts = ["a", "-oProxyCommand=x", "c d"]\n')
    probs = roster_problems(s)
    assert sum("is not an ssh destination" in p for p in probs) == 2
    assert any("loopback" in p for p in probs)  # master_addr 127.0.0.1
    ok = _spec(
        'launcher = "ssh"\nhosts = ["h0", "u@h1", "h2"]\nmaster_addr = "10.0.0.1"\n'
        'remote_home = ["/scratch/td"]\n'
    )
    assert roster_problems(ok) == []
    nodes = roster(ok)
    assert [n.addr for n in nodes] == ["10.0.0.1", "h1", "h2"]
    assert [n.home for n in nodes] == ["", "/scratch/td", "/scratch/td"]


def test_without_remote_home_every_node_uses_the_heads_tunedeck_home(tmp_path, monkeypatch):
    """Issue 31: node 1 wrote under its own default home, not the head's TUNEDECK_HOME."""
    from tunedeck.core.spec import options

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "td-home"))
    s = _spec('launcher = "ssh"\nhosts = ["h0", "h1", "h2"]\nmaster_addr = "10.0.0.1"\n')
    assert [n.home for n in roster(s)] == ["", str(tmp_path / "td-home"), str(tmp_path / "td-home")]
    # a relative TUNEDECK_HOME is sent as the absolute path it names here
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNEDECK_HOME", "rel-home")
    assert roster(s)[1].home == str(tmp_path / "rel-home")
    # one given for all, or one per node, still wins
    s = _spec(
        'launcher = "ssh"\nhosts = ["h0", "h1", "h2"]\nmaster_addr = "10.0.0.1"\n'
        'remote_home = ["/a", "/b"]\n'
    )
    assert [n.home for n in roster(s)] == ["", "/a", "/b"]
    # the spec key says so
    opt = next(o for o in options() if o.key == "cluster.remote_home")
    assert "node 0's TUNEDECK_HOME" in opt.help, opt.help


def test_bad_roster_values_are_refused_by_the_spec_loader():
    with pytest.raises(SpecError) as e:
        _spec('launcher = "pbs"\n')
    assert "cluster.launcher must be one of manual, ssh, slurm" in str(e.value)
    with pytest.raises(SpecError) as e:
        _spec('hosts = "a b"\ninterface = 3\n')
    assert "cluster.interface must be" in str(e.value)


def test_place_sets_c10d_host_local_address_interface_and_gpus(tmp_path):
    from tunedeck.core.backends import plan_run

    s = loads_spec(
        BASE.replace("nnodes = 3", "nnodes = 2")
        + 'launcher = "ssh"\nhosts = ["h0", "h1"]\nmaster_addr = "10.0.0.1"\n'
        'master_port = 29400\ninterface = "ib0"\nnode_gpus = ["0,1", "2,3"]\n'
        'device = "cuda"\nnproc_per_node = 2\n'
    )
    _, plan = plan_run(s, RunDir(tmp_path / "r"), local=False)
    place(s, plan)
    n0, n1 = plan.nodes
    assert n1.host == "h1"
    a0, a1 = n0.argv, n1.argv
    assert a0[a0.index("--rdzv_conf") + 1].endswith(",is_host=1")
    assert a1[a1.index("--rdzv_conf") + 1].endswith(",is_host=0")
    assert a0[a0.index("--local_addr") + 1] == "10.0.0.1"
    assert a1[a1.index("--local_addr") + 1] == "h1"
    assert n1.env["GLOO_SOCKET_IFNAME"] == n1.env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert (n0.env["CUDA_VISIBLE_DEVICES"], n1.env["CUDA_VISIBLE_DEVICES"]) == ("0,1", "2,3")


def test_a_hostname_on_loopback_with_no_route_fails_preflight_naming_the_interface(monkeypatch):
    """Where the hostname resolves to 127.0.0.1 and no interface routes to the master
    (none can be chosen for the user), gloo would bind loopback: the check fails and says
    which interface to set; one that routes is chosen and passes."""
    from tunedeck.core.nodes import iface
    from tunedeck.core.preflight.base import Context
    from tunedeck.core.preflight.network import check_interface
    from tunedeck.core.estimate.resolve import resolve

    spec = resolve(
        loads_spec(
            BASE.replace("nnodes = 3", "nnodes = 2") + 'master_addr = "10.0.0.1"\ndevice = "cpu"\n'
        )
    )
    here = {"hostname_addr": "127.0.0.1", "route_iface": None, "ifaces": {"lo": "127.0.0.1"}}
    monkeypatch.setattr(iface, "facts", lambda master: here)
    monkeypatch.setattr(iface, "route_interface", lambda master: None)
    r = check_interface(Context(spec=spec, resolved=spec))
    assert r.status == "fail", r
    assert "the hostname resolves to 127.0.0.1, so gloo binds loopback" in r.detail
    assert "no interface routes to the master" in r.detail and "cluster.interface" in r.fix
    here.update(route_iface="ens5", ifaces={"lo": "127.0.0.1", "ens5": "10.0.0.7"})
    monkeypatch.setattr(iface, "route_interface", lambda master: "ens5")
    r = check_interface(Context(spec=spec, resolved=spec))
    assert r.status == "pass" and "GLOO_SOCKET_IFNAME=ens5, chosen" in r.detail, r
    assert iface.verdict(here, "lo", "gloo")[0] == "bad"


def test_ssh_argv_is_batch_mode_and_quotes_the_remote_words(monkeypatch):
    monkeypatch.delenv("TUNEDECK_SSH_CONFIG", raising=False)
    argv = ssh_argv("user@h1", ["/opt/my env/bin/python", "-m", "x", "a;rm -rf /"])
    assert "BatchMode=yes" in argv and "-F" not in argv
    assert argv[-3:-1] == ["--", "user@h1"]
    assert shlex.split(argv[-1]) == ["/opt/my env/bin/python", "-m", "x", "a;rm -rf /"]
    monkeypatch.setenv("TUNEDECK_SSH_CONFIG", "/t/cfg")
    argv = ssh_argv("h1", ["true"])
    assert argv[argv.index("-F") + 1] == "/t/cfg"


def test_frames_stay_inside_the_run_and_a_resent_frame_changes_nothing(tmp_path):
    for bad in ("../x", "/etc/passwd", "a/../../b", "", "a//b", "a\\b", 3):
        assert wire.safe_rel(bad) is None
    assert wire.safe_rel("events/rank1.jsonl") == "events/rank1.jsonl"
    wire.write_at(tmp_path, "events/r.jsonl", 0, b"one\n")
    wire.write_at(tmp_path, "events/r.jsonl", 4, b"two\n")
    wire.write_at(tmp_path, "events/r.jsonl", 4, b"two\n")  # resent after a reconnect
    assert (tmp_path / "events" / "r.jsonl").read_bytes() == b"one\ntwo\n"
    msg = wire.parse(wire.data_frame("logs/a.log", 7, b"\x00\xffbin"))
    assert msg["o"] == 7 and msg["f"] == "logs/a.log"


def test_the_node_streams_whole_lines_from_the_heads_offsets(tmp_path):

    run = RunDir(tmp_path / node_run_id("r1", 1))
    (run.path / "events").mkdir(parents=True)
    (run.path / "logs").mkdir()
    (run.path / "events" / "rank1.jsonl").write_bytes(b'{"a":1}\n{"a":2}\n{"a":')
    (run.path / "logs" / "agent.log").write_bytes(b"x\n")
    out = io.BytesIO()
    st = Streamer(run, 1, {"events/rank1.jsonl": 8}, out)
    assert st.pump(final=False) is False  # half a line waits
    frames = [json.loads(x) for x in out.getvalue().splitlines()]
    got = {f["f"]: (f["o"], __import__("base64").b64decode(f["d"])) for f in frames}
    assert got["events/rank1.jsonl"] == (8, b'{"a":2}\n')
    assert got["logs/agent-node1.log"] == (0, b"x\n")
    out.truncate(0)
    out.seek(0)
    assert st.pump(final=True) is True  # the run is over: the rest goes too


def test_paths_of_the_head_become_the_nodes():
    plan = {
        "nodes": [
            {"argv": ["--log_dir", "/h/runs/r1/logs/node1", "/h/runs/r10"], "cwd": "/h/runs/r1"}
        ]
    }
    out = _rewrite(plan, "/h/runs/r1", "/n/runs/r1.node1")
    assert out["nodes"][0]["argv"] == ["--log_dir", "/n/runs/r1.node1/logs/node1", "/h/runs/r10"]
    assert out["nodes"][0]["cwd"] == "/n/runs/r1.node1"


def test_last_step_reads_the_newest_step_from_the_end(tmp_path):
    p = tmp_path / "rank3.jsonl"
    lines = [
        json.dumps({"kind": "step", "step": i, "step_s": 0.5, "pad": "x" * 300})
        for i in range(1, 50)
    ]
    p.write_text("\n".join(lines) + "\n" + json.dumps({"kind": "end", "step": 49}) + "\n")
    assert last_step(p) == (49, 0.5)
    assert last_step(tmp_path / "none.jsonl") == (None, None)


def test_a_node_that_cannot_be_stopped_is_named_when_the_run_ends(tmp_path, monkeypatch):
    import time
    from types import SimpleNamespace

    from tunedeck.core.nodes import link as link_mod

    monkeypatch.setattr(link_mod.NodeLink, "start", lambda self: None)
    monkeypatch.setattr(link_mod, "FINAL_WAIT_S", 0.0)
    spec = loads_spec(
        BASE.replace("nnodes = 3", "nnodes = 2")
        + 'launcher = "ssh"\nhosts = ["h0", "gpu7"]\nmaster_addr = "10.0.0.1"\n'
        "[run]\nstop_grace_s = 0\n"
    )
    run = RunDir(tmp_path / "r1")
    run.path.mkdir()
    saved = []
    ctx = SimpleNamespace(
        spec=spec,
        run=run,
        store=SimpleNamespace(save_finding=saved.append),
        stopping=lambda: True,
        node_rank=0,
    )
    mon = link_mod.NodesMonitor(ctx)
    (lk,) = mon.links
    lk.started, lk.last_seen = True, time.time() - 40  # answered once, then silence
    lk.last_error = "ssh exited with 255: Connection timed out"
    mon.close([])
    cats = {f.category: f for f in saved}
    f = cats["node_not_stopped"]
    assert f.node == 1 and "node 1 (gpu7)" in f.summary and "255" in f.summary
    assert "tunedeck stop r1.node1" in f.fix
    assert json.loads((run.path / "nodes" / "node1" / "link.json").read_text())["host"] == "gpu7"


def test_a_node_gone_before_any_tick_saw_it_is_named_lost_when_the_run_ends(tmp_path, monkeypatch):
    """The head's ranks fail within a second of a lost node's, and the head's run can end
    before a tick heard the node's agent was gone: the close names the node all the same,
    as a tick would (the finding, stop.json naming it, so the end says it), without
    signalling the agent that is closing."""
    from types import SimpleNamespace

    from tunedeck.core.nodes import link as link_mod

    monkeypatch.setattr(link_mod.NodeLink, "start", lambda self: None)
    monkeypatch.setattr(link_mod, "FINAL_WAIT_S", 0.0)
    signals = []
    monkeypatch.setattr(link_mod.os, "kill", lambda pid, sig: signals.append(sig))
    spec = loads_spec(
        BASE.replace("nnodes = 3", "nnodes = 2")
        + 'launcher = "ssh"\nhosts = ["h0", "gpu7"]\nmaster_addr = "10.0.0.1"\n'
    )
    for asked_stop in (False, True):
        run = RunDir(tmp_path / f"r{int(asked_stop)}")
        run.create()
        (run.node_log_dir(1) / "x_0").mkdir(parents=True)  # node 1 had joined
        saved = []
        ctx = SimpleNamespace(
            spec=spec,
            run=run,
            store=SimpleNamespace(save_finding=saved.append),
            stopping=lambda asked_stop=asked_stop: asked_stop,
            node_rank=0,
        )
        mon = link_mod.NodesMonitor(ctx)
        (lk,) = mon.links
        lk.started, lk.connected = True, True
        lk.gone = "the agent of node 1 (pid 4242) is gone while its run is running"
        mon.close([])  # no tick ran since the loss
        lost = [f for f in saved if f.category == "node_lost"]
        assert len(lost) == 1 and lost[0].node == 1 and lost[0].severity == "error"
        assert lost[0].summary.startswith("node 1 (gpu7) was lost mid-run: the agent of node 1")
        assert not [f for f in saved if f.category == "node_not_stopped"]
        stop = run.read_stop()
        if asked_stop:  # a stop someone asked for stays theirs
            assert stop is None
        else:
            assert stop["failed"] and stop["node"] == 1
            assert stop["by"].startswith("node 1 (gpu7) was lost mid-run")
    assert not signals


def test_the_watcher_decides_from_the_plan_once_and_a_dead_node_reads_lost(tmp_path):
    from tests.test_manage import make_run
    from tunedeck.core.views.watch import RunWatcher

    run_dir = make_run(
        tmp_path / "runs",
        "20261202-020000-two-0a0a",
        status="running",
        cluster__nnodes=2,
        cluster__master_addr="10.0.0.1",
    )
    nd = run_dir / "nodes" / "node1"
    nd.mkdir(parents=True)
    (nd / "state.json").write_text(json.dumps({"status": "running"}))  # as last streamed
    (nd / "link.json").write_text(
        json.dumps(
            {
                "node": 1,
                "connected": True,
                "started": True,
                "gone": "the agent of node 1 is gone",
                "error": "ssh exited with 255",  # the link dropping after it: a consequence
            }
        )
    )
    w = RunWatcher(run_dir)
    rows = w.poll(history=False).nodes
    assert [r["node"] for r in rows] == [0, 1]
    assert rows[1]["status"] == "lost" and rows[1]["reach"] == "lost"
    assert rows[1]["message"].startswith("the agent of node 1 is gone"), rows[1]
    assert "ssh exited with 255" in rows[1]["message"]
    # the plan never changes after launch: the watcher does not read it again
    (run_dir / "plan.json").write_text("{not json")
    assert [r["node"] for r in w.poll(history=False).nodes] == [0, 1]
    # a watcher that first finds it damaged shows no nodes, for good
    w2 = RunWatcher(run_dir)
    assert w2.poll(history=False).nodes == []
    (run_dir / "plan.json").write_text(
        json.dumps({"nnodes": 2, "nproc_per_node": 1, "nodes": [{}, {}]})
    )
    assert w2.poll(history=False).nodes == []


def test_a_node_that_sees_the_head_folder_writes_its_records_there_and_streams_none(tmp_path):
    from tunedeck.core.nodes.link import shared_marker
    from tunedeck.core.nodes.remote import sees_head_dir, share_records, shared

    head = RunDir(tmp_path / "head" / "r1")
    head.create()
    marker = shared_marker(head)
    assert sees_head_dir(marker)
    assert not sees_head_dir({**marker, "token": "another run's"})
    assert not sees_head_dir({"path": str(tmp_path / "elsewhere"), "token": marker["token"]})
    node = RunDir(tmp_path / "node" / "r1.node1")
    node.create()
    share_records(node, str(head.path), 1, 2)
    assert shared(node)
    with open(node.event_file(3), "a") as f:  # rank 3 = node 1's second rank
        f.write('{"kind":"step","step":1}\n')
    assert head.event_file(3).read_text() == '{"kind":"step","step":1}\n'
    (node.logs / "node1" / "x_0").mkdir()
    assert (head.logs / "node1" / "x_0").is_dir()
    (node.path / "stacks").mkdir()
    (node.path / "stacks" / "rank2.txt").write_text("dump\n")
    out = io.BytesIO()
    Streamer(node, 1, {}, out).pump(final=True)
    sent = {json.loads(x)["f"] for x in out.getvalue().splitlines()}
    assert sent == {"stacks/rank2.txt"}  # the rest is in place already


def test_a_lost_node_with_restarts_left_is_asked_back_and_named_if_it_never_returns(
    tmp_path, monkeypatch
):
    import time
    from types import SimpleNamespace

    from tunedeck.core.nodes import link as link_mod

    monkeypatch.setattr(link_mod.NodeLink, "start", lambda self: None)
    spec = loads_spec(
        BASE.replace("nnodes = 3", "nnodes = 2")
        + 'launcher = "ssh"\nhosts = ["h0", "gpu7"]\nmaster_addr = "10.0.0.1"\n'
        "join_timeout_s = 30\n[run]\nmax_restarts = 1\n"
    )
    run = RunDir(tmp_path / "r1")
    run.create()
    run.write_state({"attempt": 0, "launches": []})
    (run.node_log_dir(1) / "x_0").mkdir(parents=True)  # node 1 had joined
    saved, stops = [], []
    ctx = SimpleNamespace(
        spec=spec,
        run=run,
        store=SimpleNamespace(save_finding=saved.append),
        stopping=lambda: False,
        node_rank=0,
    )
    mon = link_mod.NodesMonitor(ctx)
    monkeypatch.setattr(mon, "_stop_head", lambda why, node: stops.append((why, node)))
    (lk,) = mon.links
    lk.started, lk.connected, lk.gone = True, True, "the agent of node 1 is gone"
    t = time.time()
    mon.tick(t, [])
    assert lk.reviving is not None and not stops  # asked back, the run goes on
    assert saved[-1].category == "node_lost" and saved[-1].severity == "warning"
    mon.tick(t + 29, [])
    assert not stops
    mon.tick(t + 31, [])  # not back within join_timeout_s
    assert stops and stops[0][1] == 1 and "did not come back within 30s" in stops[0][0]
    assert saved[-1].severity == "error" and "node 1 (gpu7)" in saved[-1].summary
    # a node that is back is judged afresh: a second loss, with no restart left (the head
    # is in its attempt 1 of max_restarts 1, started before the loss), stops
    lk.reviving, lk.gone, stops[:] = t, "", []
    mon.reported.discard(("gone for good", 1))
    mon.tick(t + 32, [])
    assert lk.reviving is None
    run.write_state({"attempt": 1, "launches": [{"t": t + 1}]})
    lk.gone, lk.gone_at = "the agent of node 1 is gone again", t + 33
    mon.tick(t + 33, [])
    assert stops and "gone again" in stops[0][0]
    # the head restarted already for a loss (its ranks failed first): that attempt waits
    run.write_state({"attempt": 1, "launches": [{"t": t + 41}]})
    assert mon._restart_left(t + 40) and not mon._restart_left(t + 42)


def test_a_slurm_node_writes_its_records_into_the_run_folder(tmp_path):
    from tests.test_manage import make_run
    from tunedeck.core.nodes.slurm import prepare_node

    run_dir = make_run(
        tmp_path / "runs",
        "20261202-030000-slurm-0a0a",
        status="running",
        cluster__nnodes=2,
        cluster__master_addr="10.0.0.1",
        cluster__launcher="slurm",
    )
    node = prepare_node(run_dir, 1, "10.0.0.1")
    assert node.path == run_dir.parent / "20261202-030000-slurm-0a0a.node1"
    head = RunDir(run_dir)
    nproc = head.nproc_per_node
    for r in range(nproc, 2 * nproc):  # node 1's ranks land in the run's events/
        assert node.event_file(r).resolve() == head.event_file(r).resolve()
    assert not node.event_file(0).exists()
    assert node.agent_log.resolve() == (head.logs / "agent-node1.log").resolve()
    plan = json.loads(node.plan.read_text())
    assert plan["nodes"][1]["argv"][
        plan["nodes"][1]["argv"].index("--rdzv_endpoint") + 1
    ].startswith("10.0.0.1:")
    assert prepare_node(run_dir, 1, "10.0.0.1").path == node.path  # again: the same folder


def test_slurm_nodes_are_shown_by_host_name_not_address(tmp_path, monkeypatch):
    """Issue 31: under Slurm node 0's host was shown as the spec's master_addr (an IP). Each
    node's task records its Slurm node name; `tunedeck nodes`, the plan and state.json `net`
    name it, and the rendezvous keeps its address."""
    from tests.test_manage import make_run
    from tunedeck.core.nodes.slurm import prepare_node
    from tunedeck.core.nodes.view import format_rows, node_rows

    run_dir = make_run(
        tmp_path / "runs",
        "20261202-040000-slurm-0b0b",
        status="running",
        cluster__nnodes=2,
        cluster__master_addr="10.0.0.1",
        cluster__launcher="slurm",
    )
    # queued: no host is known yet, and none is made up from an address
    assert [r["host"] for r in node_rows(run_dir)] == ["", ""]
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-a")
    prepare_node(run_dir, 0, "10.0.0.1")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-b")
    node = prepare_node(run_dir, 1, "10.0.0.1")
    rows = node_rows(run_dir)
    assert [r["host"] for r in rows] == ["gpu-a", "gpu-b"], rows
    text = "\n".join(format_rows(rows))
    assert "gpu-a" in text and "10.0.0.1" not in text, text
    head = RunDir(run_dir)
    assert head.read_state()["net"]["host"] == "gpu-a"
    assert head.read_state()["net"]["master"] == "10.0.0.1"  # an address where one is meant
    assert head.read_plan()["nodes"][0]["host"] == "gpu-a"
    assert json.loads(node.state.read_text())["net"]["host"] == "gpu-b"
    argv = head.read_plan()["nodes"][0]["argv"]
    assert argv[argv.index("--rdzv_endpoint") + 1].startswith("10.0.0.1:")


def test_nodes_agree_on_where_a_restart_continues(tmp_path):
    """ms-swift or a script on two ssh nodes: the head decides (its last checkpoint while every
    node shares its folder, step 0 while one does not) and writes it; node 1 reads the decision
    for this restart from the head's folder, not an older one, and is told the same."""
    import os
    import time

    from tunedeck.core.backends.base import Restart
    from tunedeck.core.nodes.link import link_file
    from tunedeck.core.rundir import write_json_atomic
    from tunedeck.core.supervisor import restarts

    spec = loads_spec(
        'backend = "script"\n[script]\npath = "x.py"\n[cluster]\nnnodes = 2\n'
        'launcher = "ssh"\nhosts = ["a", "b"]\nmaster_addr = "10.0.0.1"\n',
        source="<test>",
    )
    head, node = RunDir(tmp_path / "head"), RunDir(tmp_path / "node")
    for r in (head, node):
        r.path.mkdir()
    ck = tmp_path / "head" / "output" / "checkpoint-8"
    mine = Restart.at(ck, var="TUNEDECK_RESUME_FROM")
    assert restarts.agreement_needed(spec, mine)
    assert not restarts.agreement_needed(spec, Restart.at(ck))  # the built-in trainer

    # node 1's link says it shares the head's folder: the head's checkpoint for everyone
    link = link_file(head, 1)
    link.parent.mkdir(parents=True)
    write_json_atomic(link, {"node": 1, "shared": True})
    said = restarts.head_decides(head, spec, mine, attempt=1)
    assert said.checkpoint == ck and said.environ() == {"TUNEDECK_RESUME_FROM": str(ck)}
    write_json_atomic(node.path / "node.json", {"head_dir": str(head.path), "shared": True})
    there = restarts.head_folder(node)
    assert there == head.path
    assert restarts.head_said(there, 2, since=time.time() + 60) is None  # an older decision
    theirs = restarts.follow(
        Restart.at(None, var="TUNEDECK_RESUME_FROM"), restarts.head_said(there, 1, since=0)
    )
    assert theirs.checkpoint == ck and theirs.environ() == said.environ()

    # a node apart: the head says step 0, and that node does not wait for it
    write_json_atomic(link, {"node": 1, "shared": False})
    said = restarts.head_decides(head, spec, mine, attempt=2)
    assert said.checkpoint is None and "node 1" in said.note and said.environ() == {}
    assert restarts.head_said(there, 2, since=0).checkpoint is None
    os.unlink(node.path / "node.json")
    assert restarts.head_folder(node) is None
    assert restarts.apart_here(mine).checkpoint is None
    # nothing said in time: step 0, and why
    assert (
        restarts.follow(mine, None).checkpoint is None
        and "did not say" in restarts.follow(mine, None).note
    )


def test_slurm_watch_ends_the_run_a_failed_node_breaks_and_stops_a_node_whose_head_ended(tmp_path):
    """Under Slurm every agent exits 0 (srun ends nothing), so each reads the others' state
    on the shared disk: a node's failed run stops the head's as a failure naming it, and a
    head's failed run stops the node's; each agent is woken by SIGUSR1."""
    import signal
    import time
    from types import SimpleNamespace

    from tunedeck.core.nodes.slurm import NodesWatch
    from tunedeck.core.rundir import write_json_atomic

    woken = []
    old = signal.signal(signal.SIGUSR1, lambda *_: woken.append(1))
    try:
        spec = loads_spec(
            'backend = "script"\n[script]\npath = "/x/t.py"\n[cluster]\n'
            'nnodes = 2\nlauncher = "slurm"\n'
        )
        head = RunDir(tmp_path / "runs" / "r1")
        node = RunDir(tmp_path / "runs" / node_run_id("r1", 1))
        for d in (head, node):
            d.path.mkdir(parents=True)
            write_json_atomic(d.state, {"status": "running"})
        (node.path / "node.json").write_text(json.dumps({"head_dir": str(head.path)}))
        saved = []
        stopping = {"head": False, "node": False}

        signalled = []

        def ctx(run, rank, who):
            return SimpleNamespace(
                run=run,
                spec=spec,
                node_rank=rank,
                stopping=lambda: stopping[who],
                store=SimpleNamespace(save_finding=saved.append),
                signal_ours=lambda st, pids, sig: signalled.append((pids, sig)) or pids,
            )

        hw, nw = NodesWatch(ctx(head, 0, "head")), NodesWatch(ctx(node, 1, "node"))
        hw.tick(time.time(), [])
        nw.tick(time.time(), [])
        assert not head.stop_request.exists() and not node.stop_request.exists()
        # node 1's attempt 0 failed and it waits to restart: the head's attempt, started
        # before, ends (its ranks could wait in a collective for node 1 forever)
        write_json_atomic(
            head.state,
            {
                "status": "running",
                "attempt": 0,
                "torchrun_pid": 11,
                "worker_pids": [12],
                "launches": [{"t": 100.0}],
            },
        )
        write_json_atomic(
            node.state,
            {
                "status": "running",
                "attempt": 1,
                "attempts": [{"attempt": 0, "exit_code": 1, "ended": 200.0}],
            },
        )
        hw.tick(time.time(), [])
        assert signalled == [([11, 12], signal.SIGKILL)]
        # the head's next attempt (started after node 1's ended) is left alone
        write_json_atomic(
            head.state,
            {
                "status": "running",
                "attempt": 1,
                "torchrun_pid": 13,
                "worker_pids": [14],
                "launches": [{"t": 100.0}, {"t": 250.0}],
            },
        )
        write_json_atomic(
            node.state,
            {
                "status": "running",
                "attempt": 1,
                "note": "x",
                "attempts": [{"attempt": 0, "exit_code": 1, "ended": 200.0}],
            },
        )
        hw.tick(time.time(), [])
        assert len(signalled) == 1
        write_json_atomic(head.state, {"status": "running"})
        # node 1's run failed: the head stops, as a failure that names node 1
        write_json_atomic(
            node.state,
            {"status": "failed", "host": "gpu7", "message": "torchrun exited with code 1"},
        )
        hw.tick(time.time(), [])
        req = head.read_stop()
        assert (
            req["failed"] is True
            and req["node"] == 1
            and req["by"]
            == ("node 1 (gpu7) was lost mid-run: its run ended failed: torchrun exited with code 1")
        )
        assert saved and saved[0].category == "node_lost" and saved[0].node == 1
        assert woken == [1]
        hw.tick(time.time(), [])  # said once
        assert len(saved) == 1
        # the other way: the head's run failed while a node runs on
        write_json_atomic(node.state, {"status": "running"})
        nw2 = NodesWatch(ctx(node, 1, "node"))
        write_json_atomic(
            head.state, {"status": "failed", "message": "torchrun exited with code 1"}
        )
        nw2.tick(time.time(), [])
        req = node.read_stop()
        assert req["by"] == "the head's run ended failed: torchrun exited with code 1"
        # the run failed: node 1's record is a failure too, and names the head (node 0)
        assert req["failed"] is True and req["node"] == 0 and woken == [1, 1]
        # a run that is stopping already is left to it; a succeeded head stops nobody
        node.stop_request.unlink()
        stopping["node"] = True
        NodesWatch(ctx(node, 1, "node")).tick(time.time(), [])
        assert not node.stop_request.exists()
        stopping["node"] = False
        write_json_atomic(head.state, {"status": "succeeded"})
        NodesWatch(ctx(node, 1, "node")).tick(time.time(), [])
        assert not node.stop_request.exists()
        # at the head's end: a node that failed unseen is still named; one stopped with
        # the whole job (a stop asked for) is not a loss
        write_json_atomic(node.state, {"status": "failed", "host": "gpu7", "message": "x"})
        late = NodesWatch(ctx(head, 0, "head"))
        late.close([])
        assert late.end_notes == ["node 1 (gpu7) was lost mid-run: its run ended failed: x"]
        write_json_atomic(node.state, {"status": "stopped", "message": "stopped (graceful)"})
        stopping["head"] = True
        quiet = NodesWatch(ctx(head, 0, "head"))
        quiet.close([])
        assert quiet.end_notes == [] and len(saved) == 2
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_a_nodes_folder_in_a_shared_home_is_not_a_run_of_its_own(tmp_path):
    from tunedeck.core.views.registry import find_run, list_runs
    from tunedeck.core.store.state import new_state

    head = "20261203-120000-two-hosts-ab12"
    for name, extra in ((head, None), (node_run_id(head, 1), {"head_run_id": head, "node": 1})):
        RunDir(tmp_path / name).create()
        RunDir(tmp_path / name).write_state(new_state(name, "two-hosts", 10))
        if extra:
            (tmp_path / name / "node.json").write_text(json.dumps(extra))
    assert [r.run_id for r in list_runs(tmp_path)] == [head]
    assert find_run("two-hosts", tmp_path).run_id == head
    assert find_run(node_run_id(head, 1), tmp_path).run_id == head


@pytest.mark.parametrize(
    "example, test",
    [("two-nodes-ssh.toml", "test_multinode.py"), ("two-nodes-slurm.toml", "test_slurm_nodes.py")],
)
def test_the_docs_examples_are_the_files_the_two_host_tests_run(example, test):
    from pathlib import Path

    from tunedeck.core.spec import load_spec

    repo = Path(__file__).resolve().parent.parent
    path = repo / "docs" / "examples" / example
    assert f"```toml\n{path.read_text()}```" in (repo / "docs" / "multinode.md").read_text()
    assert (
        f'EXAMPLE = REPO / "docs" / "examples" / "{example}"' in (repo / "tests" / test).read_text()
    )
    spec = load_spec(path)  # valid as it is, its data path found from the file's folder
    assert Path(spec.data.path).is_file() and not spec.cluster.interface


# gloo's own lines (torch 2.x) on a node whose peer announced loopback: it dials its own
# machine and is refused, then init_process_group fails
GLOO_REFUSED = [
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/debug_logger.cc:9] ERROR failed "
    "to connect, willRetry=0, retry=4, retryLimit=3, rank=1, size=2, local=[127.0.0.1]:5304, "
    "remote=[127.0.0.1]:6038, error=SO_ERROR: Connection refused, remote=[127.0.0.1]:6038",
    "Traceback (most recent call last):",
    '  File "/x/train.py", line 2, in <module>',
    '    dist.init_process_group("gloo")',
    "RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/"
    "gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, "
    "remote=[127.0.0.1]:6038",
]


def _net(ifname: str, master: str = "10.9.0.1", mine: str = "10.9.0.1") -> dict:
    return {
        "master": master,
        "backend": "gloo",
        "ifname": ifname,
        "hostname_addr": "127.0.0.1",
        "route_iface": "td0",
        "ifaces": {"lo": "127.0.0.1", "td0": mine},
    }


def test_diagnose_names_the_node_address_and_interface_of_ranks_on_loopback(tmp_path):
    """A Slurm run over two nodes whose hostnames resolve to 127.0.0.1: node 0 started with
    no GLOO_SOCKET_IFNAME (gloo bound loopback), node 1 with the interface it routes through;
    node 1's rank dialed node 0's 127.0.0.1 and was refused. `diagnose` blames neither the
    rendezvous nor the crash: one root cause names node 0, the address, the interface."""
    from tunedeck.core.api import diagnose

    run = RunDir(tmp_path / "runs" / "20261204-000000-two-ab12")
    node1 = RunDir(tmp_path / "runs" / node_run_id(run.run_id, 1))
    for d, st in (
        (run, {"status": "failed", "host": "gpu-a", "net": _net("")}),
        (node1, {"status": "failed", "host": "gpu-b", "net": _net("td0", mine="10.9.0.2")}),
    ):
        d.path.mkdir(parents=True)
        (d.path / "state.json").write_text(json.dumps({"run_id": d.run_id, **st}))
    log = run.logs / "node1" / "x_0" / "attempt_0" / "0" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(GLOO_REFUSED) + "\n")

    found = diagnose([str(run.path)])
    top = found[0]
    assert top.category == "loopback_address" and top.root_cause, [f.summary for f in found]
    assert top.node == 0 and top.host == "gpu-a"
    assert "node 0 (gpu-a): the ranks talked from 127.0.0.1" in top.summary, top.summary
    assert 'set cluster.interface = "td0"' in top.summary
    assert "hostname resolves to 127.0.0.1 and no GLOO_SOCKET_IFNAME was set" in top.cause
    assert "routes to 10.9.0.1 on node 0 (td0 is 10.9.0.1 there)" in top.fix, top.fix
    assert any("remote=[127.0.0.1]:6038" in e for e in top.evidence), top.evidence
    assert any(e.startswith(f"{run.state}: net: GLOO_SOCKET_IFNAME unset") for e in top.evidence)
    assert [f for f in found if f.root_cause] == [top]  # the refused connect: its evidence
    assert sum(f.category == "loopback_address" for f in found) == 1

    # records where every node named a routed interface explain nothing: the log's dial is
    # named by the line rule alone, with no node; a user's pinned `lo` is named as the cause
    st = json.loads(run.state.read_text())
    (run.path / "state.json").write_text(json.dumps(st | {"net": _net("td0")}))
    plain = [f for f in diagnose([str(run.path)]) if f.category == "loopback_address"]
    assert (
        len(plain) == 1 and plain[0].node == 1 and "set cluster.interface =" not in plain[0].summary
    )
    (run.path / "state.json").write_text(json.dumps(st | {"net": _net("lo")}))
    top = diagnose([str(run.path)])[0]
    assert (
        top.category == "loopback_address" and "GLOO_SOCKET_IFNAME=lo names a loopback" in top.cause
    )
    assert "drop env.GLOO_SOCKET_IFNAME = 'lo'" in top.fix, top.fix


def test_a_plain_slurm_export_gives_every_task_its_own_node_part(tmp_path, monkeypatch):
    """`export --format slurm` of a spec whose launcher is not Slurm (torchrun under srun, no
    tunedeck agent): node 0's own `is_host=1`, `--local_addr` and the interface chosen on this
    machine are not every task's; an interface the spec names stays."""
    from pathlib import Path

    from tunedeck.core.backends.export import export
    from tunedeck.core.nodes import iface
    from tunedeck.core.spec import load_spec

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    monkeypatch.setattr(iface, "route_interface", lambda master: "eth7")  # this machine's
    example = Path(__file__).resolve().parent.parent / "docs" / "examples" / "two-nodes-ssh.toml"
    spec = load_spec(example)
    text = export(spec, "slurm")
    assert "--rdzv_conf join_timeout=120 \\\n" in text, text
    assert "is_host" not in text and "--local_addr" not in text and "eth7" not in text
    assert '--node_rank "$SLURM_NODEID"' in text
    spec.cluster.interface = "ib0"
    named = export(spec, "slurm")
    assert "export GLOO_SOCKET_IFNAME=ib0" in named and "export NCCL_SOCKET_IFNAME=ib0" in named


@pytest.mark.parametrize("asked", [True, False], ids=["user-stop", "head-failed"])
def test_the_heads_end_reaches_a_node_as_an_asked_stop_or_as_a_failure(
    tmp_path, monkeypatch, asked
):
    """Over ssh the head forwards its end to the nodes still running: a stop someone asked
    for stays a stop on the node (diagnosed as such); a head that ended by itself (its ranks
    failed) makes the node's end a failure naming the head, never a stop on request."""
    import time
    from types import SimpleNamespace

    from tunedeck.core.diagnose.exits import asked_stop
    from tunedeck.core.nodes import link as link_mod
    from tunedeck.core.nodes.remote import request_stop, write_stop
    from tunedeck.core.rundir import write_json_atomic

    monkeypatch.setattr(link_mod.NodeLink, "start", lambda self: None)
    monkeypatch.setattr(link_mod, "FINAL_WAIT_S", 0.0)
    spec = loads_spec(
        BASE.replace("nnodes = 3", "nnodes = 2")
        + 'launcher = "ssh"\nhosts = ["h0", "gpu7"]\nmaster_addr = "10.0.0.1"\n'
        "[run]\nstop_grace_s = 0\n"
    )
    head = RunDir(tmp_path / "r1")
    head.path.mkdir()
    if asked:
        write_stop(head, "graceful", 0)  # what `tunedeck stop` leaves on the head
    ctx = SimpleNamespace(
        spec=spec,
        run=head,
        store=SimpleNamespace(save_finding=lambda f: None),
        stopping=lambda: asked,
        node_rank=0,
    )
    mon = link_mod.NodesMonitor(ctx)
    (lk,) = mon.links
    lk.started, lk.last_seen = True, time.time()
    mon.close([])
    cmd = lk.pending_stop  # what the node gets now, or in its next hello
    assert cmd["op"] == "stop"
    assert cmd.get("failed_node") == (None if asked else 0), cmd
    # the node's side of it
    node = RunDir(tmp_path / "r1.node1")
    node.path.mkdir()
    write_json_atomic(node.state, {"status": "running"})
    request_stop(node, cmd["mode"], cmd["grace_s"], cmd["t"], cmd.get("failed_node"))
    req = node.read_stop()
    if asked:
        assert "failed" not in req and asked_stop(node.path) is not None
    else:
        assert req["failed"] is True and req["node"] == 0 and asked_stop(node.path) is None
