"""Sweeps (core/sweep) over the queue on the CPU demo: a 2x2 grid with --parallel 2 completes,
never more than two of its runs live at once; the median rule stops the points whose learning
rate is poisoned (their loss goes NaN), gracefully and saying why; `sweep show` and its --json
agree. The built-in trainer's early stop ends a run whose eval loss stops improving."""

from __future__ import annotations

import json
import threading

from conftest import DEMO, cli, wait_for


def _state(home, run_id) -> dict:
    return json.loads((home / "runs" / run_id / "state.json").read_text())


def test_grid_with_parallel_two_and_the_median_rule(td_home, monkeypatch):
    # 0.25 s a step more: a point must still be running when the rule judges it at step 6
    monkeypatch.setenv("TUNEDECK_TEST_SLOW_RANK", "0:0.25")
    out = cli(
        "sweep", str(DEMO), "--grid", "train.learning_rate=5e-3,1e3", "--grid", "train.seed=1,2",
        "--parallel", "2", "--median-after", "6", "--set", "train.max_steps=40",
        "--set", "train.save_steps=0", "--set", "cluster.cpu_procs=1", "--json", home=td_home,
    )  # fmt: skip
    made = json.loads(out.stdout)
    sweep, runs = made["sweep"], made["runs"]
    assert len(runs) == 4
    live_max = 0

    def ended():
        nonlocal live_max
        states = [_state(td_home, r) for r in runs]
        live = [s for s in states if s["status"] in ("pending", "running")]
        live_max = max(live_max, len(live))
        return all(s["status"] in ("succeeded", "failed", "stopped") for s in states) and states

    states = wait_for(ended, 600, "every point's end", poll=0.5)
    assert live_max <= 2, "more runs of the sweep were live than --parallel"
    by_lr = {}
    for s in states:
        by_lr.setdefault(s["sweep"]["settings"]["train.learning_rate"], []).append(s)
    assert [s["status"] for s in by_lr[5e-3]] == ["succeeded", "succeeded"]
    for s in by_lr[1e3]:  # NaN from step 5: worse than the median of its siblings
        assert s["status"] == "stopped", s["message"]
        assert "median stopping rule" in s["message"] and "graceful" in s["message"]
        assert s["progress"]["step"] < 40
    # the table and --json say the same
    rows = json.loads(cli("sweep", "show", sweep, "--json", home=td_home).stdout)["points"]
    text = cli("sweep", "show", sweep, home=td_home).stdout.splitlines()
    assert len(text) == 1 + len(rows)
    for line, row in zip(text[1:], rows):
        words = line.split()
        assert words[0] == str(row["point"]) and words[-1] == row["run_id"]
        assert row["status"] in words and str(row["step"]) in words
        assert words[1] == str(row["settings"]["train.learning_rate"])
    assert {r["status"] for r in rows} == {"succeeded", "stopped"}


def test_early_stop_ends_a_run_whose_eval_loss_stops_improving(td_home):
    out = cli(
        "launch", str(DEMO), "--json", "--no-preflight", "--wait",
        "--set", "train.max_steps=60", "--set", "train.save_steps=0",
        "--set", "data.val_split=0.2", "--set", "train.eval_steps=2",
        "--set", "train.early_stop_patience=2", "--set", "train.early_stop_min_delta=100.0",
        home=td_home,
    )  # fmt: skip
    run_id = json.loads(out.stdout.splitlines()[0])["run_id"]
    st = _state(td_home, run_id)
    assert st["status"] == "succeeded", st["message"]
    # evals at steps 2 (the best), 4 and 6 (no better by 100): it ends at step 6
    assert st["progress"]["step"] == 6
    run_dir = td_home / "runs" / run_id
    ends = [json.loads(x) for x in (run_dir / "events" / "rank0.jsonl").read_text().splitlines()]
    end = [e for e in ends if e["kind"] == "end"][-1]
    assert end["reason"] == "early_stop" and "did not improve" in end["early_stop"]
    assert (run_dir / "output" / "checkpoint-6").is_dir()


def test_wait_returns_when_a_finished_points_run_is_deleted_meanwhile(td_home, monkeypatch):
    """`sweep --wait` over a short point and a long one: the short one's run, deleted from
    another shell once it has ended, does not keep the wait going; the table says it is
    missing."""
    monkeypatch.setenv("TUNEDECK_TEST_SLOW_RANK", "0:0.25")  # the second point outlives the delete
    argv = [
        "sweep", str(DEMO), "--grid", "train.max_steps=4,60", "--parallel", "2",
        "--set", "train.save_steps=0", "--set", "cluster.cpu_procs=1", "--wait",
    ]  # fmt: skip
    got = {}
    waiting = threading.Thread(target=lambda: got.update(out=cli(*argv, home=td_home, timeout=400)))
    waiting.start()

    def points() -> dict:
        runs = td_home / "runs"
        return {
            _state(td_home, p.name)["sweep"]["settings"]["train.max_steps"]: p.name
            for p in (runs.iterdir() if runs.is_dir() else ())
            if (p / "state.json").is_file()
        }

    first, second = wait_for(lambda: len(p := points()) == 2 and (p[4], p[60]), 60, "both points")
    wait_for(lambda: _state(td_home, first)["status"] == "succeeded", 240, "the first point's end")
    wait_for(lambda: cli("delete", first, home=td_home, check=False).returncode == 0, 60, "delete")
    assert _state(td_home, second)["status"] not in ("succeeded", "failed", "stopped")
    waiting.join(300)
    assert not waiting.is_alive(), "sweep --wait still waits for a deleted point"
    table = got["out"].stdout.splitlines()
    (gone,) = [line for line in table if line.endswith(first)]
    assert "missing" in gone.split()
    assert _state(td_home, second)["status"] == "succeeded"
