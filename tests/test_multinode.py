"""One run over two hosts, launched over ssh: two network namespaces joined by a veth pair,
each with its own real sshd and a key made for the test. The head runs `tunedeck launch` in
its namespace and reaches the other host only through ssh; a real 2-node torchrun c10d
rendezvous over gloo trains the CPU demo. The other host keeps its run under its own
TUNEDECK_HOME, so every record the head shows came over the ssh link.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import tomli_w
import tomllib

from tests.conftest import REPO, json_docs, wait_for
from tests.multinode_hosts import IFACE, make_hosts, unavailable

pytestmark = pytest.mark.slow

_why = unavailable()
if _why:
    pytestmark = [pytestmark, pytest.mark.skip(reason=f"two hosts cannot be made: {_why}")]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    h = make_hosts(tmp_path_factory.mktemp("hosts"))
    # a node that never answers: an address on the link that no host holds
    ghost = h.addrs[0].rsplit(".", 1)[0] + ".9"
    with open(h.ssh_config, "a") as f:
        f.write(
            f"\nHost ghost\n  HostName {ghost}\n  ConnectTimeout 3\n  User root\n"
            f"  IdentityFile {h.root / 'id_test'}\n  IdentitiesOnly yes\n"
        )
    try:
        yield h
    finally:
        h.close()


EXAMPLE = REPO / "docs" / "examples" / "two-nodes-ssh.toml"  # docs/multinode.md shows it


def _cluster_table(
    path: Path, hosts, node1: str = "node1", join_s: int = 120, node1_home: Path | None = None
) -> dict:
    """The example's [cluster] with this machine's values. No `interface`: the hostname
    resolves to 127.0.0.1 here, so gloo would bind loopback; the plan names the interface
    that routes to master_addr (IFACE on both hosts)."""
    c = tomllib.loads(EXAMPLE.read_text())["cluster"]
    c.update(
        master_addr=hosts.addrs[0],
        hosts=["node0", node1],
        remote_home=[str(node1_home or path.parent / "node1-home")],
        join_timeout_s=join_s,
        node_silence_s=8,  # an ssh-only outage below lasts 30 s, ~4 x this
    )
    return c


def _cluster(path: Path, hosts, **kw) -> str:
    """The [cluster] body of a run over the two hosts (for a spec written by hand)."""
    return tomli_w.dumps(_cluster_table(path, hosts, **kw))


def _spec(
    path: Path,
    hosts,
    steps: int,
    node1: str = "node1",
    join_s: int = 120,
    run: str = "",
    save_steps: int = 0,
) -> Path:
    """The example spec (docs/examples/two-nodes-ssh.toml) for these two hosts."""
    spec = tomllib.loads(EXAMPLE.read_text())
    spec["data"]["path"] = str(REPO / "presets" / "data" / "demo_chat.jsonl")
    spec["train"].update(max_steps=steps, save_steps=save_steps)
    spec["cluster"] = _cluster_table(path, hosts, node1, join_s)
    spec["run"].update(tomllib.loads(run))
    path.write_text(tomli_w.dumps(spec))
    return path


def _head_cli(hosts, home: Path, *args: str, timeout: float = 300) -> dict | list:
    """The real `tunedeck` command line, run on the head host (its namespace)."""
    env = dict(os.environ, TUNEDECK_HOME=str(home), TUNEDECK_SSH_CONFIG=str(hosts.ssh_config))
    proc = subprocess.run(
        hosts.netns_argv(0, [sys.executable, "-m", "tunedeck.tui", *args, "--json"]),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )
    assert proc.stdout.strip(), (
        f"tunedeck {args} printed nothing ({proc.returncode}):\n{proc.stderr}"
    )
    docs = json_docs(proc.stdout)
    return docs if "--wait" in args and args[0] == "launch" else docs[0]


OUTAGE_S = 30  # ssh-only outage (issue 31's bar): ~4 x the test's cluster.node_silence_s (8 s)


def _ssh_outage(hosts, agent_pid: int) -> None:
    """Node 1 unreachable over ssh (its sshd gone, the head's ssh to it killed); the
    network between the hosts, and so the ranks' traffic, stays up."""
    hosts.sshd[1].kill()
    for p in psutil.Process(agent_pid).children():
        if p.name() == "ssh":
            p.kill()


def _head_text(hosts, home: Path, *args: str) -> str:
    """What `tunedeck ARGS` prints on the head (text, not --json)."""
    env = dict(os.environ, TUNEDECK_HOME=str(home), TUNEDECK_SSH_CONFIG=str(hosts.ssh_config))
    proc = subprocess.run(
        hosts.netns_argv(0, [sys.executable, "-m", "tunedeck.tui", *args]),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _unquoted(script: str) -> str:
    return script.replace("'", "")


def _dry_run_and_exports_are_what_launch_wrote(hosts, home: Path, spec: Path, run_dir: Path):
    """`launch --dry-run`, `export --format sh` and `--format nodes` of the spec (its port
    pinned to the one the launch picked) render the very argv and env the launch wrote:
    launch.sh byte for byte once the run's id and folder are put in (less its guard against
    replaying into the run, and the shell quotes the placeholders needed), plan.json per
    node word for word."""
    import shlex

    plan = json.loads((run_dir / "plan.json").read_text())
    port = _state(run_dir / "state.json")["master_port"]
    pin = ("--set", f"cluster.master_port={port}")
    run_id = run_dir.name
    launch_sh = (run_dir / "launch.sh").read_text()
    guard = launch_sh.index("# refuses to append")
    unguarded = launch_sh[:guard] + launch_sh[launch_sh.index("\nfi\n", guard) + 4 :]
    dry = _head_text(hosts, home, "launch", str(spec), "--dry-run", *pin)
    # the preview's "<run-id>" needs shell quotes that the real id does not: quotes aside
    assert _unquoted(dry.replace("<run-id>", run_id)).startswith(_unquoted(unguarded)), dry
    export_dir = str(home / "runs" / "two-hosts-export")

    def as_run(text: str) -> str:
        return text.replace(export_dir, str(run_dir)).replace("two-hosts-export", run_id)

    sh = as_run(_head_text(hosts, home, "export", str(spec), "--format", "sh", *pin))
    lines = sh.splitlines()
    summary = lines[lines.index("set -euo pipefail") + 1]  # the export's one added line
    assert summary.startswith("# effective batch")
    assert _unquoted(sh.replace(summary + "\n", "", 1)) == _unquoted(unguarded)
    nodes = as_run(_head_text(hosts, home, "export", str(spec), "--format", "nodes", *pin))
    blocks = nodes.split("\n# node ")[1:]
    assert len(blocks) == 2
    for block, want in zip(blocks, plan["nodes"]):
        words = shlex.split(block.split("\n", 1)[1].replace("\\\n", " "))
        assert words[:3] == ["cd", want["cwd"], "&&"] and words[3] == "env"
        n = 4 + next(i for i, w in enumerate(words[4:]) if "=" not in w)
        assert dict(w.split("=", 1) for w in words[4:n]) == want["env"], block
        assert words[n:] == want["argv"], block
    assert plan["nodes"][1]["env"]["GLOO_SOCKET_IFNAME"] == IFACE  # chosen: routes to node 0
    assert "--local_addr" in plan["nodes"][1]["argv"]


def _findings(run_dir: Path) -> list[dict]:
    from tunedeck.core.store.store import read_findings

    return read_findings(run_dir)


def _state(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _kill_marked(run_id: str) -> list[int]:
    from tunedeck.core.supervisor.procs import marked_processes

    killed = []
    for p in marked_processes(run_id):
        try:
            p.kill()
            killed.append(p.pid)
        except psutil.Error:
            pass
    return killed


def _cleanup(*run_ids: str, agents: tuple[Path, ...] = ()) -> None:
    """Kill what is left: the agents of the given run folders (a node's agent may be
    restarting its torchrun), then every process marked with a run id."""
    for d in agents:
        pid = _state(d / "state.json").get("agent_pid")
        try:
            p = psutil.Process(pid)
            if "tunedeck.core.supervisor.agent" in " ".join(p.cmdline()):
                p.kill()
        except (psutil.Error, TypeError, ValueError):
            pass
    for rid in run_ids:
        _kill_marked(rid)


def _events(path: Path, kind: str) -> list[dict]:
    """A rank's events of one kind ("" for all), read while the rank may still be writing:
    a last line without its newline is not whole yet."""
    try:
        lines = path.read_text().split("\n")[:-1]
    except OSError:
        return []
    return [e for e in map(json.loads, filter(None, lines)) if kind in ("", e.get("kind"))]


def test_ssh_launch_trains_over_two_hosts_survives_a_dropped_link_and_stops_both(hosts, tmp_path):
    home = hosts.head_only / tmp_path.name  # node 1 cannot see the head's run folder
    spec = _spec(tmp_path / "spec.toml", hosts, steps=100000)
    out = _head_cli(hosts, home, "launch", str(spec), "--no-preflight")
    run_id, run_dir = out["run_id"], Path(out["run_dir"])
    node_dir = tmp_path / "node1-home" / "runs" / f"{run_id}.node1"
    try:
        _dry_run_and_exports_are_what_launch_wrote(hosts, home, spec, run_dir)
        # both nodes train: node 1's steps reach the head through the link
        rows = wait_for(
            lambda: (
                (r := _head_cli(hosts, home, "nodes", run_id))
                and all((x["step"] or 0) >= 3 for x in r)
                and r
            ),
            240,
            "steps on both nodes",
        )
        assert [r["node"] for r in rows] == [0, 1]
        assert rows[1]["host"] == "node1" and rows[1]["reach"] == "connected"
        assert rows[1]["status"] == "running" and rows[1]["ranks"] == [1]
        # the monitor shows both nodes (its watcher reads them in its worker thread)
        from tunedeck.core.views.watch import RunWatcher
        from tunedeck.tui.widgets.progress import progress_text

        shown = progress_text(RunWatcher(run_dir).poll(history=False), 160)
        assert "node 0" in shown and "node 1 [b]node1[/b] · running · [green]connected" in shown, (
            shown
        )
        # node 1 runs on the other host: its own run folder, its own network namespace
        node_state = _state(node_dir / "state.json")
        head_state = _state(run_dir / "state.json")
        assert node_state["status"] == "running"
        assert (
            _netns(node_state["torchrun_pid"])
            == _netns(hosts.sshd[1].pid)
            != _netns(head_state["torchrun_pid"])
        )
        assert not (node_dir / "events" / "rank0.jsonl").exists()  # rank 0 is the head's
        # the rendezvous was c10d across the hosts
        argv = json.loads((run_dir / "plan.json").read_text())["nodes"][1]["argv"]
        assert "c10d" in argv and f"{hosts.addrs[0]}:" in " ".join(argv)

        # an ssh-only outage (node 1's sshd gone, the head's ssh killed; the hosts' network
        # stays up) longer than cluster.node_silence_s: the ranks go on training, so the run
        # goes on; once ssh is back the link reconnects and back-fills from its offsets
        head_step = _head_cli(hosts, home, "nodes", run_id)[0]["step"] or 0
        _ssh_outage(hosts, head_state["agent_pid"])
        time.sleep(OUTAGE_S)
        assert _state(run_dir / "state.json")["status"] == "running"
        assert not [f for f in _findings(run_dir) if f["category"] == "node_lost"]
        during = _head_cli(hosts, home, "nodes", run_id)
        assert (during[0]["step"] or 0) > head_step + 3, during  # the collectives advanced
        assert during[1]["reach"] != "connected", during[1]
        hosts.restart_sshd(1)
        link = wait_for(
            lambda: (
                (d := _state(run_dir / "nodes" / "node1" / "link.json")).get("drops", 0) >= 1
                and d.get("connected")
                and d
            ),
            60,
            "the link to come back",
        )
        assert link["connects"] >= 2
        assert link["shared"] is False and link["bytes"] > 0  # streamed, not shared
        assert not (node_dir / "events" / "rank1.jsonl").is_symlink()
        wait_for(
            lambda: (_head_cli(hosts, home, "nodes", run_id)[1]["step"] or 0) > during[0]["step"],
            120,
            "node 1's steps of the outage, back-filled",
        )

        # the telemetry of node 1 reached the head too
        tel = [
            json.loads(x)
            for x in (run_dir / "nodes" / "node1" / "telemetry.jsonl").read_text().splitlines()
        ]
        assert tel and any(r.get("rank") == 1 for t in tel for r in t["procs"]["ranks"])

        # a stop asked while node 1 cannot be reached over ssh: the head stops, node 1's
        # ranks end when the head's go; ssh back within node_silence_s, the stop reaches it
        # late and both nodes end `stopped`, every record of node 1 re-synced
        _ssh_outage(hosts, _state(run_dir / "state.json")["agent_pid"])
        env = dict(os.environ, TUNEDECK_HOME=str(home), TUNEDECK_SSH_CONFIG=str(hosts.ssh_config))
        stop = subprocess.Popen(
            hosts.netns_argv(
                0, [sys.executable, "-m", "tunedeck.tui", "stop", run_id, "--wait", "--json"]
            ),
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        time.sleep(3)
        hosts.restart_sshd(1)
        done = json.loads(stop.communicate(timeout=200)[0])
        assert done["status"] == "stopped", done
        # its ranks ended before the stop reached it ("heard it late"), or it stopped itself
        print("node 1 after the stop:", _state(node_dir / "state.json").get("message"))
        wait_for(
            lambda: _state(run_dir / "nodes" / "node1" / "link.json").get("ended"),
            60,
            "node 1's last records",
        )
        assert _state(node_dir / "state.json")["status"] == "stopped"
        assert _state(run_dir / "nodes" / "node1" / "state.json")["status"] == "stopped"
        rows = _head_cli(hosts, home, "nodes", run_id)
        assert [r["status"] for r in rows] == ["stopped", "stopped"]
        for st in (_state(run_dir / "state.json"), _state(node_dir / "state.json")):
            assert st["exit_code"] not in (0, None), st  # stopped: never exit code 0
        from tunedeck.core.supervisor.procs import marked_processes

        wait_for(
            lambda: not marked_processes(run_id) and not marked_processes(f"{run_id}.node1"),
            30,
            "no process of either node left",
        )

        # no record lost: every file of node 1 is on the head, byte for byte
        compared = 0
        for p in node_dir.rglob("*"):
            rel = p.relative_to(node_dir).as_posix()
            if (
                not p.is_file()
                or rel.split("/")[0] not in ("logs", "events")
                or p.stat().st_size == 0
            ):
                continue
            head = run_dir / ("logs/agent-node1.log" if rel == "logs/agent.log" else rel)
            assert head.read_bytes() == p.read_bytes(), rel
            compared += 1
        assert compared >= 4  # agent, torchrun, rank log, events
        steps = [
            json.loads(x) for x in (run_dir / "events" / "rank1.jsonl").open() if '"step"' in x
        ]
        numbers = [e["step"] for e in steps if e.get("kind") == "step"]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    finally:
        _cleanup(run_id, f"{run_id}.node1")
        hosts.restart_sshd(1)


def test_a_node_that_never_joins_is_named_by_the_join_timeout(hosts, tmp_path):
    home = tmp_path / "head-home"
    spec = _spec(tmp_path / "spec.toml", hosts, steps=50, node1="ghost", join_s=15)
    t0 = time.monotonic()
    out, ended = _head_cli(
        hosts, home, "launch", str(spec), "--no-preflight", "--wait", timeout=200
    )
    run_id, run_dir = out["run_id"], Path(out["run_dir"])
    try:
        assert ended["status"] == "failed", ended
        found = [
            f
            for f in _findings(run_dir)
            if f["category"] == "rendezvous_unreachable" and f["node"] == 1
        ]
        assert found, _findings(run_dir)
        assert "node 1 (ghost)" in found[0]["summary"] and "15s" in found[0]["summary"]
        assert "ssh" in found[0]["summary"]  # why: ssh could not reach it
        st = _state(run_dir / "state.json")
        assert st["status"] == "failed"
        took = found[0]["t"] - st["started"]
        assert 14 <= took <= 25, took
        assert time.monotonic() - t0 < 90
    finally:
        _cleanup(run_id)


def test_a_node_killed_mid_run_stops_the_others_and_is_named(hosts, tmp_path):
    home = tmp_path / "head-home"
    spec = _spec(tmp_path / "spec.toml", hosts, steps=100000)
    out = _head_cli(hosts, home, "launch", str(spec), "--no-preflight")
    run_id, run_dir = out["run_id"], Path(out["run_dir"])
    try:
        wait_for(
            lambda: all((r["step"] or 0) >= 3 for r in _head_cli(hosts, home, "nodes", run_id)),
            240,
            "steps on both nodes",
        )
        node_state = _state(run_dir / "nodes" / "node1" / "state.json")
        # the node dies: its agent, torchrun and ranks, all at once
        killed_at = time.time()
        os.kill(node_state["agent_pid"], signal.SIGKILL)
        _kill_marked(f"{run_id}.node1")
        head = wait_for(
            lambda: (
                (s := _state(run_dir / "state.json")).get("status") in ("failed", "stopped") and s
            ),
            60,
            "the head to stop",
        )
        lost = [f for f in _findings(run_dir) if f["category"] == "node_lost"]
        assert lost and lost[0]["node"] == 1 and "node 1 (node1)" in lost[0]["summary"], _findings(
            run_dir
        )
        assert lost[0]["t"] - killed_at < 10
        print(
            f"node_lost {lost[0]['t'] - killed_at:.2f}s after the kill, head ended "
            f"{head['ended'] - killed_at:.2f}s after"
        )
        assert head["ended"] - killed_at < 40
        # the end names the node everywhere: stop.json, the status line, the node table
        assert (
            head["status"] == "failed"
            and "node 1 (node1) was lost mid-run" in head["message"]
            and "the rest of the run was stopped" in head["message"]
        ), head
        stop = _state(run_dir / "stop.json")
        assert stop["node"] == 1 and stop["by"].startswith("node 1 (node1) was lost"), stop
        status = _head_cli(hosts, home, "status", run_id)
        assert status["status"] == "failed" and "node 1 (node1)" in status["message"]
        rows = _head_cli(hosts, home, "nodes", run_id)
        assert rows[1]["findings"] >= 1 and rows[1]["status"] == "lost", rows[1]
        assert rows[1]["reach"] == "lost" and "node 1" in rows[1]["message"]
        # diagnose: the lost node is the root cause, the head's rank failures that followed
        # (its collectives broke, its attempt was stopped) are consequences (issue 31)
        found = _head_cli(hosts, home, "diagnose", run_id)
        roots = [f for f in found if f["root_cause"]]
        assert [(f["category"], f["severity"], f["node"]) for f in roots] == [
            ("node_lost", "error", 1)
        ], found
        assert found[0]["category"] == "node_lost", found
        others = [f for f in found if f["severity"] == "error" and f["category"] != "node_lost"]
        print("after the loss:", [(f["category"], f["node"], f["summary"][:80]) for f in others])
    finally:
        _cleanup(run_id, f"{run_id}.node1")


def test_preflight_asks_every_node_over_ssh(hosts, tmp_path):
    good = _head_cli(
        hosts, tmp_path / "h", "preflight", str(_spec(tmp_path / "good.toml", hosts, steps=10))
    )
    bad = _head_cli(
        hosts,
        tmp_path / "h",
        "preflight",
        str(_spec(tmp_path / "bad.toml", hosts, steps=10, node1="ghost")),
        "--set",
        "cluster.interface=eth9",
    )

    def check(out, id="net.nodes"):
        rows = out["checks"] if isinstance(out, dict) else out
        return next(c for c in rows if c["id"] == id)

    ok = check(good)
    assert ok["status"] == "pass", ok
    assert "node 1 (node1): ok" in ok["detail"]
    fail = check(bad)
    assert fail["status"] == "fail" and "node 1 (ghost): ssh exited 255" in fail["detail"]
    # the hostname resolves to 127.0.0.1 on both hosts: no interface set, the one that
    # routes to master_addr on each node is chosen (and each node was asked)
    iface = check(good, "net.interface")
    assert iface["status"] == "pass", iface
    assert f"GLOO_SOCKET_IFNAME={IFACE}, chosen" in iface["detail"]
    assert f"node 1 (node1): {IFACE}" in iface["detail"], iface
    # an interface this node lacks: fails, naming the one to set
    wrong = check(bad, "net.interface")
    assert wrong["status"] == "fail" and "no interface 'eth9' here" in wrong["detail"], wrong
    assert f'cluster.interface = "{IFACE}"' in wrong["fix"], wrong


def test_ranks_on_loopback_are_named_with_the_interface_to_set(hosts, tmp_path):
    """A spec that pins GLOO_SOCKET_IFNAME = "lo" (a one-machine recipe's habit): preflight
    fails naming the interface that routes to the master; launched anyway, node 1's rank
    dials node 0's 127.0.0.1 and is refused. The run fails, and both `tunedeck diagnose`
    and the monitor's findings (run.db) put one root cause first: the nodes, the address and
    the interface to set, not the rendezvous or the crash that follow."""
    home = tmp_path / "head-home"
    path = _spec(tmp_path / "spec.toml", hosts, steps=50)
    spec = tomllib.loads(path.read_text())
    spec["env"] = {"GLOO_SOCKET_IFNAME": "lo"}
    path.write_text(tomli_w.dumps(spec))
    pre = _head_cli(hosts, home, "preflight", str(path))
    check = next(c for c in pre["checks"] if c["id"] == "net.interface")
    assert check["status"] == "fail" and "lo is loopback (127.0.0.1)" in check["detail"], check
    assert f'cluster.interface = "{IFACE}"' in check["fix"], check
    t0 = time.monotonic()
    out, ended = _head_cli(
        hosts, home, "launch", str(path), "--no-preflight", "--wait", timeout=200
    )
    run_id, run_dir = out["run_id"], Path(out["run_dir"])
    try:
        assert ended["status"] == "failed", ended
        assert _state(run_dir / "state.json")["status"] == "failed"
        print(f"ranks on loopback: the run failed {time.monotonic() - t0:.1f}s after launch")
        net = _state(run_dir / "nodes" / "node1" / "state.json")["net"]
        assert net["ifname"] == "lo" and net["route_iface"] == IFACE, net
        assert net["master"] == hosts.addrs[0]
        said = _head_cli(hosts, home, "diagnose", run_id)
        roots = [f for f in said if f["root_cause"]]
        assert [f["category"] for f in roots] == ["loopback_address"], said
        assert said[0] == roots[0]  # first; node_lost and the timeouts are its consequences
        live = [f for f in _findings(run_dir) if f["category"] == "loopback_address"]
        assert live and live[0]["root_cause"], _findings(run_dir)  # what the monitor shows
        for f in (roots[0], live[0]):
            assert f["summary"].startswith("node 0 (") and ", node 1 (" in f["summary"], f
            assert "the ranks talked from 127.0.0.1" in f["summary"], f
            assert f'set cluster.interface = "{IFACE}"' in f["summary"], f
            assert f"routes to {hosts.addrs[0]} on node 0 and node 1" in f["fix"], f
            assert "drop env.GLOO_SOCKET_IFNAME = 'lo'" in f["fix"], f
            assert any("remote=[127.0.0.1]" in e for e in f["evidence"]), f["evidence"]
    finally:
        _cleanup(run_id, f"{run_id}.node1")


def test_with_restarts_a_node_whose_ranks_die_rejoins_and_the_run_resumes(hosts, tmp_path):
    """max_restarts > 0: node 1's ranks are killed mid-run; both nodes' agents start the next
    attempt (the head's hosts the rendezvous again, node 1's rejoins it), rank 0 resumes from
    the newest checkpoint (on the head: rank 0 reads and broadcasts it) and the step count
    continues from there. Then a stop while node 1 cannot be reached names it."""
    home = tmp_path / "head-home"
    spec = _spec(
        tmp_path / "spec.toml",
        hosts,
        steps=100000,
        save_steps=4,
        run="max_restarts = 2\nrestart_pause_s = 1",
    )
    out = _head_cli(hosts, home, "launch", str(spec), "--no-preflight")
    run_id, run_dir = out["run_id"], Path(out["run_dir"])
    node_dir = tmp_path / "node1-home" / "runs" / f"{run_id}.node1"
    try:
        wait_for(
            lambda: (
                list((run_dir / "output").glob("checkpoint-*"))
                and all((r["step"] or 0) >= 6 for r in _head_cli(hosts, home, "nodes", run_id))
            ),
            240,
            "a checkpoint and steps on both nodes",
        )
        # both hosts see the head's run folder at the same path: node 1 writes its records
        # into it and the link carries none of them
        link = _state(run_dir / "nodes" / "node1" / "link.json")
        assert link["shared"] is True and link["bytes"] == 0, link
        for rel in ("events/rank1.jsonl", "logs/node1", "logs/torchrun-node1.log"):
            assert (node_dir / rel).is_symlink() and (node_dir / rel).resolve() == (
                run_dir / rel
            ).resolve(), rel
        assert (run_dir / "logs" / "agent-node1.log").stat().st_size > 0
        assert _head_cli(hosts, home, "nodes", run_id)[1]["shared_fs"] is True
        ranks = _state(node_dir / "state.json")["worker_pids"]
        assert ranks
        killed_at = time.time()
        for pid in ranks:  # node 1's ranks die; its agent lives
            os.kill(pid, signal.SIGKILL)
        starts = wait_for(
            lambda: (s := _events(run_dir / "events" / "rank1.jsonl", "start"))[1:] and s,
            180,
            "node 1's ranks to start again",
        )
        again = starts[-1]
        assert again["restart"] == 1 and again["resumed_from"].startswith(
            str(run_dir / "output" / "checkpoint-")
        )
        resumed = again["start_step"]
        print(f"ranks killed: node 1's attempt 1 started {again['t'] - killed_at:.1f}s later")
        wait_for(
            lambda: (_head_cli(hosts, home, "nodes", run_id)[1]["step"] or 0) >= resumed + 3,
            120,
            "steps after the resume",
        )
        # the step count shows the resume: attempt 0 went past the checkpoint, attempt 1
        # continues right after it
        events = _events(run_dir / "events" / "rank1.jsonl", "")
        second = [i for i, e in enumerate(events) if e["kind"] == "start"][1]
        before = [e["step"] for e in events[:second] if e["kind"] == "step"]
        after = [e["step"] for e in events[second:] if e["kind"] == "step"]
        assert 4 <= resumed <= max(before) and resumed % 4 == 0, (resumed, before)
        assert after[:3] == [resumed + 1, resumed + 2, resumed + 3], after
        head, node = _state(run_dir / "state.json"), _state(node_dir / "state.json")
        assert head["status"] == node["status"] == "running"
        assert head["attempt"] == node["attempt"] == 1
        assert not [f for f in _findings(run_dir) if f["category"] == "node_lost"]

        # now the whole node dies (its agent too): the head asks it back over ssh, a new
        # agent there adopts its run and starts attempt 2 with the head, again resumed
        killed_at = time.time()
        os.kill(node["agent_pid"], signal.SIGKILL)
        _kill_marked(f"{run_id}.node1")
        third = wait_for(
            lambda: (s := _events(run_dir / "events" / "rank1.jsonl", "start"))[2:] and s[2],
            180,
            "node 1 to come back",
        )
        print(f"node killed: its attempt 2 started {third['t'] - killed_at:.1f}s later")
        assert (
            third["restart"] == 2
            and third["start_step"] >= resumed
            and third["resumed_from"].startswith(str(run_dir / "output" / "checkpoint-"))
        )
        wait_for(
            lambda: (_head_cli(hosts, home, "nodes", run_id)[1]["step"] or 0) > third["start_step"],
            120,
            "steps after node 1 came back",
        )
        lost = [f for f in _findings(run_dir) if f["category"] == "node_lost"]
        assert len(lost) == 1 and lost[0]["node"] == 1 and lost[0]["severity"] == "warning"
        assert (
            "node 1 (node1) was lost mid-run" in lost[0]["summary"]
            and "restarts from its newest checkpoint once the node is back" in lost[0]["summary"]
        )
        head, node = _state(run_dir / "state.json"), _state(node_dir / "state.json")
        assert head["status"] == node["status"] == "running"
        assert head["attempt"] == node["attempt"] == 2 and node["adopted"]

        # node 1 cannot be reached any more (its sshd is gone, the link dropped): a stop
        # ends the head and names node 1 as not reached
        hosts.sshd[1].kill()
        agent = psutil.Process(head["agent_pid"])
        for p in agent.children():
            if p.name() == "ssh":
                p.kill()
        done = _head_cli(hosts, home, "stop", run_id, "--wait", timeout=200)
        assert done["status"] == "stopped", done
        assert (
            "node 1 (node1) could not be reached to stop it: ssh exited with 255" in done["message"]
            and "Connection refused" in done["message"]
        ), done
        assert [
            f for f in _findings(run_dir) if f["category"] == "node_not_stopped" and f["node"] == 1
        ]
        row = _head_cli(hosts, home, "nodes", run_id)[1]
        assert row["reach"] == "unreached" and "Connection refused" in row["message"], row
    finally:
        _cleanup(run_id, f"{run_id}.node1", agents=(node_dir,))
        hosts.restart_sshd(1)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "apart"])
def test_a_script_on_two_hosts_restarts_where_the_head_decides(hosts, tmp_path, shared):
    """A user's HF Trainer script on both hosts; the rank on node 1 dies at step 7 of the first
    attempt, after checkpoint-4. The head decides where the restart continues (restart.json).
    Shared: node 1's agent reads the decision there, both ranks are told TUNEDECK_RESUME_FROM
    and the second attempt logs steps 5-8 only. Apart (node 1 cannot see the head's folder):
    both start from step 0 and say why, and the run still completes."""
    script = REPO / "tests" / "scripts" / "hf_trainer_script.py"
    data = REPO / "presets" / "data" / "demo_chat.jsonl"
    home = tmp_path / "head-home" if shared else hosts.head_only / tmp_path.name
    spec = tmp_path / "spec.toml"
    spec.write_text(f'''name = "two-hosts-script"
backend = "script"
[script]
path = "{script}"
args = ["--max_steps", "8", "--logging_steps", "1", "--save_steps", "4",
        "--crash_at_step", "7", "--data", "{data}"]
[data]
path = "{data}"
[cluster]
{_cluster(spec, hosts, node1_home=home if shared else None).strip()}
[run]
max_restarts = 1
restart_pause_s = 1
stop_grace_s = 20
''')
    out = _head_cli(hosts, home, "launch", str(spec), "--no-preflight")
    run_id, run_dir = out["run_id"], Path(out["run_dir"])
    # shared: one home for both hosts, node 1's folder beside the head's
    node_dir = (home if shared else tmp_path / "node1-home") / "runs" / f"{run_id}.node1"
    try:
        final = wait_for(
            lambda: (
                (s := _state(run_dir / "state.json")).get("status")
                in ("succeeded", "failed", "stopped")
                and s
            ),
            300,
            "the run to end",
        )
        head_log = (run_dir / "logs" / "agent.log").read_text()
        node_log = (run_dir / "logs" / "agent-node1.log").read_text()
        assert final["status"] == "succeeded", (final, head_log[-2000:], node_log[-2000:])
        assert [a["exit_code"] != 0 for a in final["attempts"]] == [True, False]
        decision = _state(run_dir / "restart.json")
        if shared:
            said = "from checkpoint-4 (TUNEDECK_RESUME_FROM for the script)"
            assert said in head_log and said in node_log, (head_log[-2000:], node_log[-2000:])
            assert decision["checkpoint"] == str(run_dir / "output" / "checkpoint-4"), decision
        else:
            assert "from step 0 (node 1 not on the head's filesystem" in head_log, head_log
            assert "from step 0 (this node is not on the head's filesystem)" in node_log
            assert decision["checkpoint"] is None, decision
        assert decision["attempt"] == 1
        recs = _head_cli(hosts, home, "metrics", run_id)
        assert [r["step"] for r in recs] == list(range(1, 9)), recs
        if not shared:  # the second attempt's steps 1-8 replaced the first's 1-6
            second = _state(run_dir / "state.json")["launches"][1]["t"]
            assert all(r["t"] > second for r in recs), recs
        assert _state(node_dir / "state.json")["attempt"] == 1
        if shared:  # node 1's folder is part of the run: listed, named and acted on as it
            assert [r["run_id"] for r in _head_cli(hosts, home, "ls")] == [run_id]
            for ref in ("two-hosts-script", f"{run_id}.node1"):
                assert _head_cli(hosts, home, "status", ref)["run_id"] == run_id, ref
    finally:
        _cleanup(run_id, f"{run_id}.node1", agents=(run_dir, node_dir))
