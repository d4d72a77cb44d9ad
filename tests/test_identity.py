"""A stop never reaches a process that is not the run's: pids are recorded with their identity
(start time + boot id), process groups are signalled only through a leader that is ours, and
the TUNEDECK_RUN_ID sweep kills only processes carrying one of the run's launch ids. Unrelated
`sleep`s in their own sessions stand in for whatever reuses a recorded pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tunedeck.core.backends.plan import LaunchPlan, NodeCommand
from tunedeck.core.supervisor import procs
from tunedeck.core.supervisor.launch import prepare_run
from tunedeck.core.rundir import RunDir
from tests.conftest import DEMO, cli_json, stop_run, wait_for


def _sleeper(env: dict[str, str] | None = None) -> subprocess.Popen:
    """An unrelated process in its own session (its pid is its process group)."""
    return subprocess.Popen(
        ["sleep", "300"], start_new_session=True, env={**os.environ, **(env or {})}
    )


BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _ident(pid: int) -> dict:
    """The identity state.json records (read here from /proc, independently of procs.py)."""
    with open(f"/proc/{pid}/stat") as f:
        return {"start": int(f.read().rsplit(")", 1)[1].split()[19]), "boot": BOOT_ID}


def _alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def _end(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(10)


def test_identity_is_start_ticks_and_boot_id():
    me = os.getpid()
    ident = procs.identity(me)
    assert ident == _ident(me)
    assert procs.same_process(me, ident)
    assert not procs.same_process(me, {**ident, "start": ident["start"] + 1})
    assert not procs.same_process(me, {**ident, "boot": "another-boot"})
    assert procs.identity(2**22 + 7) is None  # no such pid
    assert procs.BOOT_ID_PATH == "/proc/sys/kernel/random/boot_id"


def _fake_orphan(home: Path, victim: int, *, identities: str) -> str:
    """A prepared demo run whose state.json says it is running, with a dead agent, and names
    `victim` as its torchrun, rank and process group: what pid reuse leaves behind."""
    from tunedeck.core.spec import load_spec

    spec = load_spec(DEMO, ['cluster.device="cpu"', "train.max_steps=5"])
    run = RunDir(prepare_run(spec, home / "runs"))
    st = run.read_state()
    dead = subprocess.Popen(["true"])
    dead.wait()
    real = _ident(victim)
    other = {**real, "start": real["start"] - 50}  # the pid's earlier owner: not this sleep
    st.update(
        status="running",
        agent_pid=dead.pid,
        agent_create_time=time.time() - 60,
        torchrun_pid=victim,
        worker_pids=[victim],
        rank_pids={"0": victim},
        pgids=[victim],
    )
    if identities == "recorded":
        # written by this version: every pid with its identity, the agent's too (a reader
        # adopts such a run; the adopter must not touch the sleep either)
        st["pid_identity"] = {str(victim): other, str(dead.pid): {"start": 1, "boot": BOOT_ID}}
        st["launches"] = [
            {
                "id": "feedbeef",
                "attempt": 0,
                "boot": BOOT_ID,
                "after": 0,
                "t": time.time() - 60,
                "torchrun_pid": victim,
            }
        ]
    else:
        # written before identities (the state.json): plain numbers only
        st.pop("pid_identity", None)
        st.pop("launches", None)
    run.write_state(st)
    return run.run_id


@pytest.mark.parametrize("identities", ["recorded", "none"])
@pytest.mark.parametrize("hard", [False, True], ids=["graceful", "hard"])
def test_stop_spares_a_process_that_reuses_the_recorded_pids(td_home, identities, hard):
    victim = _sleeper()
    try:
        run_id = _fake_orphan(td_home, victim.pid, identities=identities)
        out = stop_run(td_home, run_id, *(["--hard"] if hard else []))
        assert out["status"] in ("stopped", "failed"), out
        time.sleep(0.3)
        assert _alive(victim), "stop killed an unrelated process that reused the run's pids"
        os.killpg(victim.pid, 0)  # its process group is intact too
        # reading the run never counts it as the run's
        st = cli_json("status", run_id, home=td_home)
        assert st["status"] in ("stopped", "failed"), st
    finally:
        _end(victim)


def test_status_does_not_count_a_reused_pid_as_a_live_rank(td_home, monkeypatch):
    monkeypatch.setenv("TUNEDECK_NO_ADOPT", "1")
    victim = _sleeper()
    try:
        run_id = _fake_orphan(td_home, victim.pid, identities="recorded")
        st = cli_json("status", run_id, home=td_home)
        assert st["status"] == "lost" and "processes have ended" in st["message"], st
        assert _alive(victim)
    finally:
        _end(victim)


def test_stop_spares_a_process_that_only_claims_the_run_id(td_home):
    """A spec (or a shell) that set TUNEDECK_RUN_ID=<this run> does not make its processes
    this run's: only a launch id the agent recorded does."""
    out = cli_json(
        "launch",
        str(DEMO),
        "--set",
        "train.max_steps=100000",
        "--set",
        "train.save_steps=0",
        home=td_home,
    )
    run_id = out["run_id"]
    impostor = _sleeper(
        {"TUNEDECK_RUN_ID": run_id, "TUNEDECK_RUN_DIR": str(td_home / "runs" / run_id)}
    )
    try:
        wait_for(lambda: cli_json("status", run_id, home=td_home)["step"] >= 2, 120, "steps")
        before = cli_json("status", run_id, home=td_home)
        done = stop_run(td_home, run_id, "--hard")
        assert done["status"] == "stopped"
        time.sleep(0.3)
        assert _alive(impostor), "the run-id sweep killed a process that is not the run's"
        # every real process of the run is gone
        left = [p.pid for p in procs.marked_processes(run_id) if p.pid != impostor.pid]
        assert not left, left
        for pid in [before["torchrun_pid"], *before["worker_pids"]]:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    finally:
        _end(impostor)


