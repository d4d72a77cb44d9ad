"""A stop accounts for every process a run started and says what it had to do; one bad value
in a rank's file never makes a live run unreadable or unstoppable; a preparation that blocks
never makes a run unstoppable; run.db deleted under the agent comes back whole; a frozen agent
shows as stale. Each runs the real CLI, agent, torchrun and ranks on CPU."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import psutil
import pytest

from conftest import DEMO, REPO, agent_gone, cli, cli_json, stop_run, wait_for
from tunedeck.core.supervisor import procs

pytestmark = pytest.mark.slow

LONG = ("--set", "train.max_steps=100000")


def _state(home: Path, run_id: str) -> dict:
    return json.loads((home / "runs" / run_id / "state.json").read_text())


def _strict(text: str) -> dict:
    def refuse(name):
        raise AssertionError(f"state.json holds {name}: not strict JSON")

    return json.loads(text, parse_constant=refuse)


def _launch_long(home: Path, *more: str) -> str:
    run_id = cli_json("launch", str(DEMO), *LONG, *more, home=home)["run_id"]
    wait_for(lambda: cli_json("status", run_id, home=home)["step"] >= 1, 180, "a first step")
    return run_id


# -- 2: one bad value -----------------------------------------------------------------------

BAD_LINES = [
    '{"kind": "step", "rank": 0, "step": 900000, "loss": Infinity, "lr": NaN, "t": 1.0}',
    '{"kind": "step", "rank": 0, "step": 900001, "loss": "high", "lr": [1], "t": "now"}',
    '{"kind": "step", "rank": 0, "step": "900002", "loss": 1.0, "t": 1.0}',
    '{"kind": "step", "rank": 0, "step": 1e400, "loss": 1.0, "t": 1.0}',
    '{"kind": "step", "rank": 0, "step": 99999999999999999999999, "loss": 1.0}',
]


def test_bad_values_in_a_rank_file_never_make_the_run_unstoppable(td_home):
    run_id = _launch_long(td_home)
    run_dir = td_home / "runs" / run_id
    events = run_dir / "events" / "rank0.jsonl"
    # stop the trainer's own lines from overtaking ours: freeze rank 0 while we write
    rank0 = _state(td_home, run_id)["rank_pids"]["0"]
    os.kill(rank0, signal.SIGSTOP)
    try:
        with open(events, "a") as f:
            f.write("\n".join(BAD_LINES) + "\n")
        seen = wait_for(
            lambda: (
                (s := _strict((run_dir / "state.json").read_text()))["progress"].get("step")
                == 900001
                and s
            ),
            30,
            "the agent's ingest",
        )
        # the usable step is taken, its bad values are dropped, nothing else is copied
        assert seen["progress"]["loss"] is None and seen["progress"]["t"] is None, seen
        assert seen["progress"]["lr"] is None
        status = cli_json("status", run_id, home=td_home)
        assert status["status"] == "running", status
    finally:
        os.kill(rank0, signal.SIGCONT)
    done = stop_run(td_home, run_id)
    assert done["status"] == "stopped", done
    assert not procs.marked_processes(run_id)


# -- 3 and 4: every process, the right words, the real exit code ------------------------

ESCAPER = r"""
import os, signal, subprocess, sys, time
rank = int(os.environ["RANK"])
clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
# a child that leaves the rank's session with a cleaned environment, and one that stays in
# the rank's tree without the run's marker
subprocess.Popen(["setsid", "sleep", "600"], env=clean, stdin=subprocess.DEVNULL)
subprocess.Popen(["sleep", "601"], env=clean, stdin=subprocess.DEVNULL)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
step = 0
while True:
    step += 1
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    time.sleep(0.5)
"""


def _sleepers(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if (p.info["cmdline"] or [])[-2:] == ["sleep", tag]:
            out.append(p)
    return out


def test_children_that_leave_a_rank_do_not_survive_a_graceful_stop(td_home, tmp_path):
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER)
    spec = tmp_path / "escaper.toml"
    spec.write_text(
        f'name = "escaper"\nbackend = "script"\n[script]\npath = "{script}"\n'
        f'[data]\npath = "{REPO / "presets/data/demo_chat.jsonl"}"\n'
        f'[cluster]\ndevice = "cpu"\ncpu_procs = 2\n[run]\nstop_grace_s = 20\n'
    )
    run_id = cli_json("launch", str(spec), home=td_home)["run_id"]
    try:
        wait_for(
            lambda: len(_sleepers("600")) == 2 and len(_sleepers("601")) == 2,
            120,
            "each rank's two children",
        )
        done = stop_run(td_home, run_id)
        assert done["status"] == "stopped", done
        assert done["message"].startswith("stopped (graceful)"), done
        assert not _sleepers("600") and not _sleepers("601"), "children outlived the stop"
        st = _state(td_home, run_id)
        # torchrun ended cleanly; the run, stopped, records 143 (never 0: records.run_exit_code)
        assert st["survivors"] == [] and st["attempts"][-1]["exit_code"] == 0, st
        assert st["exit_code"] == 143, st
    finally:
        for p in _sleepers("600") + _sleepers("601"):
            p.kill()


def test_a_frozen_rank_is_forced_after_the_grace_and_the_run_says_so(td_home):
    run_id = _launch_long(td_home, "--set", "run.stop_grace_s=3")
    rank1 = _state(td_home, run_id)["rank_pids"]["1"]
    os.kill(rank1, signal.SIGSTOP)
    done = stop_run(td_home, run_id)
    assert done["status"] == "stopped", done
    assert done["message"].startswith("stopped (forced after grace)"), done
    st = _state(td_home, run_id)
    assert st["exit_code"] is not None and st["exit_code"] != 0, st
    assert rank1 in st["forced_stop"]["pids"], st
    assert not procs.marked_processes(run_id)


def test_a_hard_stop_records_the_signal_that_ended_torchrun(td_home):
    run_id = _launch_long(td_home)
    done = stop_run(td_home, run_id, "--hard")
    assert done["status"] == "stopped", done
    st = _state(td_home, run_id)
    assert st["exit_code"] == -signal.SIGKILL, st
    assert st["attempts"][-1]["exit_code"] == -signal.SIGKILL, st
    assert not procs.marked_processes(run_id)


# -- 5: a stop while the agent prepares ------------------------------------------------------


def test_a_stop_reaches_a_run_whose_preparation_blocks(td_home, tmp_path):
    """Another run building the same demo model on a slow disk holds its lock: this run's
    agent waits in preparation, and a hard stop still ends it at once."""
    from tunedeck.core.demo import tiny_model_dir

    data = tmp_path / "data.jsonl"
    shutil.copy(REPO / "presets" / "data" / "demo_chat.jsonl", data)
    with open(data, "a") as f:
        f.write(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": str(time.time())},
                        {"role": "assistant", "content": "ok"},
                    ]
                }
            )
            + "\n"
        )
    model = tiny_model_dir(data)
    model.parent.mkdir(parents=True, exist_ok=True)
    with open(model.parent / f".{model.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run_id = cli_json(
            "launch", str(DEMO), "--no-preflight", "--set", f'data.path="{data}"', home=td_home
        )["run_id"]
        wait_for(lambda: "building" in _state(td_home, run_id)["message"], 30, "preparation")
        t0 = time.monotonic()
        done = stop_run(td_home, run_id, "--hard")
        assert time.monotonic() - t0 < 20
        assert done["status"] == "stopped", done
        assert done["message"].startswith("stopped before start (preparation had not finished"), (
            done
        )
        agent_gone(td_home / "runs" / run_id, timeout=10)


# -- 7: run.db deleted or replaced mid-run ----------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_run_db_deleted_mid_run_comes_back_whole(td_home, how):
    run_id = _launch_long(td_home)
    run_dir = td_home / "runs" / run_id
    db = run_dir / "run.db"
    wait_for(lambda: cli_json("status", run_id, home=td_home)["step"] >= 3, 120, "3 steps")
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        before = (
            con.execute("SELECT count(*) FROM telemetry").fetchone()[0]
            if con.execute("SELECT name FROM sqlite_master WHERE name='telemetry'").fetchone()
            else 0
        )
        findings_before = con.execute("SELECT count(*) FROM findings").fetchone()[0]
    for side in ("", "-wal", "-shm"):
        Path(f"{db}{side}").unlink(missing_ok=True)
    if how == "replaced":
        sqlite3.connect(db).close()  # an empty database in its place
    wait_for(lambda: _state(td_home, run_id).get("db_restored"), 20, "the agent to notice")
    note = _state(td_home, run_id)["db_restored"][-1]
    assert note["why"] == how, note
    if how == "replaced":
        assert (run_dir / note["kept"]).exists(), note
    step_now = cli_json("status", run_id, home=td_home)["step"]
    wait_for(
        lambda: cli_json("status", run_id, home=td_home)["step"] >= step_now + 2, 120, "more steps"
    )
    done = stop_run(td_home, run_id)
    assert done["status"] == "stopped", done
    steps = [r["step"] for r in cli_json("metrics", run_id, home=td_home)]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] >= step_now + 2, steps
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        if before:
            assert con.execute("SELECT count(*) FROM telemetry").fetchone()[0] >= before
        assert con.execute("SELECT count(*) FROM findings").fetchone()[0] >= findings_before
    out = cli("doctor", run_id, home=td_home, check=False)
    assert "run.db" not in out.stdout.split("BAD")[-1] or "BAD" not in out.stdout, out.stdout


# -- a frozen agent ---------------------------------------------------------------------------


def test_a_frozen_agent_shows_as_stale_with_how_long(td_home, monkeypatch):
    # a 1 s beat (the agent and the CLI read it): stale after 3 s, not the default 15 s
    monkeypatch.setenv("TUNEDECK_BEAT_S", "1")
    STALE_AFTER_S = 3 * 1.0

    run_id = _launch_long(td_home)
    agent = _state(td_home, run_id)["agent_pid"]
    os.kill(agent, signal.SIGSTOP)
    try:
        time.sleep(STALE_AFTER_S + 6)
        env_ls = cli("ls", home=td_home)
        line = next(x for x in env_ls.stdout.splitlines() if x.startswith(run_id))
        assert "stale" in line, line
        status = cli_json("status", run_id, home=td_home)
        assert status["stale_s"] > STALE_AFTER_S, status
    finally:
        os.kill(agent, signal.SIGCONT)
    wait_for(
        lambda: cli_json("status", run_id, home=td_home).get("stale_s") is None,
        20,
        "the beat to come back",
    )
    assert stop_run(td_home, run_id)["status"] == "stopped"
