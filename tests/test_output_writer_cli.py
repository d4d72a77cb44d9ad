"""One live writer per output folder, through the real command line and real demo runs on CPU:
two `tunedeck resume` of one run started at the same moment launch one run (the other names
it), or both with --share-output (recorded in their state.json); a launch into a live run's
output folder, or a folder inside it, is refused; a clone of a running run is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEMO, REPO, cli, cli_json, stop_run, wait_for
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import newest_checkpoint
from tunedeck.core.store.state import pid_alive

pytestmark = pytest.mark.slow

LONG = (
    "--set",
    'cluster.device="cpu"',
    "--set",
    "train.max_steps=100000",
    "--set",
    "train.save_steps=3",
    "--set",
    "run.stop_grace_s=60",
)


def launch_long(home: Path, *more: str) -> str:
    out = cli("launch", str(DEMO), *LONG, *more, "--no-preflight", "--json", home=home)
    return json.loads(out.stdout.splitlines()[0])["run_id"]


def state(home: Path, run_id: str) -> dict:
    return RunDir(home / "runs" / run_id).read_state() or {}


def ended(home: Path, run_id: str) -> None:
    """Stopped, and its agent gone too (it records the end, then exits)."""
    stop_run(home, run_id)
    wait_for(lambda: not pid_alive(state(home, run_id).get("agent_pid")), 60, "the agent's end")


def at_once(home: Path, *argvs: list[str]) -> list[subprocess.CompletedProcess]:
    """The commands started together, as two terminals would; their results."""
    env = dict(os.environ, TUNEDECK_HOME=str(home))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tunedeck.tui", *argv],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    done = []
    for p, argv in zip(procs, argvs):
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(argv, p.returncode, out, err))
    return done


def launched(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[0])["run_id"]


def test_two_resumes_at_once_launch_one_run_unless_told_to_share(td_home):
    first = launch_long(td_home)
    out = td_home / "runs" / first / "output"
    wait_for(lambda: newest_checkpoint(out), 300, "a checkpoint")
    ended(td_home, first)
    assert state(td_home, first)["status"] == "stopped"
    runs = {r["run_id"] for r in cli_json("ls", home=td_home)}

    resume = ["resume", first, "--no-preflight", "--json"]
    a, b = at_once(td_home, resume, resume)
    assert sorted([a.returncode, b.returncode]) == [0, 1], (a.stderr, b.stderr)
    won, lost = (a, b) if a.returncode == 0 else (b, a)
    winner = launched(won)
    # the loser names the live run (id and name) and the folder, and how to share anyway
    assert f"live run {winner} (demo, " in lost.stderr, lost.stderr
    assert str(out.resolve()) in lost.stderr and "--share-output" in lost.stderr
    assert lost.stdout == "" and "Traceback" not in lost.stderr
    assert {r["run_id"] for r in cli_json("ls", home=td_home)} == runs | {winner}
    assert state(td_home, winner).get("output_shared_with") is None
    ended(td_home, winner)

    # both asked to share: both launch, and each run's state.json records it (the one that
    # took the lock second names the first)
    shared = resume + ["--share-output"]
    c, d = at_once(td_home, shared, shared)
    one, two = launched(c), launched(d)
    with_ = {
        one: state(td_home, one)["output_shared_with"],
        two: state(td_home, two)["output_shared_with"],
    }
    assert sorted(with_.values()) == [[], [one]] or sorted(with_.values()) == [[], [two]], with_
    later = one if with_[one] else two
    assert "shares its output folder" in (c if later == one else d).stderr
    for run_id in (one, two):
        stop_run(td_home, run_id, "--hard")


def test_a_live_runs_folder_is_refused_and_a_live_run_is_not_cloned(td_home, tmp_path):
    live = launch_long(td_home)
    wait_for(
        lambda: cli_json("status", live, home=td_home)["status"] == "running",
        120,
        "the run to start",
    )
    out = td_home / "runs" / live / "output"
    runs = len(cli_json("ls", home=td_home))

    for folder in (out, out / "sub"):  # the same folder, or one inside it
        p = cli(
            "launch",
            str(DEMO),
            "--set",
            'cluster.device="cpu"',
            "--set",
            f'run.output_dir="{folder}"',
            "--no-preflight",
            home=td_home,
            check=False,
        )
        assert p.returncode == 1, p.stderr
        assert f"live run {live} (demo, running)" in p.stderr and str(out) in p.stderr
        assert "--share-output" in p.stderr and "Traceback" not in p.stderr

    p = cli("clone", live, "--no-preflight", home=td_home, check=False)
    assert p.returncode == 2 and f"cannot clone {live}" in p.stderr, p.stderr
    assert "running: a clone copies an ended run's spec" in p.stderr
    assert "ended run's spec" in cli("clone", "--help", home=td_home).stdout
    assert len(cli_json("ls", home=td_home)) == runs  # nothing launched

    p = cli(
        "launch",
        str(DEMO),
        "--set",
        'cluster.device="cpu"',
        "--set",
        f'run.output_dir="{out}"',
        "--no-preflight",
        "--share-output",
        "--json",
        home=td_home,
        check=False,
    )
    sharer = launched(p)
    assert state(td_home, sharer)["output_shared_with"] == [live]
    assert f"with live run(s) {live} (--share-output)" in p.stderr
    stop_run(td_home, sharer, "--hard")
    stop_run(td_home, live, "--hard")
