"""The monitor on a two-node run: the hardware pane lists every node's ranks (node 1's from
what the head holds for it), and the stop dialog names the nodes a stop reaches.

The run folders are the project's own writes: the head's by `prepare_run` (tests/test_manage
`make_run`), node 1's by `remote.materialise` (ssh) or `slurm.prepare_node` (Slurm); each
node's telemetry by its agent's `TelemetrySampler` into its run.db, sampling real processes
(the ranks here are sleeping Pythons); over ssh node 1's records reach the head as its link
receives them: the node's `Streamer` frames, the head's `NodeLink._handle` writing them,
`NodesMonitor` writing link.json. Only ssh itself is left out (tests/test_multinode.py runs
it between two network namespaces). NVML is the project's `FakePynvml`, so the GPU case
reads the same on a machine with GPUs or without.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import until
from tests.test_manage import make_run
from tunedeck.core.nodes import wire
from tunedeck.core.nodes.remote import Streamer, materialise, node_run_id
from tunedeck.core.rundir import RunDir, read_json
from tunedeck.core.spec import load_spec
from tunedeck.core.store.store import Store
from tunedeck.core.telemetry.fake import FakePynvml
from tunedeck.core.telemetry.nvml import Nvml
from tunedeck.core.telemetry.sampler import TelemetrySampler
from tunedeck.core.nodes.view import node_rows, node_telemetry
from tunedeck.core.views.watch import RunWatcher
from tunedeck.tui.app import TunedeckApp
from tunedeck.tui.screens.confirm import ConfirmScreen
from tunedeck.tui.screens.monitor import MonitorScreen, stop_question
from tunedeck.tui.widgets.hardware import hardware_text
from tunedeck.tui.widgets.hardware import HardwareView

RUN_ID = "20261204-120000-two-node-0a0a"
MASTER = "10.0.0.1"


@pytest.fixture
def ranks():
    """Four rank processes (two per node), alive for the test, ended in finally."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) for _ in range(4)
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _nvml(gpus: int, pids: list[int]) -> Nvml:
    if not gpus:
        return Nvml(FakePynvml(no_driver=True))  # the CPU demo's: no driver
    return Nvml(FakePynvml(gpus, procs={g: [(pid, 700)] for g, pid in enumerate(pids)}))


def sample(run: RunDir, rank_pids: dict[int, int], gpus: int) -> None:
    """One telemetry sample of `run`'s ranks, as its agent's sampler takes it."""
    with Store(run, write=True) as store:
        s = TelemetrySampler(
            store.telemetry,
            rank_pids=lambda: rank_pids,
            nvml=_nvml(gpus, list(rank_pids.values())),
        )
        s.sample()
        s.close()


def head_run(home: Path, launcher: str) -> RunDir:
    run_dir = make_run(
        home / "runs",
        RUN_ID,
        name="two-node",
        status="running",
        cluster__nnodes=2,
        cluster__master_addr=MASTER,
        cluster__launcher=launcher,
        **({"cluster__hosts": ["h0", "gpu7"]} if launcher == "ssh" else {}),
    )
    return RunDir(run_dir)


def ssh_node(home: Path, head: RunDir) -> RunDir:
    """Node 1's own run folder, as its link's first line makes it on the node (streamed:
    it does not see the head's folder)."""
    node = RunDir(home / "node1-home" / "runs" / node_run_id(RUN_ID, 1))
    materialise(
        node,
        {
            "node": 1,
            "head_dir": str(head.path),
            "run_id": RUN_ID,
            "spec": head.spec.read_text(),
            "plan": head.read_plan(),
            "secrets": read_json(head.secrets, {}),
            "master_addr": MASTER,
        },
    )
    st = node.read_state()
    st.update(status="running", started=time.time())  # its agent took it
    node.write_state(st)
    return node


