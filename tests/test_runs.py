"""End to end on CPU: the real CLI, the detached agent, torchrun with 2 gloo ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tunedeck.core.supervisor.procs import marked_processes
from tests.conftest import DEMO, REPO, cli, cli_json, wait_for

pytestmark = pytest.mark.slow


def _status(home, run_id):
    return cli_json("status", run_id, home=home)


def test_demo_preset_trains_with_two_ranks(finished_demo):
    home, run_id, proc = finished_demo
    assert proc.returncode == 0, proc.stderr
    st = _status(home, run_id)
    assert st["status"] == "succeeded" and st["exit_code"] == 0
    assert st["step"] == st["max_steps"]
    recs = cli_json("metrics", run_id, home=home)
    assert [r["step"] for r in recs] == list(range(1, st["max_steps"] + 1))
    assert all({"step", "loss", "learning_rate"} <= r.keys() for r in recs)
    first = sum(r["loss"] for r in recs[:5]) / 5
    last = sum(r["loss"] for r in recs[-5:]) / 5
    assert last < first, (first, last)
    run_dir = home / "runs" / run_id
    for rank in (0, 1):
        events = [json.loads(x) for x in (run_dir / "events" / f"rank{rank}.jsonl").open()]
        steps = [e for e in events if e["kind"] == "step"]
        assert len(steps) == st["max_steps"], f"rank {rank}"
        assert all(e["rank"] == rank for e in events)
    # the run directory contract
    for name in ("spec.toml", "plan.json", "launch.sh", "state.json", "run.db", "logs/agent.log"):
        assert (run_dir / name).exists(), name
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["world_size"] == 2 and "torch.distributed.run" in plan["nodes"][0]["argv"]


def test_logs_show_each_rank(finished_demo):
    home, run_id, _ = finished_demo
    out0 = cli("logs", run_id, "--rank", "0", home=home).stdout
    out1 = cli("logs", run_id, "--rank", "1", "-n", "5", home=home).stdout
    assert "step" in out0 and out0 != out1
    assert len(out1.splitlines()) <= 5


def test_run_survives_sigkill_of_launcher_and_tui(td_home, tmp_path, tmux):
    steps = 120
    # launch --wait in a child, kill it once the run is going
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tunedeck.tui",
            "launch",
            str(DEMO),
            "--wait",
            "--json",
            "--set",
            f"train.max_steps={steps}",
        ],
        cwd=REPO,
        # each step 0.15 s or more: still running after the TUI starts, however fast the host
        env=dict(os.environ, TUNEDECK_HOME=str(td_home), TUNEDECK_TEST_SLOW_RANK="0:0.15"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    run_id = json.loads(launcher.stdout.readline())["run_id"]
    wait_for(lambda: _status(td_home, run_id)["step"] >= 3, 120, "the run to take steps")
    # a TUI watching the run, in a real terminal, killed the same way
    tmux.start(
        "tui",
        [sys.executable, "-m", "tunedeck.tui", "--readonly"],
        size=(100, 30),
        env={"TUNEDECK_HOME": str(td_home)},
    )
    pane_pid = int(tmux("list-panes", "-t", "tui", "-F", "#{pane_pid}").stdout.split()[0])
    wait_for(lambda: run_id in tmux.screen("tui"), 30, "the TUI to list the run")
    os.kill(pane_pid, signal.SIGKILL)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    at_kill = _status(td_home, run_id)
    assert at_kill["status"] == "running" and at_kill["step"] < steps
    final = wait_for(
        lambda: (s := _status(td_home, run_id))["status"] != "running" and s,
        300,
        "the run to finish",
    )
    assert final["status"] == "succeeded", final
    recs = cli_json("metrics", run_id, home=td_home)
    assert [r["step"] for r in recs] == list(range(1, steps + 1))


def _long_run(home, steps=100000, extra=()):
    out = cli_json(
        "launch",
        str(DEMO),
        "--set",
        f"train.max_steps={steps}",
        "--set",
        "train.save_steps=0",
        *extra,
        home=home,
    )
    run_id = out["run_id"]
    wait_for(lambda: _status(home, run_id)["step"] >= 3, 120, "the run to take steps")
    return run_id


def _assert_nothing_left(home, run_id, st_before):
    assert not marked_processes(run_id), "processes of the run survived"
    for pid in [st_before["torchrun_pid"], *st_before["worker_pids"]]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", pid
    pgids = json.loads((home / "runs" / run_id / "state.json").read_text())["pgids"]
    for pgid in pgids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


def test_graceful_stop_checkpoints_and_leaves_nothing(td_home):
    run_id = _long_run(td_home)
    before = _status(td_home, run_id)
    assert len(before["worker_pids"]) == 2
    out = cli_json("stop", run_id, "--wait", home=td_home)
    assert out["status"] == "stopped"
    _assert_nothing_left(td_home, run_id, before)
    run_dir = td_home / "runs" / run_id
    ends = [json.loads(x) for x in (run_dir / "events" / "rank0.jsonl").open()]
    end = [e for e in ends if e["kind"] == "end"]
    assert end and end[-1]["reason"] == "stopped"
    ckpts = sorted((run_dir / "output").glob("checkpoint-*"))
    assert ckpts, "a graceful stop must leave a checkpoint"
    assert ckpts[-1].name == f"checkpoint-{end[-1]['step']}"
    _load_adapter(ckpts[-1])


def test_hard_stop_kills_everything_at_once(td_home):
    run_id = _long_run(td_home)
    before = _status(td_home, run_id)
    t0 = time.monotonic()
    out = cli_json("stop", run_id, "--hard", "--wait", home=td_home)
    assert out["status"] == "stopped" and time.monotonic() - t0 < 20
    _assert_nothing_left(td_home, run_id, before)


def test_stop_when_the_agent_is_gone(td_home, monkeypatch):
    run_id = _long_run(td_home)
    before = _status(td_home, run_id)
    os.kill(before["agent_pid"], signal.SIGKILL)
    # its ranks live on: lost, not failed (tests/test_adopt.py: the adoption itself)
    monkeypatch.setenv("TUNEDECK_NO_ADOPT", "1")
    wait_for(lambda: _status(td_home, run_id)["status"] == "lost", 10, "agent loss seen")
    monkeypatch.delenv("TUNEDECK_NO_ADOPT")
    out = cli_json("stop", run_id, "--hard", "--wait", home=td_home)
    assert out["status"] == "stopped"
    _assert_nothing_left(td_home, run_id, before)


def _load_adapter(path):
    code = (
        "import sys; from tunedeck.core.demo import ensure_tiny_model; "
        "from transformers import AutoModelForCausalLM; from peft import PeftModel; "
        "base = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(sys.argv[2])); "
        "m = PeftModel.from_pretrained(base, sys.argv[1]); "
        "print(sum(p.numel() for n, p in m.named_parameters() if 'lora_' in n))"
    )
    data = str(REPO / "presets" / "data" / "demo_chat.jsonl")
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path), data],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) > 0


def test_ls_names_each_run(finished_demo):
    home, run_id, _ = finished_demo
    header, row = cli("ls", home=home).stdout.splitlines()[:2]
    assert header.split()[:3] == ["RUN", "NAME", "STATUS"]
    assert row.split()[:3] == [run_id, "demo", "succeeded"]
