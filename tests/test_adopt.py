"""The agent can die: its run is not orphaned. Until a tunedeck command reads the run, its
status says the agent is lost and how many of its processes still run; the read starts a new
agent that adopts the run (its pids by identity, ingest from run.db's offsets, the monitors,
the graceful stop, the true final status). And a full disk pauses the agent's writes instead
of ending it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tunedeck.core.supervisor import procs
from tests.conftest import DEMO, cli, cli_json, pids_gone, stop_run, wait_for


pytestmark = pytest.mark.slow


def _status(home, run_id):
    return cli_json("status", run_id, home=home)


def _state(home, run_id) -> dict:
    return json.loads((home / "runs" / run_id / "state.json").read_text())


def _steps(home, run_id) -> list[int]:
    return [r["step"] for r in cli_json("metrics", run_id, home=home)]


def _stored_steps(home, run_id) -> int:
    """rank 0's steps in run.db itself (not the files' tails a reader adds)."""
    import sqlite3

    db = sqlite3.connect(f"file:{home / 'runs' / run_id / 'run.db'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM steps WHERE rank = 0").fetchone()[0]
    except sqlite3.OperationalError as e:
        # read between the agent creating the file and committing its schema: none yet
        if "no such table" in str(e):
            return 0
        raise
    finally:
        db.close()


def _nothing_left(run_id, pids, agent=None):
    """No process of the run is left once its end is recorded; the agent itself writes that
    end and then exits (closing run.db and the trackers), so it is given a few seconds."""
    assert not procs.marked_processes(run_id), "processes of the run survived"
    assert pids_gone(pids), [p for p in pids if not pids_gone([p])]
    if agent is not None:
        wait_for(lambda: pids_gone([agent]), 15, "the agent's exit after the run's end")


def _kill_agent(home, run_id) -> dict:
    st = _state(home, run_id)
    os.kill(st["agent_pid"], signal.SIGKILL)
    wait_for(lambda: pids_gone([st["agent_pid"]]), 10, "the agent's death")
    return st


def test_killed_agent_is_adopted_and_the_run_stops_gracefully(td_home, monkeypatch):
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
    wait_for(lambda: _status(td_home, run_id)["step"] >= 3, 120, "steps")
    before = _kill_agent(td_home, run_id)
    ranks = before["worker_pids"]
    assert len(ranks) == 2

    # unadopted (a viewer that starts nothing): not failed, lost, with its live processes
    monkeypatch.setenv("TUNEDECK_NO_ADOPT", "1")
    lost = _status(td_home, run_id)
    assert lost["status"] == "lost", lost
    assert lost["message"] == "agent lost, ranks still running (3 processes)", lost
    time.sleep(2)
    again = _status(td_home, run_id)
    assert again["status"] == "lost" and again["agent_pid"] == before["agent_pid"]
    stored_at_loss = _stored_steps(td_home, run_id)

    # any command that reads the run adopts it: here `tunedeck ls`
    monkeypatch.delenv("TUNEDECK_NO_ADOPT")
    ls = cli_json("ls", home=td_home)
    assert [r["status"] for r in ls if r["run_id"] == run_id] == ["lost"]
    adopted = wait_for(
        lambda: (
            (s := _status(td_home, run_id))["status"] == "running"
            and s["agent_pid"] != before["agent_pid"]
            and s
        ),
        30,
        "the adoption",
    )
    assert adopted["message"].startswith("adopted: agent"), adopted
    new_agent = adopted["agent_pid"]
    st = _state(td_home, run_id)
    assert procs.same_process(new_agent, st["pid_identity"][str(new_agent)])
    assert st["adopted"][-1]["lost_agent_pid"] == before["agent_pid"]
    # the same processes, found by identity, not restarted
    assert st["torchrun_pid"] == before["torchrun_pid"] and sorted(st["worker_pids"]) == sorted(
        ranks
    )
    # steps keep arriving, into run.db too (ingest resumed from its offsets: no gap)
    n0 = len(_steps(td_home, run_id))
    wait_for(
        lambda: _stored_steps(td_home, run_id) > max(stored_at_loss, n0) + 5,
        60,
        "the adopted run's steps in run.db",
    )
    recs = _steps(td_home, run_id)
    assert recs == list(range(1, len(recs) + 1)), "a step was lost or repeated"

    # the full graceful path: SIGTERM to the ranks, a checkpoint, a clean end; no SIGKILL
    t0 = time.monotonic()
    done = stop_run(td_home, run_id)
    assert done["status"] == "stopped" and time.monotonic() - t0 < 25, done
    assert done["exit_code"] == 143, done  # stopped: never 0
    run_dir = td_home / "runs" / run_id
    ends = [json.loads(x) for x in (run_dir / "events" / "rank0.jsonl").open()]
    end = [e for e in ends if e["kind"] == "end"][-1]
    assert end["reason"] == "stopped"
    assert (run_dir / "output" / f"checkpoint-{end['step']}").is_dir()
    log = (run_dir / "logs" / "agent.log").read_text()
    assert "SIGKILL to the whole run" not in log
    _nothing_left(run_id, [before["torchrun_pid"], *ranks], agent=new_agent)
    assert _steps(td_home, run_id)[-1] == end["step"]


def test_run_that_ended_unwatched_gets_its_true_status(td_home, monkeypatch):
    """The agent dies; the ranks finish alone. The first command that reads the run records
    what really happened (succeeded, every step in run.db), not "failed"."""
    steps = 60
    out = cli_json("launch", str(DEMO), "--set", f"train.max_steps={steps}", home=td_home)
    run_id = out["run_id"]
    monkeypatch.setenv("TUNEDECK_NO_ADOPT", "1")
    wait_for(lambda: _status(td_home, run_id)["step"] >= 3, 120, "steps")
    before = _kill_agent(td_home, run_id)
    wait_for(
        lambda: pids_gone([before["torchrun_pid"], *before["worker_pids"]]),
        180,
        "the ranks to finish on their own",
    )
    gone = _status(td_home, run_id)  # not failed: how it ended is not known yet
    assert gone["status"] == "lost" and "processes have ended" in gone["message"], gone
    monkeypatch.delenv("TUNEDECK_NO_ADOPT")
    cli("status", run_id, home=td_home)  # reading it adopts it
    # the adopter says it is reading how the run ended, then records the end it found
    final = wait_for(
        lambda: (
            (s := _status(td_home, run_id))["status"] in ("succeeded", "failed", "stopped") and s
        ),
        60,
        "the adopter to record the end",
    )
    assert final["status"] == "succeeded" and final["exit_code"] == 0, final
    assert "every rank recorded its end" in final["message"]
    assert _stored_steps(td_home, run_id) == steps
    assert _steps(td_home, run_id) == list(range(1, steps + 1))
    _nothing_left(run_id, [before["torchrun_pid"], *before["worker_pids"]])


# -- a full disk --------------------------------------------------------------------------------


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        check=True,
        capture_output=True,
    )


def _filler(path: Path) -> Path:
    """An empty file made before the run starts: CI once got ENOSPC from creating the filler
    itself on a disk with room (a tmpfs inode can fail to allocate), so filling only appends."""
    filler = path / "filler"
    filler.touch()
    return filler


def _fill(path: Path) -> None:
    """Append to the disk's filler until the file system says ENOSPC."""
    # unbuffered: a buffered file would raise ENOSPC again on close, flushing what is left
    with open(path / "filler", "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
        except OSError:
            pass


def _can_mount() -> str | None:
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    if shutil.which("mount") is None:
        return "no mount command"
    return None


@pytest.mark.skipif(_can_mount() is not None, reason=str(_can_mount()))
def test_full_disk_pauses_the_agent_and_the_run_completes(td_home, tmp_path, monkeypatch):
    """Real ENOSPC from two tiny tmpfs: the run directory's own files (state.json, spec,
    plan) on one, run.db (a link) on the other; the ranks' events, logs and checkpoints are
    linked to the ordinary disk, so only the agent's writes fail. Filling run.db's disk: the
    agent pauses ingest and telemetry and says so in state.json, the run goes on. Filling the
    run directory's too: state.json keeps its last content (the agent holds the rest in
    memory), still no crash. Space returns: run.db catches up from its offsets, the run
    completes with every step and its message says writes were paused."""
    from tunedeck.core.supervisor.launch import prepare_run, start_agent
    from tunedeck.core.spec import load_spec

    # ~12 s of training: step 1 needs the run going (about step 12 there, idle); steps 2
    # and 3 hold with the run ended too (its end waits for state.json to be writable)
    steps = 45
    monkeypatch.setenv("TUNEDECK_TEST_SLOW_RANK", "0:0.25")
    spec = load_spec(DEMO, [f"train.max_steps={steps}", "train.save_steps=0"])
    run_dir = prepare_run(spec, td_home / "runs")
    run_id = run_dir.name
    aside, dbfs = tmp_path / "aside", tmp_path / "dbfs"
    shutil.copytree(run_dir, aside)
    mounts: list[Path] = []
    try:
        _mount_tmpfs(dbfs, "16m")
        mounts.append(dbfs)
        _mount_tmpfs(run_dir, "1m")
        mounts.append(run_dir)
        for name in ("spec.toml", "plan.json", "launch.sh", "state.json"):
            shutil.copy2(aside / name, run_dir / name)
        for name in ("logs", "events", "output", "stacks"):
            (aside / name).mkdir(exist_ok=True)
            (run_dir / name).symlink_to(aside / name)
        (run_dir / "run.db").symlink_to(dbfs / "run.db")
        _filler(dbfs)
        _filler(run_dir)
        start_agent(run_dir)
        wait_for(lambda: _stored_steps(td_home, run_id) >= 3, 120, "steps in run.db")

        # 1. run.db's disk is full: the agent says why in state.json; the run goes on
        _fill(dbfs)
        said = wait_for(
            lambda: "disk full" in (m := _state(td_home, run_id)["message"]) and m,
            30,
            "the reason in state.json",
        )
        assert "run.db ingest and telemetry paused; the run goes on" in said, said
        held = _stored_steps(td_home, run_id)
        ev = aside / "events" / "rank0.jsonl"
        size = ev.stat().st_size
        wait_for(lambda: ev.stat().st_size > size + 1500, 60, "the ranks to go on")
        assert _stored_steps(td_home, run_id) == held
        st = _state(td_home, run_id)
        assert st["status"] == "running" and psutil.pid_exists(st["agent_pid"])

        # 2. the run directory's disk fills, run.db's empties: run.db catches up from its
        # offsets, but state.json cannot be written (its content stays as it was, the rest
        # is kept in memory); no crash
        _fill(run_dir)
        (dbfs / "filler").unlink()
        wait_for(lambda: _stored_steps(td_home, run_id) > held + 5, 60, "run.db to catch up")
        time.sleep(IO_RETRY)
        frozen = _state(td_home, run_id)
        assert frozen["progress"]["step"] < _stored_steps(td_home, run_id) - 3, frozen
        assert (
            psutil.pid_exists(st["agent_pid"])
            and psutil.Process(st["agent_pid"]).status() != "zombie"
        ), "the agent died"
        log = (aside / "logs" / "agent.log").read_text()
        assert "state.json paused until space returns" in log, log[-3000:]

        # 3. space returns: state.json catches up, the run completes with every step
        (run_dir / "filler").unlink()
        resumed = wait_for(
            lambda: "disk full" not in (s := _state(td_home, run_id))["message"] and s,
            30,
            "the pause to end",
        )
        assert resumed["status"] in ("running", "succeeded"), resumed
        final = wait_for(
            lambda: (
                (s := _state(td_home, run_id))["status"] in ("succeeded", "failed", "stopped") and s
            ),
            180,
            "the end",
        )
        assert final["status"] == "succeeded", final
        assert "paused" in final["message"] and "full disk" in final["message"], final
        assert {p["what"] for p in final["io_pauses"]} == {"run.db", "state.json"}
        assert _stored_steps(td_home, run_id) == steps
        assert _steps(td_home, run_id) == list(range(1, steps + 1))
    finally:
        for m in (dbfs, run_dir):
            f = m / "filler"
            if f.exists():
                f.unlink()
        from tunedeck.core.supervisor.control import stop
        from tunedeck.core.views.registry import read_run

        info = read_run(run_dir)
        if info is not None and info.needs_stop and info.state.get("agent_pid"):
            stop(info, hard=True, timeout_s=30)
        wait_for(lambda: not procs.marked_processes(run_id), 30, "the run's processes to end")
        for m in reversed(mounts):
            subprocess.run(["umount", "-l", str(m)], capture_output=True)


IO_RETRY = 2.5
