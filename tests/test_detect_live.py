"""Live detectors under a real agent and real torchrun: a starved rank, a hung rank, the probe.

The runs execute tests/scripts/ddp_toy.py (plain torch DDP on gloo) instead of the built-in
trainer: prepare_run writes a normal run directory, then plan.json's argv is pointed at the
script, and the real agent launches it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from conftest import DEMO, cli, wait_for
from tunedeck.core.probe import SITE_DIR
from tunedeck.core.supervisor.control import stop
from tunedeck.core.supervisor.launch import prepare_run, start_agent
from tunedeck.core.views.registry import read_run
from tunedeck.core.store.store import read_events, read_findings
from tunedeck.core.spec import RunSpec

TOY = Path(__file__).resolve().parent / "scripts" / "ddp_toy.py"


def toy_run(root: Path, args: list[str], probe: bool = False, name: str = "toy") -> Path:
    """A run directory whose torchrun runs the toy script with `args` instead of tunedeck.core.train."""
    spec = RunSpec(name=name)
    spec.model.path = "toy"  # not builtin:, so the agent builds no demo model
    spec.data.path = str(TOY)  # required by the builtin spec checks; unused
    spec.cluster.device = "cpu"
    spec.cluster.cpu_procs = 2
    spec.run.stop_grace_s = 5
    run_dir = prepare_run(spec, root)
    plan_path = run_dir / "plan.json"
    plan = json.loads(plan_path.read_text())
    for node in plan["nodes"]:
        argv = node["argv"]
        i = argv.index("tunedeck.core.train") - 1  # ... -m tunedeck.core.train --run-dir RUN
        assert argv[i] == "-m"
        node["argv"] = argv[:i] + [str(TOY), *args]
        if probe:
            env = node["env"]
            env["PYTHONPATH"] = f"{SITE_DIR}:{env.get('PYTHONPATH', '')}"
    plan_path.write_text(json.dumps(plan))
    start_agent(run_dir)
    return run_dir


def _finding(run_dir: Path, category: str):
    _alive(run_dir)
    return next((f for f in read_findings(run_dir) if f["category"] == category), None)


def _alive(run_dir: Path) -> None:
    """Fail at once, with the rank's error, when the toy run died instead of waiting."""
    run = read_run(run_dir)
    if run is not None and run.status == "failed":
        errs = sorted(run_dir.glob("logs/node0/*/attempt_*/*/stderr.log"))
        tail = "".join(p.read_text(errors="replace")[-1500:] for p in errs)
        raise AssertionError(f"toy run failed: {run.state.get('message')}\n{tail}")


def _steps(run_dir: Path):
    _alive(run_dir)
    return read_events(run_dir, "step")


def _stop(run_dir: Path) -> None:
    run = read_run(run_dir)
    if run is not None:
        stop(run, hard=True, timeout_s=30)


@pytest.mark.slow
def test_starved_rank_of_the_demo_is_flagged_within_30s(td_home, monkeypatch):
    # the demo on CPU (built-in trainer, 2 gloo ranks); rank 1 waits 0.3 s more per batch
    monkeypatch.setenv("TUNEDECK_TEST_LOADER_DELAY", "1:0.3")
    out = cli(
        "launch",
        str(DEMO),
        "--json",
        "--set",
        "train.max_steps=100000",
        "--set",
        "train.save_steps=0",
        home=td_home,
    )
    run_dir = td_home / "runs" / json.loads(out.stdout)["run_id"]
    try:
        wait_for(lambda: _steps(run_dir), 90, "the first steps")
        t_first = time.monotonic()
        f = wait_for(
            lambda: _finding(run_dir, "dataloader_starvation"),
            30,
            "a dataloader_starvation finding",
        )
        assert time.monotonic() - t_first < 30
        assert f["rank"] == 1 and f["severity"] == "warning"
        assert "rank 1" in f["summary"]
        assert "num_workers" in f["fix"] and "pin_memory" in f["fix"]
        assert any("rank 1" in line for line in f["evidence"])
        time.sleep(2)
        cats = [(x["category"], x["rank"]) for x in read_findings(run_dir)]
        assert ("dataloader_starvation", 0) not in cats  # rank 0 only waits in all-reduce
        assert "stall" not in [c for c, _ in cats]
    finally:
        _stop(run_dir)


@pytest.mark.slow
def test_hung_rank_is_flagged_as_stall(td_home, monkeypatch):
    monkeypatch.setenv("TUNEDECK_STALL_FLOOR_S", "8")  # the default floor is 60 s
    run_dir = toy_run(td_home / "runs", ["--hang-rank", "1", "--hang-at", "20"])
    try:
        f = wait_for(lambda: _finding(run_dir, "stall"), 120, "a stall finding")
        assert f["severity"] == "error"
        assert "step 20" in f["summary"]
        steps = read_events(run_dir, "step")
        assert max(e["step"] for e in steps) == 20  # nothing after the hang
        assert any(line.startswith("rank 1: last step 20") for line in f["evidence"])
        assert "py-spy dump --pid" in f["fix"]
        st = json.loads((run_dir / "state.json").read_text())
        assert st["status"] == "running"  # a stall is reported, not acted on
    finally:
        _stop(run_dir)


@pytest.mark.slow
def test_probe_times_dataloader_in_a_plain_script(td_home):
    """The injected probe records waits of a script that writes no events of its own, with
    multiprocessing workers; the starvation detector reads the probe."""
    run_dir = toy_run(
        td_home / "runs",
        ["--no-events", "--workers", "1", "--delay-rank", "1", "--delay-s", "0.3", "--steps", "60"],
        probe=True,
    )
    try:
        f = wait_for(
            lambda: _finding(run_dir, "dataloader_starvation"), 90, "starvation from probe records"
        )
        assert f["rank"] == 1 and "(probe)" in " ".join(f["evidence"])
        wait_for(lambda: read_run(run_dir).status == "succeeded", 90, "the script to finish")
        recs = [
            json.loads(x)
            for x in (run_dir / "events" / "probe_rank1.jsonl").read_text().splitlines()
        ]
        assert recs and all(r["kind"] == "data_wait" and r["rank"] == 1 for r in recs)
        assert sum(r["n"] for r in recs) == 60  # every batch, counted once
        assert sum(r["wait_s"] for r in recs) > 5  # 60 x 0.3 s, partly prefetched
        r0 = [
            json.loads(x)
            for x in (run_dir / "events" / "probe_rank0.jsonl").read_text().splitlines()
        ]
        assert sum(r["n"] for r in r0) == 60
        assert not list((run_dir / "events").glob("rank*.jsonl"))
        assert read_events(run_dir, "data_wait", rank=1)  # ingested into run.db
    finally:
        _stop(run_dir)


def test_toy_script_exists_and_parses():
    import subprocess

    out = subprocess.run(
        [sys.executable, str(TOY), "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "--hang-rank" in out.stdout