def nodes_monitor(head: RunDir):
    """The head agent's NodesMonitor, its link not started (no ssh here): what the link
    receives is handed to it below, as its reader thread would."""
    from tunedeck.core.nodes import link as link_mod

    ctx = SimpleNamespace(
        spec=load_spec(head.spec),
        run=head,
        store=SimpleNamespace(save_finding=lambda f: None),
        stopping=lambda: False,
        node_rank=0,
    )
    start = link_mod.NodeLink.start
    link_mod.NodeLink.start = lambda self: None
    try:
        return link_mod.NodesMonitor(ctx)
    finally:
        link_mod.NodeLink.start = start


def stream(node: RunDir, mon) -> None:
    """Node 1 connects: its streamer's frames (hello, state, its telemetry line, its files)
    go through the head's link into the head's folder; the monitor writes link.json."""
    (lk,) = mon.links
    lk._handle({"k": "hello", "run": str(node.path), "pid": 1, "started": True, "host": "gpu7"})
    out = io.BytesIO()
    st = Streamer(node, 1, {}, out)
    st.state()
    st.telemetry(time.time())
    st.pump(final=False)
    for line in out.getvalue().splitlines():
        lk._handle(wire.parse(line))
    mon.tick(time.time(), [])


def _pane(app) -> str:
    s = app.screen
    if not isinstance(s, MonitorScreen) or s.snap is None:
        return ""
    return s.query_one(HardwareView).text


@pytest.mark.parametrize("gpus", [0, 2], ids=["cpu", "gpu"])
async def test_the_hardware_pane_lists_every_nodes_ranks_and_stop_names_the_nodes(
    tmp_path, monkeypatch, ranks, gpus
):
    home = tmp_path / "home"
    head = head_run(home, "ssh")
    sample(head, {0: ranks[0], 1: ranks[1]}, gpus)
    node = ssh_node(tmp_path, head)
    sample(node, {2: ranks[2], 3: ranks[3]}, gpus)
    mon = nodes_monitor(head)
    mon.tick(time.time(), [])  # link.json: node 1 not reached yet
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: "node 1" in _pane(app), what="node 1 in the pane")
        text = _pane(app)
        lines = text.splitlines()
        assert lines[0].startswith("node 0 h0 · ")
        # node 1 is there, its ranks named, and why nothing of it is drawn
        [n1] = [ln for ln in lines if ln.startswith("node 1 ")]
        assert n1 == (
            "node 1 gpu7 · ranks 2-3 · no telemetry from this node on the head (link unreached)"
        )
        if gpus:
            assert [ln[:7] for ln in lines if ln.startswith("GPU")] == ["GPU0 r0", "GPU1 r1"]
        else:
            assert [ln[:6] for ln in lines if ln.startswith("rank ")] == ["rank 0", "rank 1"]
        # the stop dialog names both nodes, node 1 as not reached now
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the dialog")
        q = app.screen.question
        assert f"Stop {RUN_ID}?" in q and "This stops the ranks on all 2 nodes:" in q
        assert "  node 0 h0: ranks 0-1\n" in q
        assert q.endswith(
            "  node 1 gpu7: ranks 2-3 (unreached)\n"
            "An unreached node gets the stop when its link returns."
        )
        await pilot.press("n")  # (yes would signal the run's agent: this test process)
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), what="no")
        assert not head.stop_request.exists()

        # node 1's link comes up: its telemetry line arrives in the head's folder
        stream(node, mon)
        assert (head.path / "nodes" / "node1" / "telemetry.jsonl").stat().st_size > 0
        await until(pilot, lambda: "no telemetry from" not in _pane(app), what="node 1's sample")
        lines = _pane(app).splitlines()
        heads = [i for i, ln in enumerate(lines) if ln.startswith("node ")]
        assert [lines[i].split(" · ")[0] for i in heads] == ["node 0 h0", "node 1 gpu7"]
        n0, n1 = lines[heads[0] : heads[1]], lines[heads[1] :]
        assert lines[heads[1]].startswith("node 1 gpu7 · ranks 2-3 · ")
        if gpus:
            assert lines[heads[1]].startswith("node 1 gpu7 · ranks 2-3 · 2× Fake H200")
            assert [ln[:7] for ln in n0 if ln.startswith("GPU")] == ["GPU0 r0", "GPU1 r1"]
            assert [ln[:7] for ln in n1 if ln.startswith("GPU")] == ["GPU0 r2", "GPU1 r3"]
        else:
            assert "no GPU telemetry; per rank:" in lines[heads[1]]
        # each node's rank processes under its own header, live (its sample has them)
        assert [ln[:6] for ln in n0 if ln.startswith("rank ")] == ["rank 0", "rank 1"]
        assert [ln[:6] for ln in n1 if ln.startswith("rank ")] == ["rank 2", "rank 3"]
        assert all("not running" not in ln for ln in lines)
        await pilot.press("K")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the kill dialog")
        q = app.screen.question
        assert q.startswith(f"Kill every process of {RUN_ID} now")
        assert "This kills the ranks on all 2 nodes:" in q
        assert q.endswith("  node 0 h0: ranks 0-1\n  node 1 gpu7: ranks 2-3")
        await pilot.press("n")
    assert not head.stop_request.exists()


