"""The agent's Store reads a trainer's step lines with the native picker (no dict per line)
and stores exactly what the json.loads path stores, for plain and odd lines alike; a live
agent gets back only the step events its monitors read."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tunedeck.core.ingest.native import fastscan
from tunedeck.core.rundir import RunDir
from tunedeck.core.store import store as store_mod
from tunedeck.core.supervisor.monitors import _newest_steps
from tunedeck.core.store.store import STEP_METRICS, Store

pytestmark = pytest.mark.skipif(fastscan is None, reason="native module not built")


def step(rank: int, s: int, **over) -> dict:
    e = {
        "t": 1764632952.25 + s,
        "kind": "step",
        "rank": rank,
        "step": s,
        "loss": 2.0 + 1 / s,
        "lr": 1e-4,
        "grad_norm": 0.5,
        "tokens": 8192,
        "step_s": 0.6,
        "data_wait_s": 0.004,
        "mem_gib": 61.3,
        "tokens_per_s": 13653.0,
        "epoch": 0,
        "mfu": 0.41,
    }
    e.update(over)
    return e


# lines the picker must hand to json.loads, or read exactly as json.loads does
ODD = [
    json.dumps(step(0, 3, loss=None)),  # null loss: loss_nan
    json.dumps({k: v for k, v in step(0, 4).items() if k != "loss"}),  # no loss key
    json.dumps(step(0, 5, loss=float("nan"))),  # NaN: Python's
    json.dumps(step(0, 6, lr="0.1")),  # a string metric
    json.dumps(step(0, 7, grad_norm=True)),  # a bool metric
    json.dumps(step(0, 8, extra={"nested": [1, 2]})),  # a nested value
    json.dumps(step(0, 9, note='caf\u00e9 \\ "q"')),  # escapes in a string
    json.dumps(step(0, 10, note="café")),  # UTF-8 in a string
    json.dumps(step(0, 11, t=1764632963)),  # an int time
    json.dumps(step(0, 12, tokens=2**62)),  # a big int
    json.dumps(step(0, 13, step_s=1e-300, mem_gib=-0.0, epoch=2.5e3)),
    '{"kind":"step","rank":0,"step":14,"t":5,"loss":1.5,"loss":2.5}',  # repeated key
    '{"kind":"step","rank":0,"step":15,"t":5}{"kind":"step"}',  # two values
    '{"kind":"step","rank":0,"step":16,"t":5,"loss":01}',  # bad number
    '{"kind":"step","rank":0,"step":17,"t":5,"loss":1e999}',  # inf
    '{"kind":"step","rank":0,"step":18,"t":5,}',  # trailing comma
    '{ "kind" : "step" , "rank" : 0 , "step" : 19 , "t" : 5.5 , "loss" : -1.5E-3 }',
    '{"kind":"step","rank":0,"step":-1,"t":5}',  # negative step
    '{"kind":"step","rank":0,"step":20.0,"t":5}',  # float step
    '{"kind":"step","rank":true,"step":21,"t":5}',  # bool rank
    '{"kind":"step","step":22,"t":5,"loss":1.0}',  # no rank: the file's
    '{"kind":"eval","rank":0,"step":22,"t":5,"eval_loss":1.25}',
    '{"kind":"start","rank":0,"max_steps":500}',
    json.dumps(step(0, 23)),
    json.dumps(step(0, 23)),  # a repeated step
    # ints past SQLite's 64 bits: a value becomes a float (or None past a float's range),
    # a step or rank that cannot be one is not one (the agent used to stop on OverflowError)
    json.dumps(step(0, 25, t=2**64)),
    json.dumps(step(0, 26, tokens=2**64)),
    json.dumps(step(0, 27, tokens=-(2**70), loss=10**400)),
    '{"kind":"step","rank":18446744073709551616,"step":28,"t":5,"loss":1.0}',
    '{"kind":"step","rank":0,"step":18446744073709551616,"t":5,"loss":1.0}',
    '{"kind":"step","rank":0,"step":1e300,"t":5,"loss":1.0}',
    '{"kind":"start","rank":0,"max_steps":18446744073709551616}',
    json.dumps(step(0, 29)),
    '{"kind":"step","rank":0,"step":24,"t":5,"loss":1.0',  # cut short
]


def write(run: RunDir) -> None:
    with open(run.event_file(0), "w") as f:
        f.write("\n".join([json.dumps(step(0, 1)), json.dumps(step(0, 2))] + ODD) + "\n")
    with open(run.event_file(1), "w") as f:
        f.write("".join(json.dumps(step(1, s)) + "\n" for s in range(1, 200)))


def tables(run: RunDir) -> dict[str, list]:
    db = sqlite3.connect(run.db)
    out = {
        t: db.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
        for t in ("steps", "evals", "steps_64")
    }
    out["events"] = db.execute(
        "SELECT rank, kind, step, t, data FROM events ORDER BY id"
    ).fetchall()
    db.close()
    return out


def test_picked_lines_stored_as_the_json_path_stores_them(tmp_path, monkeypatch):
    got = {}
    for mode in ("native", "json"):
        run = RunDir(tmp_path / mode)
        run.events.mkdir(parents=True)
        write(run)
        if mode == "json":
            monkeypatch.setattr(store_mod, "fastscan", None)
        with Store(run, write=True) as agent:
            got[mode] = (agent.ingest(), tables(run))
    assert got["native"] == got["json"]
    steps = {row[1]: row for row in got["json"][1]["steps"] if row[0] == 0}
    assert {25, 26, 27, 28, 29} <= set(steps) and max(steps) == 29
    assert 2.0**64 in steps[26] and -(2.0**70) in steps[27] and steps[25][2] == 2.0**64
    # and the picker read the plain lines itself, handing the odd ones to Python
    picks = fastscan.pick_steps([json.dumps(step(0, 1))] + ODD, STEP_METRICS)
    assert picks[0] is not None and sum(p is None for p in picks) >= 12


def test_a_live_ingest_returns_only_what_the_monitors_read(tmp_path):
    run = RunDir(tmp_path)
    run.events.mkdir(parents=True)
    for r in range(4):
        with open(run.event_file(r), "w") as f:
            for s in range(1, 301):
                f.write(json.dumps(step(r, s)) + "\n")
                if s % 100 == 0:
                    f.write(
                        json.dumps(
                            {"kind": "eval", "rank": r, "step": s, "t": 1.0, "eval_loss": 1.0}
                        )
                        + "\n"
                    )
    with Store(run, write=True) as agent:
        live = agent.ingest(newest_steps=64, every_step_of=1)
    with Store(RunDir(tmp_path), write=False) as viewer:
        every = viewer.events()
    # what the detectors take of all the events, and every step of the loss watch's rank
    assert _newest_steps(live, 64) == _newest_steps(every, 64)
    assert [e for e in live if e["rank"] == 1] == [e for e in every if e["rank"] == 1]
    assert len(live) == 300 + 3 * 64 + 12
    with Store(RunDir(tmp_path)) as viewer:  # run.db holds every line all the same
        assert viewer.step_range(3) == (1, 300)