def test_the_runs_own_variables_win_over_the_spec_and_the_environment(td_home, monkeypatch):
    from tunedeck.core.backends import plan_run
    from tunedeck.core.supervisor.agent import Agent
    from tunedeck.core.spec import load_spec

    spec = load_spec(DEMO, ['cluster.device="cpu"'])
    # set behind the spec's back (core/spec.py refuses env.TUNEDECK_* keys in files and --set)
    spec.env = {
        "TUNEDECK_RUN_ID": "someone-else",
        "TUNEDECK_RUN_DIR": "/elsewhere",
        "TUNEDECK_LAUNCH_ID": "forged",
        "KEEP": "1",
    }
    run = RunDir(td_home / "runs" / "20990101-000000-demo-abcd")
    _, plan = plan_run(spec, run)
    env = plan.nodes[0].env
    assert env["TUNEDECK_RUN_ID"] == run.run_id and env["TUNEDECK_RUN_DIR"] == str(run.path)
    assert env["KEEP"] == "1"
    # the agent's launch command: the run's values over the plan's, the secrets file's and
    # its own environment's
    spec2 = load_spec(DEMO, ['cluster.device="cpu"'])
    run_dir = prepare_run(spec2, td_home / "runs")
    monkeypatch.setenv("TUNEDECK_RUN_ID", "inherited-other-run")
    monkeypatch.setenv("TUNEDECK_ATTEMPT", "9")
    agent = Agent(run_dir)
    node = dict(agent.plan["nodes"][0])
    node["env"] = {**node["env"], "TUNEDECK_RUN_ID": "forged", "KEEP": "1"}
    argv, env = agent.launch_command(node, 0, "abc123")
    assert argv == agent.plan["nodes"][0]["argv"]
    assert env["TUNEDECK_RUN_ID"] == run_dir.name
    assert env["TUNEDECK_RUN_DIR"] == str(run_dir)
    assert env["TUNEDECK_LAUNCH_ID"] == "abc123" and env["TUNEDECK_ATTEMPT"] == "0"
    assert env["KEEP"] == "1"


def test_launch_sh_refuses_to_append_to_an_existing_run(td_home, tmp_path):
    from tunedeck.core.spec import load_spec

    # the launch.sh a launch writes refuses to run again into its own run directory
    run_dir = prepare_run(load_spec(DEMO, ['cluster.device="cpu"']), td_home / "runs")
    events_before = sorted(p.name for p in (run_dir / "events").iterdir())
    proc = subprocess.run(
        ["bash", str(run_dir / "launch.sh")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3, proc.stderr
    assert "already holds run" in proc.stderr and "TUNEDECK_REPLAY_INTO_RUN=1" in proc.stderr
    assert sorted(p.name for p in (run_dir / "events").iterdir()) == events_before
    assert not list((run_dir / "logs").glob("node*"))
    # the same guard, with a harmless command: refused, then run when the user says so
    fake = tmp_path / "run"
    fake.mkdir()
    (fake / "state.json").write_text("{}")
    plan = LaunchPlan(
        "r-1",
        "builtin",
        1,
        1,
        [NodeCommand(0, "localhost", ["echo", "ran"], {"TUNEDECK_RUN_DIR": str(fake)}, str(fake))],
    )
    script = tmp_path / "launch.sh"
    script.write_text(plan.to_shell())
    refused = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert refused.returncode == 3 and "ran" not in refused.stdout
    allowed = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "TUNEDECK_REPLAY_INTO_RUN": "1"},
    )
    assert allowed.returncode == 0 and allowed.stdout.strip() == "ran", allowed.stderr
    # no state.json: a directory no launch wrote (an export on another machine) runs as is
    (fake / "state.json").unlink()
    assert (
        subprocess.run(["bash", str(script)], capture_output=True, text=True).stdout.strip()
        == "ran"
    )
    # a preview (its run directory does not exist yet) shows no guard
    plan.nodes[0].env["TUNEDECK_RUN_DIR"] = str(tmp_path / "<run-id>")
    assert "already holds" not in plan.to_shell()


def test_a_stop_signals_only_identified_processes_in_the_agent(td_home):
    """The graceful path's SIGTERM goes through the identity check too: a recorded rank pid
    now held by an unrelated process gets nothing."""
    victim = _sleeper()
    try:
        st = {
            "run_id": "x",
            "pid_identity": {
                str(victim.pid): {
                    **procs.identity(victim.pid),
                    "start": procs.identity(victim.pid)["start"] + 3,
                }
            },
        }
        assert procs.signal_ours(st, [victim.pid], signal.SIGTERM) == []
        found, groups = procs.run_processes(
            {**st, "torchrun_pid": victim.pid, "pgids": [victim.pid]}
        )
        assert victim.pid not in found and victim.pid not in groups
        time.sleep(0.2)
        assert _alive(victim)
        st["pid_identity"][str(victim.pid)] = procs.identity(victim.pid)
        assert procs.signal_ours(st, [victim.pid], signal.SIGTERM) == [victim.pid]
        victim.wait(10)
    finally:
        _end(victim)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