def test_under_slurm_a_nodes_telemetry_is_read_from_its_folder(tmp_path, ranks, monkeypatch):
    """Under Slurm nothing streams: node 1's agent samples into the run.db of its folder
    beside the run's (slurm.prepare_node makes it), and the head's view reads it there."""
    from tunedeck.core.nodes.slurm import prepare_node

    head = head_run(tmp_path / "home", "slurm")
    st = head.read_state()
    head.write_state({**st, "slurm_job": "4242"})  # what sbatch's answer records
    w = RunWatcher(head.path)
    [_, n1] = w.poll(history=False).nodes
    assert n1["telemetry"] == {}  # its agent has not sampled yet
    text = hardware_text({}, None, "login", 100, [{"node": 0, "host": ""}, n1]).plain
    # (under Slurm a node's host is known once the job runs it: none is shown before)
    assert text.endswith(
        "node 1 · ranks 2-3 · no telemetry from this node on the head "
        "(Slurm has not started it yet)"
    )
    assert node_rows(head.path)[1]["reach"] == "waiting for Slurm"
    head.write_state({**st, "slurm_job": "4242", "status": "stopped"})
    assert node_rows(head.path)[1]["reach"] == "never started"  # cancelled while queued
    head.write_state({**st, "slurm_job": "4242"})
    monkeypatch.setenv("SLURMD_NODENAME", "gpu7")  # what slurmd tells the node's task
    node = prepare_node(head.path, 1, MASTER)
    sample(node, {2: ranks[2], 3: ranks[3]}, 0)
    [_, n1] = w.poll(history=False).nodes
    tel = n1["telemetry"]
    assert [r["rank"] for r in tel["procs"]["ranks"]] == [2, 3]
    assert tel == node_telemetry(head, 1) and abs(tel["t"] - time.time()) < 60
    w.close()
    text = hardware_text({}, None, "login", 100, [{"node": 0, "host": ""}, n1]).plain
    lines = text.splitlines()
    assert lines[0].startswith("node 0 login · no telemetry yet")
    assert lines[1] == "node 1 gpu7 · ranks 2-3 · no GPU telemetry; per rank:"
    assert [ln[:6] for ln in lines if ln.startswith("rank ")] == ["rank 2", "rank 3"]
    # an old sample says how old (a node whose link is down streams nothing new)
    later = hardware_text({}, None, "x", 100, [n1], now=tel["t"] + 300).plain
    assert "sample 5 min old (link shared fs)" in later.splitlines()[1]


def test_a_telemetry_line_being_written_is_not_read(tmp_path):
    run = RunDir(tmp_path / "r")
    f = run.path / "nodes" / "node1" / "telemetry.jsonl"
    f.parent.mkdir(parents=True)
    f.write_text('{"t": 1, "host": {"cpu_pct": 5}}\n{"t": 2, "host": {"cpu_')
    assert node_telemetry(run, 1) == {"t": 1, "host": {"cpu_pct": 5}}
    assert node_telemetry(run, 2) == {}  # nothing held for node 2


