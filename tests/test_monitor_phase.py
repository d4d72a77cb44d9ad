"""The monitor says what a run does between steps: a torch.compile of a new batch shape is
"compiling" (not a run that looks stuck), a compile that failed over to eager is a standing
warning, and a multi-node run lists every node. Read through the real watcher from a run
directory written by the real launch code."""

from __future__ import annotations

import json
import time

from tests.test_manage import make_run
from tunedeck.core.rundir import RunDir
from tunedeck.core.views.watch import RunWatcher
from tunedeck.tui.widgets.progress import node_line, progress_text


def _append(run_dir, *events) -> None:
    with open(RunDir(run_dir).event_file(0), "a") as f:
        for e in events:
            f.write(json.dumps({"rank": 0, "t": time.time(), **e}) + "\n")


def test_compiling_shows_until_steps_resume_and_a_fallback_stays(tmp_path):
    run_dir = make_run(
        tmp_path / "runs", "20261202-010000-demo-0a0a", status="running", step=3, max_steps=100
    )
    _append(
        run_dir,
        {"kind": "step", "step": 3, "loss": 2.0},
        {"kind": "phase", "phase": "compiling", "step": 3, "est_s": 20.0, "shape": [4, 512]},
    )
    w = RunWatcher(run_dir)
    snap = w.poll(history=False)
    assert snap.phase is not None and snap.phase["phase"] == "compiling"
    text = progress_text(snap, 120)
    assert "compiling[/] a new batch shape (~0:20, " in text, text
    _append(
        run_dir,
        {
            "kind": "phase",
            "phase": "eager_fallback",
            "step": 3,
            "error": "InductorError: no C compiler",
        },
        {"kind": "step", "step": 4, "loss": 1.9},
    )
    snap = w.poll(history=False)
    assert snap.phase is None
    text = progress_text(snap, 120)
    assert "compiling" not in text.split("compile failed")[0]
    assert "compile failed, training eager" in text and "no C compiler" in text


def test_tokenizing_shows_progress_rate_and_eta_until_the_first_step(tmp_path):
    run_dir = make_run(
        tmp_path / "runs", "20261204-010000-demo-0c0c", status="running", step=0, max_steps=100
    )
    _append(
        run_dir,
        {
            "kind": "phase",
            "phase": "tokenizing",
            "step": 0,
            "done": 4000,
            "total": 10000,
            "rate": 812.4,
            "eta_s": 7.4,
        },
    )
    w = RunWatcher(run_dir)
    text = progress_text(w.poll(history=False), 120)
    assert "tokenizing[/] 4000/10000 samples (812/s, ETA 0:07)" in text, text
    assert "warning" not in text
    # the stage's timeout warning comes in one event and stays while the stage lasts
    warn = "tokenizing 10000 samples takes about 900 s, longer than the collective timeout"
    tok = {"kind": "phase", "phase": "tokenizing", "step": 0, "total": 10000, "rate": 11.0}
    _append(run_dir, {**tok, "done": 5000, "warning": warn}, {**tok, "done": 6000})
    text = progress_text(w.poll(history=False), 120)
    assert "6000/10000" in text and "warning:[/] " + warn in text, text
    _append(run_dir, {"kind": "step", "step": 1, "loss": 2.0})
    assert "tokenizing" not in progress_text(w.poll(history=False), 120)


def test_a_finished_run_never_shows_compiling(tmp_path):
    run_dir = make_run(tmp_path / "runs", "20261202-010001-demo-0b0b", status="succeeded")
    _append(run_dir, {"kind": "phase", "phase": "compiling", "step": 0, "est_s": 20.0})
    snap = RunWatcher(run_dir).poll(history=False)
    assert snap.phase is None and "compiling" not in progress_text(snap, 120)


def test_single_node_runs_list_no_nodes_and_a_node_line_says_its_link(tmp_path):
    run_dir = make_run(tmp_path / "runs", "20261202-010002-demo-0c0c")
    assert RunWatcher(run_dir).poll(history=False).nodes == []
    line = node_line(
        {
            "node": 1,
            "host": "gpu-b",
            "status": "running",
            "reach": "reconnecting",
            "drops": 2,
            "step": 40,
            "slowest_rank": 9,
            "gpus": 8,
            "findings": 1,
        }
    )
    for part in (
        "node 1",
        "gpu-b",
        "running",
        "reconnecting",
        "2 drop(s)",
        "step 40",
        "slowest rank 9",
        "8 GPU(s)",
        "1 finding(s)",
    ):
        assert part in line, (part, line)
    assert "shared fs" not in line
    shared = {
        "node": 1,
        "host": "gpu-b",
        "reach": "connected",
        "shared_fs": True,
        "ranks": [8, 15],
        "step": 3,
        "slowest_rank": None,
        "findings": 0,
    }
    assert "shared fs" in node_line(shared)
    from tunedeck.core.nodes.view import format_rows

    assert "connected+fs" in format_rows([shared])[1]
    assert "+fs" not in format_rows([dict(shared, shared_fs=False)])[1]
