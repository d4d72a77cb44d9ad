"""A finding whose summary grows with the run (LossWatch's "(12 steps)", "(40 steps)") is one
finding: run.db keeps one row for it, refined in place, and the monitor, `tunedeck diagnose`
and the trackers see it once. An older agent's run.db, which holds a version per refinement,
reads the same way, and the agent that opens it next goes on refining one row."""

from __future__ import annotations

import json
import sqlite3
import time

from tests.test_manage import make_run
from tunedeck.core.api import diagnose
from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.diagnose.loss import LossWatch
from tunedeck.core.rundir import RunDir
from tunedeck.core.store.store import Store
from tunedeck.core.supervisor.trackfeed import RunDbPoll
from tunedeck.core.views.watch import RunWatcher

# the findings table as agents before the `key` column wrote it
OLD_FINDINGS = """
CREATE TABLE findings (
    id INTEGER PRIMARY KEY,
    t REAL,
    category TEXT NOT NULL,
    severity TEXT NOT NULL,
    rank INTEGER,
    data TEXT NOT NULL,
    UNIQUE(category, rank, data)
)
"""


def _zero_steps(first: int, last: int, t0: float = 1000.0) -> list[dict]:
    return [
        {"kind": "step", "rank": 0, "step": s, "t": t0 + s, "loss": 2.0, "grad_norm": 0.0}
        for s in range(first, last + 1)
    ]


def _rows(run: RunDir) -> list[tuple[int, str]]:
    con = sqlite3.connect(run.db)
    try:
        return con.execute("SELECT id, data FROM findings ORDER BY id").fetchall()
    finally:
        con.close()


