"""state.json's shape is declared once (core/rundir/records.py): the schema, the new state, the
readers' checks and the docs' table all follow it, and nothing is lost between versions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.rundir.records import Launch, RunState, Status, TERMINAL
from tunedeck.core.store.state import clean_state, fatal_problem, new_state, state_problem

DOCS = Path(__file__).resolve().parent.parent / "docs" / "run-directory.md"


def test_a_new_state_is_its_own_schema_and_round_trips():
    state = new_state("20261203-000000-x-0001", "x", 10)
    assert state_problem(state) is None
    again = RunState.from_json(json.loads(json.dumps(state))).to_json()
    assert again == state
    assert set(state) == RunState.keys()
    assert TERMINAL == tuple(s.value for s in (Status.SUCCEEDED, Status.FAILED, Status.STOPPED))


def test_unknown_keys_of_a_newer_tunedeck_are_kept():
    state = {
        **new_state("r", "x", 1),
        "from_the_future": {"a": [1]},
        "launches": [{"id": "abc", "attempt": 0, "boot": "b", "after": 3, "t": 1.0, "newer": True}],
    }
    out = clean_state(state)
    assert out["from_the_future"] == {"a": [1]}
    assert out["launches"] == state["launches"]  # no None-valued field added either


@pytest.mark.parametrize(
    "change, named, vital",
    [
        ({"status": "bogus"}, "status: expected one of pending, running", True),
        ({"run_id": 7}, "run_id: expected a string, got 7", True),
        ({"progress": {"step": -0.5, "max_steps": 1}}, "progress.step: expected an integer", False),
        (
            {"launches": [{"id": "a", "after": "soon"}]},
            "launches[0].after: expected an integer",
            False,
        ),
        ({"attempts": [3]}, "attempts[0]: expected an object, got 3", False),
        ({"exit_code": True}, "exit_code: expected an integer, got True", False),
        ({"beat": float("inf")}, "beat: expected a number, got inf", False),
    ],
)
def test_a_bad_value_is_named_by_its_path_and_read_as_missing(change, named, vital):
    state = {**new_state("r", "x", 1), **change}
    assert (state_problem(state) or "").startswith(named)
    assert (fatal_problem(state) is not None) == vital
    if not vital:
        cleaned = clean_state(state)
        assert state_problem(cleaned) is None
        assert cleaned["progress"]["max_steps"] == 1


def test_the_docs_table_names_every_key_and_no_other():
    section = DOCS.read_text().split("## state.json", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            named |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    assert named == set(RunState.keys()), (
        sorted(RunState.keys() - named),
        sorted(named - RunState.keys()),
    )


def test_the_agent_refuses_to_write_a_key_the_schema_does_not_declare(tmp_path):
    from tunedeck.core.supervisor.agent import Agent
    from tunedeck.core.supervisor.launch import prepare_run
    from tunedeck.core.spec import loads_spec

    data = Path(__file__).resolve().parent.parent / "presets" / "data" / "demo_chat.jsonl"
    run = prepare_run(
        loads_spec(
            f'name = "k"\n[data]\npath = "{data}"\n[cluster]\ndevice = "cpu"\n', source="<test>"
        ),
        tmp_path / "runs",
    )
    agent = Agent(run)
    agent.save(message="fine", beat=1.0)
    with pytest.raises(KeyError, match="workers_pids"):
        agent.save(workers_pids=[1])
    assert "workers_pids" not in json.loads((run / "state.json").read_text())


def test_findings_round_trip_through_json():
    f = Finding(
        category="oom_gpu",
        severity="error",
        summary="s",
        cause="c",
        fix="f",
        rank=1,
        evidence=["a", "b"],
        t=1.5,
        source="x.log",
        root_cause=False,
        host="h",
    )
    assert Finding.from_json(json.loads(json.dumps(f.to_json()))) == f
    assert Launch.from_json({"id": "x", "torchrun_pid": 5}).to_json() == {
        "id": "x",
        "attempt": 0,
        "boot": "",
        "after": 0,
        "t": 0.0,
        "torchrun_pid": 5,
    }
