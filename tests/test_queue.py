"""The GPU queue (core/queue) with the fake NVML behind the real interface (two GPUs): three
real CPU demo runs of one GPU each start in order, never share a GPU while both live, and a
SIGKILL of every agent leaves the queue as it was (the state is on disk; the next command
adopts the runs, which wait again)."""

from __future__ import annotations

import json
import os
import signal

from conftest import DEMO, cli, cli_json, wait_for


def _state(home, run_id) -> dict:
    return json.loads((home / "runs" / run_id / "state.json").read_text())


def test_three_runs_for_two_gpus_start_in_order_and_survive_killed_agents(td_home, monkeypatch):
    monkeypatch.setenv("TUNEDECK_FAKE_NVML", "2")
    ids = []
    for name in ("qa", "qb", "qc"):
        out = cli(
            "launch", str(DEMO), "--queue", "--json", "--no-preflight", "--name", name,
            "--set", "run.gpu_count=1", "--set", "cluster.cpu_procs=1",
            "--set", "train.max_steps=6", "--set", "train.save_steps=0", home=td_home,
        )  # fmt: skip
        ids.append(json.loads(out.stdout)["run_id"])
    a, b, c = ids
    # the third waits: both GPUs are taken
    wait_for(lambda: _state(td_home, c)["status"] == "queued"
             and "free" in _state(td_home, c)["message"], 60, "c queued for GPUs")  # fmt: skip
    assert sorted(_state(td_home, r)["queue"]["gpus"][0] for r in (a, b)) == [0, 1]
    # the text form: how long c has waited; for a run holding GPUs, how long it has held them
    lines = cli("queue", home=td_home).stdout.splitlines()
    listed = {r: line for line in lines for r in ids if f" {r} " in line}
    assert " queued " in listed[c] and listed[c].startswith("#1")
    assert all(" running " in listed[r] for r in (a, b) if r in listed)
    # every agent dies at once (a reboot of the agents): the queue is still there
    for r in ids:
        os.kill(_state(td_home, r)["agent_pid"], signal.SIGKILL)
    rows = wait_for(
        lambda: [x for x in cli_json("queue", home=td_home) if x["run_id"] == c and x["position"]],
        60,
        "c back in the queue",
    )
    assert rows[0]["position"] == 1 and rows[0]["status"] == "queued"
    ends = {
        r: wait_for(
            lambda r=r: (s := _state(td_home, r))["status"] in ("succeeded", "failed") and s,
            300,
            f"{r}'s end",
        )
        for r in ids
    }
    assert all(s["status"] == "succeeded" for s in ends.values()), {
        r: s["message"] for r, s in ends.items()
    }
    starts = [ends[r]["queue"]["started"] for r in ids]
    assert starts == sorted(starts), "the runs started out of order"
    # c took a GPU only once a run holding it had ended; no two live runs shared one
    for x in ids:
        for y in ids:
            if x < y:
                sx, sy = ends[x], ends[y]
                overlap = (
                    sx["queue"]["started"] < sy["ended"] and sy["queue"]["started"] < sx["ended"]
                )
                assert not (overlap and set(sx["queue"]["gpus"]) & set(sy["queue"]["gpus"]))
    first_end = min(ends[a]["ended"], ends[b]["ended"])
    assert ends[c]["queue"]["started"] >= first_end
    assert ends[c]["adopted"], "c's agent was killed while it waited"
    # a queued run can be cancelled before it starts
    monkeypatch.setenv("TUNEDECK_FAKE_NVML", "0")
    out = cli(
        "launch", str(DEMO), "--queue", "--json", "--no-preflight", "--name", "qd",
        "--set", "cluster.gpus=\"0\"", home=td_home,
    )  # fmt: skip
    d = json.loads(out.stdout)["run_id"]
    wait_for(lambda: _state(td_home, d)["status"] == "queued", 30, "d queued")
    cli_json("stop", d, home=td_home)
    st = wait_for(lambda: (s := _state(td_home, d))["status"] == "stopped" and s, 60, "d stopped")
    assert st["message"] == "stopped while queued" and not st.get("started")