def test_zero_gradients_refined_every_step_are_one_finding_everywhere(tmp_path):
    run_dir = make_run(
        tmp_path / "runs", "20261210-010000-demo-1a1a", status="running", step=0, max_steps=100
    )
    run = RunDir(run_dir)
    store = Store(run, write=True)
    watch = LossWatch(str(run.event_file(0)))
    events = _zero_steps(1, 39)
    with open(run.event_file(0), "a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
            watch.feed([{k: e[k] for k in ("step", "loss", "grad_norm", "t")}])
            for found in watch.findings():  # as the agent's LossMonitor saves them
                found.node = 0
                store.save_finding(found)
    [(_, data)] = _rows(run)  # one row, not one per refinement
    assert json.loads(data)["summary"] == (
        "gradients are exactly 0 from step 1 (39 steps): nothing is training"
    )
    w = RunWatcher(run_dir)
    [shown] = w.poll(history=False).findings
    assert shown["summary"].startswith("gradients are exactly 0 from step 1 (39 steps)")
    # refined again: the monitor's next poll shows the new counts, still one finding
    for e in _zero_steps(40, 45):
        watch.feed([{k: e[k] for k in ("step", "loss", "grad_norm", "t")}])
    [found] = watch.findings()
    found.node = 0
    assert store.save_finding(found) and not store.save_finding(found)
    [shown] = w.poll(history=False).findings
    assert "(45 steps)" in shown["summary"]
    w.close()
    store.close()
    said = [f for f in diagnose([str(run_dir)]) if f.category == "loss_anomaly"]
    assert len(said) == 1 and "gradients are exactly 0 from step 1" in said[0].summary


def test_an_older_run_db_with_three_versions_reads_as_one_and_is_migrated(tmp_path):
    run = RunDir(tmp_path)
    con = sqlite3.connect(run.db)
    con.execute(OLD_FINDINGS)
    watch = LossWatch("events")
    versions = []
    for last in (12, 20, 31):  # what an older agent stored as the steps came
        watch.feed(
            [
                {"step": s, "loss": 2.0, "grad_norm": 0.0, "t": 1000.0 + s}
                for s in range(len(versions) and versions[-1] + 1 or 1, last + 1)
            ]
        )
        versions.append(last)
        [f] = watch.findings()
        f.node = 0
        con.execute(
            "INSERT INTO findings(t, category, severity, rank, data) VALUES (?,?,?,?,?)",
            (f.t, f.category, f.severity, -1, json.dumps(f.to_json(), sort_keys=True)),
        )
    other = Finding("ib_missing", "info", "no InfiniBand", "cause", "fix", t=5.0)
    con.execute(
        "INSERT INTO findings(t, category, severity, rank, data) VALUES (?,?,?,?,?)",
        (5.0, other.category, other.severity, -1, json.dumps(other.to_json())),
    )
    con.commit()
    con.close()
    # a viewer reads the file as it is (read-only: it migrates nothing)
    with Store(run) as viewer:
        found = viewer.findings()
        assert [f["category"] for f in found] == ["loss_anomaly", "ib_missing"]
        assert "(31 steps)" in found[0]["summary"]  # the newest version, at the first's place
        mark = viewer.findings_mark()
        assert mark is not None and viewer.findings_mark() == mark
    assert len(_rows(run)) == 4
    w = RunWatcher(tmp_path)
    assert [f["category"] for f in w._read_findings()] == ["loss_anomaly", "ib_missing"]
    # the next agent migrates the table and goes on refining the one row
    store = Store(run, write=True)
    rows = _rows(run)
    assert [i for i, _ in rows] == [1, 4] and "(31 steps)" in rows[0][1]
    watch.feed([{"step": s, "loss": 2.0, "grad_norm": 0.0} for s in range(32, 41)])
    [f] = watch.findings()
    f.node = 0
    assert store.save_finding(f) and not store.save_finding(f)
    assert store.save_finding(Finding("stall", "error", "no step for 60 s", "hang", "stacks"))
    rows = _rows(run)
    assert [i for i, _ in rows] == [1, 4, 5] and "(40 steps)" in rows[0][1]
    store.close()
    assert Store(run, write=True).findings() is not None  # opened again: nothing to migrate
    assert [f["summary"][:30] for f in read_all(run)] == [
        "gradients are exactly 0 from s",
        "no InfiniBand",
        "no step for 60 s",
    ]
    # the watcher that read the old file sees the refinement and the new finding
    shown = w._read_findings()
    assert len(shown) == 3 and any("(40 steps)" in f["summary"] for f in shown)
    w.close()


def read_all(run: RunDir) -> list[dict]:
    with Store(run) as viewer:
        return viewer.findings()


def test_trackers_get_a_refined_finding_once_and_a_new_one(tmp_path):
    run = RunDir(tmp_path)
    store = Store(run, write=True)
    poll = RunDbPoll(tmp_path)
    watch = LossWatch("events")
    watch.feed([{"step": s, "loss": 2.0, "grad_norm": 0.0, "t": time.time()} for s in range(1, 8)])
    for f in watch.findings():
        store.save_finding(f)
    notes = [v for kind, v in poll() if kind == "note"]
    assert [tag for tag, _ in notes] == ["finding/loss_anomaly"] and "(7 steps)" in notes[0][1]
    watch.feed([{"step": s, "loss": 2.0, "grad_norm": 0.0} for s in range(8, 30)])
    for f in watch.findings():
        assert store.save_finding(f)  # refined: stored again...
    assert [v for kind, v in poll() if kind == "note"] == []  # ...but no new note
    store.save_finding(Finding("stall", "error", "no step for 60 s", "hang", "stacks"))
    notes = [v for kind, v in poll() if kind == "note"]
    assert [tag for tag, _ in notes] == ["finding/stall"]
    store.close()


def test_the_loss_monitor_names_a_node_only_on_a_multi_node_run(tmp_path):
    """A one-node run's findings carry no node (the detail would say "node 0, rank 0" for
    nothing); node 1's agent of a two-node run stamps its own."""
    from tunedeck.core.monitoring import MonitorContext
    from tunedeck.core.spec import load_spec
    from tunedeck.core.supervisor.monitors import LossMonitor

    shown = {}
    for nnodes, node_rank in ((1, 0), (2, 1)):
        run_dir = make_run(
            tmp_path / f"runs{nnodes}",
            f"20261210-01000{nnodes}-demo-1a1a",
            status="running",
            step=0,
            max_steps=100,
        )
        run = RunDir(run_dir)
        spec = load_spec(run.spec)
        spec.cluster.nnodes, spec.cluster.node_rank = nnodes, node_rank
        store = Store(run, write=True)
        ctx = MonitorContext(
            run=run,
            spec=spec,
            store=store,
            node_rank=node_rank,
            rank_pids=dict,
            stopping=lambda: False,
            signal_ours=lambda *a: [],
        )
        mon = LossMonitor(ctx)
        rank = mon.rank
        mon.close([dict(e, rank=rank) for e in _zero_steps(1, 20)])
        [(_, data)] = _rows(run)
        shown[nnodes] = json.loads(data)
        store.close()
    assert shown[1]["category"] == shown[2]["category"] == "loss_anomaly"
    assert shown[1].get("node") is None
    assert shown[2]["node"] == 1
