"""The data stage of ms-swift and script runs as a phase: their tokenising/packing bars
(lines of our own making, in the shapes HF datasets and ms-swift draw them) become the
"tokenizing" phase events the built-in trainer writes, live while a bar is still redrawing."""

from __future__ import annotations

import json

import pytest

from tunedeck.core.backends.script import ConsoleMonitor
from tunedeck.core.backends.swift import SwiftLogMonitor
from tunedeck.core.ingest.dataphase import DataPhase, data_bar
from tunedeck.core.ingest.tail import Tail
from tunedeck.core.rundir import RunDir

MAP4 = "Map (num_proc=4):  45%|████▌     | 4500/10000 [00:03<00:04, 1234.56 examples/s]"
TOK = (
    "Running tokenizer on dataset (num_proc=16): 100%|██████████| 10000/10000 "
    "[00:08<00:00, 1180.20 examples/s]"
)
PACK = "Packing (num_proc=2):  30%|███       | 300/1000 [00:01<00:02, 250.00it/s]"
SLOW = "Packing: 10%|#         | 10/100 [00:20<03:00,  2.00s/it]"


@pytest.mark.parametrize(
    ("line", "stage", "done", "total"),
    [
        (MAP4, "Map (num_proc=4)", 4500, 10000),
        ("Map:   0%|          | 0/244 [00:00<?, ? examples/s]", "Map", 0, 244),
        (TOK, "Running tokenizer on dataset (num_proc=16)", 10000, 10000),
        (PACK, "Packing (num_proc=2)", 300, 1000),
        (
            "Grouping texts in chunks of 1024:  12%|█▏        | 12/100 [00:01<00:09, 9.1ba/s]",
            "Grouping texts in chunks of 1024",
            12,
            100,
        ),
        ("Filter: 50%|#####     | 5/10 [00:00<00:00, 40.0 examples/s]", "Filter", 5, 10),
    ],
)
def test_data_stage_bars_are_read(line, stage, done, total):
    bar = data_bar(line)
    assert bar is not None and (bar["desc"], bar["n"], bar["total"]) == (stage, done, total)


@pytest.mark.parametrize(
    "line",
    [
        "Train:  50%|█████     | 1/2 [00:00<00:00,  1.89it/s]",
        "Loading weights: 100%|██████████| 50/50 [00:00<00:00, 16494.82it/s]",
        "Downloading shards:  50%|█████     | 1/2 [00:10<00:10, 10.0s/it]",
        "Generating train split: 244 examples [00:00, 12000.00 examples/s]",  # no total
        "{'loss': 1.2, 'epoch': 0.1}",
    ],
)
def test_other_bars_are_not_the_data_stage(line):
    assert data_bar(line) is None


def test_rate_eta_throttle_and_the_last_reading():
    d = DataPhase(every_s=2.0)
    ev = d.feed(["Map:   0%|          | 0/244 [00:00<?, ? examples/s]", MAP4], now=100.0)
    assert ev == {
        "phase": "tokenizing",
        "stage": "Map (num_proc=4)",
        "done": 4500,
        "total": 10000,
        "rate": 1234.6,
        "eta_s": 4.0,
    }
    assert d.feed([MAP4.replace("4500/", "4600/")], now=101.0) is None  # within every_s
    assert d.feed([MAP4], now=103.0) is None  # the same reading again (live, then whole)
    assert d.feed([TOK], now=103.5)["done"] == 10000  # a stage's end always goes out
    slow = d.feed([SLOW], now=110.0)
    assert slow["rate"] == 0.5 and slow["eta_s"] == 180.0
    assert d.feed(["Train:  50%|█████     | 1/2 [00:00<00:00,  1.89it/s]"], now=120.0) is None