def test_the_stop_question_counts_nodes_past_the_sixth_and_says_which_ended():
    nodes = [
        {"node": k, "host": f"gpu{k}", "ranks": [2 * k, 2 * k + 1], "status": "running"}
        for k in range(12)
    ]
    nodes[1].update(host="gpu-node-1.a-long-cluster-domain.example.org")
    nodes[3].update(status="failed", reach="done")
    nodes[5].update(reach="lost", status="lost")
    q = stop_question("r1", False, nodes)
    assert "This stops the ranks on all 12 nodes:" in q
    assert "  node 1 gpu-node-1.a-long-clu…: ranks 2-3\n" in q
    assert "  node 3 gpu3: ranks 6-7 (ended: failed)" in q
    assert "  node 5 gpu5: ranks 10-11 (lost: agent gone)\n" in q and "node 6" not in q
    assert q.endswith("  and 6 more nodes (ranks 12-23)")
    # one node: the question as it always was
    assert stop_question("r1", False, nodes[:1]) == stop_question("r1", False, [])
    assert "node" not in stop_question("r1", True, [])


async def test_the_stop_dialog_of_a_big_run_keeps_its_buttons_on_an_80x24_screen(
    tmp_path, monkeypatch
):
    """The worst case: long host names, every named node unreached, the kill's question (in
    the app itself: its stylesheet sizes the dialog)."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    nodes = [
        {
            "node": k,
            "host": f"gpu-node-{k}.cluster.example.org",
            "ranks": list(range(8 * k, 8 * k + 8)),
            "status": "running",
            "reach": "unreached",
        }
        for k in range(128)
    ]
    app = TunedeckApp(refresh_s=3600)
    async with app.run_test(size=(80, 24)) as pilot:
        for hard in (False, True):
            text = stop_question("20261204-120000-two-node-0a0a", hard, nodes)
            app.push_screen(ConfirmScreen(text))
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="dialog")
            await pilot.pause(0.1)
            q = app.screen.query_one("#confirm-question")
            assert q.region.height >= len(text.splitlines())  # wrapped, never cut
            for b in ("#yes", "#no"):
                assert app.screen.query_one(b).region.bottom <= 24, (hard, b)
            await pilot.press("n")
            await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="no")


def test_past_eight_nodes_each_node_is_one_line_and_every_one_is_listed(tmp_path, ranks):
    """A 12-node run: nodes 1-7 in full, 8-11 a line each, every node's ranks named; one
    sample of real processes (this machine's, as node k's agent would take it) stands for
    each node's newest."""
    run = RunDir(tmp_path / "r")
    run.create()
    sample(run, {0: ranks[0], 1: ranks[1]}, 2)
    with Store(run) as store:
        tel = store.telemetry_latest()
    nodes = [
        {"node": k, "host": f"gpu{k}", "ranks": [2 * k, 2 * k + 1], "reach": "connected"}
        for k in range(12)
    ]
    for n in nodes[1:11]:
        n["telemetry"] = {"t": time.time(), **tel}
    nodes[11]["reach"] = "reconnecting"
    text = hardware_text(tel, None, "gpu0", 160, nodes).plain
    lines = text.splitlines()
    heads = [ln for ln in lines if ln.startswith("node ")]
    assert [h.split(" · ")[0] for h in heads] == [f"node {k} gpu{k}" for k in range(12)]
    assert all(f"ranks {2 * k}-{2 * k + 1}" in heads[k] for k in range(1, 12))
    assert sum(ln.startswith("GPU0 r0") for ln in lines) == 8  # nodes 0-7 in full
    assert "nodes 8-11, a line each" in text
    gpus = tel["gpus"]  # the fake GPUs' utilisation moves with time: the sample's own
    mean, low = sum(g["util"] for g in gpus) / 2, min(g["util"] for g in gpus)
    assert heads[8] == (
        f"node 8 gpu8 · ranks 16-17 · 2 GPUs util {mean:.0f}% (min {low:.0f}%) mem 700M/140G"
        " · 2/2 ranks alive"
    )
    assert heads[11] == (
        "node 11 gpu11 · ranks 22-23 · no telemetry from this node on the head (link reconnecting)"
    )
