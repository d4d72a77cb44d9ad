"""The agent's restart policy with real torchrun: a failed attempt is retried after a pause."""

from __future__ import annotations

import json

import pytest

from tunedeck.core.supervisor.launch import prepare_run, start_agent
from tunedeck.core.views.registry import read_run
from tunedeck.core.spec import load_spec
from tests.conftest import DEMO, REPO, wait_for

pytestmark = pytest.mark.slow


def _run_script_instead(run_dir, script):
    """Point the plan's torchrun at a test script instead of the built-in trainer."""
    plan_path = run_dir / "plan.json"
    plan = json.loads(plan_path.read_text())
    argv = plan["nodes"][0]["argv"]
    i = argv.index("-m", argv.index("torch.distributed.run") + 1)
    plan["nodes"][0]["argv"] = argv[:i] + [str(script)]
    plan_path.write_text(json.dumps(plan))


@pytest.mark.parametrize("max_restarts,expected", [(1, "succeeded"), (0, "failed")])
def test_failed_attempt_is_restarted(td_home, max_restarts, expected):
    spec = load_spec(DEMO, [f"run.max_restarts={max_restarts}", "run.restart_pause_s=0.5"])
    run_dir = prepare_run(spec, td_home / "runs")
    _run_script_instead(run_dir, REPO / "tests" / "scripts" / "flaky_rank.py")
    start_agent(run_dir)
    run = wait_for(lambda: (r := read_run(run_dir)) and not r.active and r, 120, "the end")
    assert run.status == expected, run.message
    attempts = run.state["attempts"]
    assert [a["exit_code"] != 0 for a in attempts] == [True, False][: max_restarts + 1]
    starts = [json.loads(x) for x in (run_dir / "events" / "rank1.jsonl").open()]
    assert [e["attempt"] for e in starts] == list(range(max_restarts + 1))


def test_crashed_trainer_is_restarted_and_resumes(td_home, monkeypatch):
    """The whole restart policy with the built-in trainer: rank 1 crashes at step 8 on the
    first attempt; the agent restarts torchrun, the trainer resumes from checkpoint-5, and the
    metrics hold every step exactly once."""
    from tests.conftest import cli, cli_json, json_docs

    monkeypatch.setenv("TUNEDECK_TEST_CRASH_AT_STEP", "8")
    out = cli(
        "launch",
        str(DEMO),
        "--wait",
        "--json",
        "--set",
        "train.max_steps=12",
        "--set",
        "train.save_steps=5",
        "--set",
        "run.max_restarts=1",
        "--set",
        "run.restart_pause_s=0.5",
        home=td_home,
    )
    started, ended = json_docs(out.stdout)
    run_id = started["run_id"]
    st = cli_json("status", run_id, home=td_home)
    assert st["status"] == ended["status"] == "succeeded"
    run_dir = td_home / "runs" / run_id
    state = json.loads((run_dir / "state.json").read_text())
    assert [a["exit_code"] != 0 for a in state["attempts"]] == [True, False]
    starts = [json.loads(x) for x in (run_dir / "events" / "rank0.jsonl").open() if '"start"' in x]
    assert starts[1]["resumed_from"].endswith("checkpoint-5") and starts[1]["start_step"] == 5
    # the agent said where the restart would continue before the trainer found it
    assert "restarting in 0.5s from checkpoint-5" in (run_dir / "logs" / "agent.log").read_text()
    steps = [r["step"] for r in cli_json("metrics", run_id, home=td_home)]
    assert steps == list(range(1, 13))
    # the loss curve continues: steps 6..7 were done twice, and the resumed ones are kept
    logged = [
        json.loads(x)["step"]
        for x in (run_dir / "events" / "rank0.jsonl").open()
        if '"kind": "step"' in x
    ]
    assert logged.count(6) == 2 and logged.count(12) == 1