def test_a_bar_still_redrawing_is_seen_before_its_line_ends(tmp_path):
    f = tmp_path / "stderr.log"
    f.write_bytes(b"loading\n\r" + MAP4.replace("4500/", "100/").encode() + b"\r" + MAP4.encode())
    t = Tail(f)
    assert t.lines() == ["loading"]
    # the last piece may still be being written: the one before it is the newest whole one
    assert "100/10000" in t.redraw()
    with open(f, "ab") as fh:
        fh.write(b"\r" + TOK.encode() + b"\rRunning tok")
    assert t.redraw() == TOK and t.lines() == []  # nothing consumed
    with open(f, "ab") as fh:
        fh.write(b"enizer\n")
    assert len(t.lines()) == 1 and t.redraw() == ""
    # a window that cut into a redraw hands out only whole ones
    g = tmp_path / "long.log"
    g.write_bytes(b"\r".join([PACK.encode()] * 200) + b"\rPack")
    assert Tail(g).redraw(window=150) == PACK


def _events(run_dir):
    return [json.loads(x) for x in (run_dir / "events" / "rank0.jsonl").read_text().splitlines()]


def test_script_console_data_stage_then_steps(tmp_path):
    m = ConsoleMonitor(RunDir(tmp_path))
    m.parse(
        [
            f"Running tokenizer on dataset:  20%|##        | 200/1000 [00:01<00:04, {200.0} examples/s]",
            TOK,
            "{'loss': '1.5', 'learning_rate': '0.001', 'epoch': '0.1'}",
        ]
    )
    ev = _events(tmp_path)
    assert [e["kind"] for e in ev] == ["phase", "step"]
    assert ev[0]["phase"] == "tokenizing" and ev[0]["step"] == 0 and ev[0]["done"] == 10000


def test_swift_monitor_writes_the_live_data_phase(tmp_path):
    """ms-swift's rank 0 stderr with a Map bar still redrawing: the agent's tick writes a
    tokenizing phase from the newest redraw; once the bar ends, its last reading."""
    run = RunDir(tmp_path / "run")
    logs = run.node_log_dir(0) / "r_x" / "attempt_0" / "0"
    logs.mkdir(parents=True)
    (logs / "stdout.log").write_text("")
    err = logs / "stderr.log"
    bars = [
        f"Map (num_proc=1):  {p:>2}%|###       | {n}/244 [00:01<00:02, 100.00 examples/s]"
        for p, n in ((10, 24), (50, 122))
    ]
    err.write_text("[INFO:swift] Start time of running main\n\r" + "\r".join(bars) + "\rMap (")
    m = SwiftLogMonitor(run, tmp_path / "out", 0)
    m.tick(1000.0, [])
    done = "Map (num_proc=1): 100%|##########| 244/244 [00:02<00:00, 100.00 examples/s]"
    with open(err, "a") as fh:
        fh.write("num_proc=1):  60%|###       | 146/244 [00:01<00:01, 100.00 examples/s]\r")
        fh.write(done + "\n")
    m.tick(1000.5, [])
    m.close([])
    phases = [(e["done"], e["total"], e.get("eta_s")) for e in _events(run.path)]
    assert phases == [(122, 244, 2.0), (244, 244, 0.0)], phases


def test_a_data_stage_that_outlasts_the_collective_timeout_is_warned_once():
    d = DataPhase(timeout_s=600)
    fine = "Map:  10%|#         | 100/1000 [00:10<01:30, 10.00 examples/s]"
    assert "warning" not in d.feed([fine], now=0.0)
    slow = "Running tokenizer on dataset:  20%|##        | 200/1000 [02:00<09:00,  1.48 examples/s]"
    ev = d.feed([slow], now=10.0)
    assert "600 s" in ev["warning"] and "cluster.collective_timeout_s" in ev["warning"]
    assert ev["warning"].startswith("the data stage (Running tokenizer on dataset) takes about 660")
    later = slow.replace("200/1000 [02:00<09:00", "300/1000 [03:00<08:00")
    assert "warning" not in d.feed([later], now=20.0)  # said once
    assert "warning" not in DataPhase().feed([slow], now=0.0)  # no timeout known: no warning
