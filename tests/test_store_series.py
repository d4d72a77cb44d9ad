"""run.db's numeric step series: a window of a run decimated to min/mean/max buckets in SQL,
the un-ingested tail of the files included, restarts resolved (the later attempt wins), and
run.db files from before the numeric tables still read."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.events import EventWriter
from tunedeck.core.store.store import TIERS, Store, _tier_sql

REPO = Path(__file__).resolve().parent.parent


def loss_at(step: int) -> float:
    return 2.0 + 1.0 / (1 + step / 100) + (step % 7) * 0.01


def write_attempt(
    run: RunDir,
    steps,
    rank: int = 0,
    loss=loss_at,
    start_step: int = 0,
    eval_every: int = 0,
    spike: dict | None = None,
) -> None:
    """Events the way the built-in trainer writes them (its EventWriter, its fields)."""
    w = EventWriter(run.path, rank)
    w.emit("start", world_size=1, max_steps=10**7, restart=0, start_step=start_step)
    for s in steps:
        value = (spike or {}).get(s, loss(s))
        w.emit(
            "step",
            step=s,
            loss=value,
            lr=1e-4 * (1 + s % 3),
            grad_norm=0.5,
            tokens=512,
            step_s=0.1,
            data_wait_s=0.001,
            compute_s=0.05,
            mem_gib=1.5,
            tokens_per_s=5120.0,
            epoch=0,
            mfu=None,
        )
        if eval_every and s % eval_every == 0:
            w.emit("eval", step=s, eval_loss=value - 0.5, eval_tokens=100)
    w.emit("end", step=steps[-1] if steps else 0, reason="completed", loss=None)
    w.close()


def ingest_all(run: RunDir) -> None:
    with Store(run, write=True) as agent:
        while agent.ingest():
            pass


def drop_numeric_tables(run: RunDir) -> None:
    """What a run.db written before the numeric tables looks like: events and offsets only."""
    db = sqlite3.connect(run.db)
    for table in ("steps", "evals", *(f"steps_{t}" for t in TIERS)):
        db.execute(f"DROP TABLE {table}")
    db.commit()
    db.close()


def same(a: dict, b: dict) -> bool:
    """Two series equal up to float summation order."""
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], list):
            assert a[k] == pytest.approx(b[k], rel=1e-12), k
        else:
            assert a[k] == b[k], k
    return True


def flat(series: dict, metric: str = "loss") -> dict[int, float]:
    """{bucket's first step: mean} of a one-step-per-bucket series."""
    return dict(zip(series["step"], series[metric]))


def test_series_matches_the_events_bucket_by_bucket(tmp_path):
    run = RunDir(tmp_path)
    write_attempt(run, list(range(1, 1001)), eval_every=100)
    ingest_all(run)
    with Store(run) as viewer:
        s = viewer.step_series(0, buckets=10, metrics=("loss", "lr", "grad_norm"))
        assert (s["first"], s["last"], s["start"], s["end"]) == (1, 1000, 1, 1000)
        assert 7.5 <= len(s["step"]) <= 11 and sum(s["n"]) == 1000
        assert s["nan"] == [0] * len(s["step"])
        for i, (lo, hi) in enumerate(zip(s["step"], s["step_max"])):
            values = [loss_at(k) for k in range(lo, hi + 1)]
            assert s["n"][i] == len(values)
            assert s["loss_min"][i] == pytest.approx(min(values))
            assert s["loss_max"][i] == pytest.approx(max(values))
            assert s["loss"][i] == pytest.approx(sum(values) / len(values))
        assert s["lr_min"][0] == pytest.approx(1e-4) and s["lr_max"][0] == pytest.approx(3e-4)
        assert s["grad_norm"] == pytest.approx([0.5] * len(s["step"]))
        # a window: only its steps, one bucket per step when there are fewer steps than buckets
        w = viewer.step_series(0, start=500, end=509, buckets=100)
        assert w["step"] == list(range(500, 510)) and w["width"] == 1
        assert w["loss"] == pytest.approx([loss_at(k) for k in range(500, 510)])
        e = viewer.eval_series(0, buckets=100)
        assert e["step"] == list(range(100, 1001, 100))
        assert e["eval_loss"] == pytest.approx([loss_at(k) - 0.5 for k in range(100, 1001, 100)])
        assert viewer.step_range(0) == (1, 1000) and viewer.step_range(3) is None
        with pytest.raises(ValueError):
            viewer.step_series(0, metrics=("nope",))


@pytest.mark.parametrize("buckets,tier", [(2, 4096), (40, 64), (300, None)])
def test_one_spike_survives_any_decimation(tmp_path, buckets, tier):
    """Over 20k steps, 2 buckets read the 4096-step rollup, 40 the 64-step one, 300 the rows:
    each keeps the one step whose loss is 40 in the bucket that holds it, and the counts, means
    and minima are those of the steps in each bucket."""
    run = RunDir(tmp_path)
    write_attempt(run, list(range(1, 20001)), spike={12345: 40.0})
    ingest_all(run)
    with Store(run) as viewer:
        s = viewer.step_series(0, buckets=buckets)
        used = max((t for t in TIERS if s["width"] % t == 0 and s["width"] >= 2 * t), default=None)
        assert used == tier
        assert sum(s["n"]) == 20000 and len(s["step"]) <= buckets + 1
        i = max(range(len(s["step"])), key=lambda k: s["loss_max"][k])
        assert s["loss_max"][i] == 40.0 and s["step"][i] <= 12345 <= s["step_max"][i]
        others = [v for k, v in enumerate(s["loss_max"]) if k != i]
        assert max(others) < 4.0
        for k, (lo, hi) in enumerate(zip(s["step"], s["step_max"])):
            values = [40.0 if j == 12345 else loss_at(j) for j in range(lo, hi + 1)]
            assert s["n"][k] == len(values)
            assert s["loss"][k] == pytest.approx(sum(values) / len(values))
            assert s["loss_min"][k] == pytest.approx(min(values))
        # zoomed into the spike: the same value, and the steps around it
        z = viewer.step_series(0, start=12340, end=12350, buckets=max(buckets, 11))
        assert flat(z)[12345] == 40.0 and len(z["step"]) == 11
    blocks_match_steps(run)


@pytest.mark.parametrize("buckets", [3, 20])
def test_a_window_that_cuts_blocks_counts_every_step_once(tmp_path, buckets):
    """The window's ragged edges: 4096-blocks inside, 64-blocks and single rows at the
    edges (3 buckets), or 64-blocks and rows (20): every step counted once."""
    run = RunDir(tmp_path)
    write_attempt(run, list(range(0, 30000)))
    ingest_all(run)
    with Store(run) as viewer:
        s = viewer.step_series(0, start=1001, end=28999, buckets=buckets)
        assert s["width"] % (4096 if buckets == 3 else 64) == 0
        assert sum(s["n"]) == 28999 - 1001 + 1
        assert min(s["step"]) == 1001 and max(s["step_max"]) == 28999
        for k, (lo, hi) in enumerate(zip(s["step"], s["step_max"])):
            values = [loss_at(j) for j in range(lo, hi + 1)]
            assert s["n"][k] == len(values)
            assert s["loss"][k] == pytest.approx(sum(values) / len(values))
            assert s["loss_max"][k] == pytest.approx(max(values))


def test_nan_losses_are_counted_not_averaged(tmp_path):
    run = RunDir(tmp_path)
    write_attempt(run, list(range(1, 11)), spike={5: float("nan")})  # written as null
    assert '"loss": null' in run.event_file(0).read_text()
    ingest_all(run)
    with Store(run) as viewer:
        s = viewer.step_series(0, buckets=1)
        assert s["n"] == [10] and s["nan"] == [1]
        assert s["loss_max"][0] == pytest.approx(max(loss_at(k) for k in range(1, 11) if k != 5))


def restarted_run(run: RunDir) -> None:
    """Attempt 1 reaches step 150 (evals at 50, 100, 150), dies; attempt 2 resumes from the
    checkpoint at 100 and has reached 130 so far, with another loss."""
    write_attempt(run, list(range(1, 151)), loss=lambda s: 1.0, eval_every=50)
    write_attempt(run, list(range(101, 131)), loss=lambda s: 2.0, start_step=100, eval_every=10)


def check_restarted(viewer: Store) -> None:
    s = viewer.step_series(0, buckets=1000)
    got = flat(s)
    assert sorted(got) == list(range(1, 131))  # 131..150 were the dead attempt's
    assert all(got[k] == 1.0 for k in range(1, 101))
    assert all(got[k] == 2.0 for k in range(101, 131))
    assert viewer.step_range(0) == (1, 130)
    e = viewer.eval_series(0, buckets=1000)
    assert flat(e, "eval_loss") == {50: 0.5, 100: 0.5, 110: 1.5, 120: 1.5, 130: 1.5}


def test_a_restart_repeating_steps_the_later_attempt_wins(tmp_path):
    run = RunDir(tmp_path)
    restarted_run(run)
    # the reader alone, before the agent ingested anything: all of it from the files
    with Store(run) as viewer:
        check_restarted(viewer)
    ingest_all(run)
    with Store(run) as viewer:
        check_restarted(viewer)
        # the block path: the same rule
        assert sum(viewer.step_series(0, buckets=1)["n"]) == 130
    blocks_match_steps(run)


def test_a_restart_split_between_run_db_and_the_tail(tmp_path):
    """The agent ingested attempt 1; attempt 2 is only in the file so far."""
    run = RunDir(tmp_path)
    write_attempt(run, list(range(1, 151)), loss=lambda s: 1.0, eval_every=50)
    ingest_all(run)
    write_attempt(run, list(range(101, 131)), loss=lambda s: 2.0, start_step=100, eval_every=10)
    with Store(run) as viewer:
        check_restarted(viewer)
        ingest_all(run)  # the agent catches up while the viewer stays open
        check_restarted(viewer)


def blocks_match_steps(run: RunDir) -> None:
    """The rollups the writer keeps incrementally equal the steps aggregated afresh: every
    closed block (the one holding a rank's newest step is still open, and not written)."""
    db = sqlite3.connect(run.db)
    rows = 0
    for size in TIERS:
        kept = db.execute(f"SELECT * FROM steps_{size} ORDER BY rank, block").fetchall()
        db.execute(f"DELETE FROM steps_{size}")
        for rank, last in db.execute("SELECT rank, MAX(step) FROM steps GROUP BY rank").fetchall():
            db.execute(_tier_sql(size), (rank, 0, last // size * size - 1))
        fresh = db.execute(f"SELECT * FROM steps_{size} ORDER BY rank, block").fetchall()
        db.rollback()
        assert len(kept) == len(fresh)
        for a, b in zip(kept, fresh):
            assert a == pytest.approx(b, rel=1e-12)
        rows += len(kept)
    db.close()
    assert rows > 0


def test_ingest_in_small_pieces_gives_the_same_series(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    restarted_run(run)
    monkeypatch.setattr(Store, "INGEST_BYTES", 2000)  # a restart catching up over ticks
    agent = Store(run, write=True)
    with Store(run) as viewer:
        while agent.ingest():
            check_restarted(viewer)  # whatever part is in run.db, the rest from the tail
            agent.close()  # and the agent restarts between ticks: the open
            agent = Store(run, write=True)  # block is read back from run.db
    agent.close()
    with Store(run) as viewer:
        check_restarted(viewer)
    blocks_match_steps(run)


def test_a_restart_from_scratch_replaces_everything(tmp_path):
    run = RunDir(tmp_path)
    write_attempt(run, list(range(1, 51)), loss=lambda s: 1.0)
    ingest_all(run)
    write_attempt(run, list(range(1, 21)), loss=lambda s: 3.0)
    ingest_all(run)
    with Store(run) as viewer:
        got = flat(viewer.step_series(0, buckets=100))
        assert got == {k: 3.0 for k in range(1, 21)}


def test_viewer_sees_the_tail_and_never_counts_a_step_twice(tmp_path):
    run = RunDir(tmp_path)
    write_attempt(run, list(range(1, 101)))
    agent = Store(run, write=True)
    agent.ingest()
    with Store(run) as viewer:
        assert sum(viewer.step_series(0, buckets=7)["n"]) == 100
        w = EventWriter(run.path, 0)
        for s in range(101, 161):
            w.emit("step", step=s, loss=loss_at(s))
        w.close()
        s = viewer.step_series(0, buckets=7)
        assert sum(s["n"]) == 160 and s["last"] == 160
        agent.ingest()  # now in run.db: the viewer's tail must drop it
        assert sum(viewer.step_series(0, buckets=7)["n"]) == 160
        w = EventWriter(run.path, 0)
        w.emit("step", step=161, loss=9.0)
        w.close()
        s = viewer.step_series(0, start=150, end=170, buckets=100)
        assert flat(s)[161] == 9.0 and sum(s["n"]) == 12
    agent.close()


def test_old_run_db_reads_the_same_and_the_agent_fills_the_tables(tmp_path):
    run = RunDir(tmp_path)
    restarted_run(run)
    write_attempt(run, list(range(1, 41)), rank=1)
    ingest_all(run)
    with Store(run) as viewer:
        new = viewer.step_series(0, buckets=17, metrics=("loss", "lr"))
    drop_numeric_tables(run)
    with Store(run) as viewer:  # no numeric tables: the same series from the JSON blobs
        check_restarted(viewer)
        assert same(viewer.step_series(0, buckets=17, metrics=("loss", "lr")), new)
        assert viewer.step_range(1) == (1, 40)
    with Store(run, write=True):  # the agent opens it: the tables are built from the events
        pass
    db = sqlite3.connect(run.db)
    assert db.execute("SELECT COUNT(*) FROM steps WHERE rank = 0").fetchone()[0] == 130
    assert db.execute("SELECT COUNT(*) FROM evals WHERE rank = 0").fetchone()[0] == 5
    db.close()
    with Store(run) as viewer:
        check_restarted(viewer)
        assert same(viewer.step_series(0, buckets=17, metrics=("loss", "lr")), new)


def test_recorded_h200_run_db_without_events_tables(tmp_path):
    """The recorded fixtures' run.db holds only findings and telemetry: the series comes from
    the event files."""
    src = REPO / "tests" / "fixtures" / "h200" / "slow_rank"
    shutil.copytree(src, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    steps = [json.loads(x) for x in run.event_file(0).read_text().splitlines()]
    steps = [e for e in steps if e["kind"] == "step"]
    with Store(run) as viewer:
        s = viewer.step_series(0, buckets=1000, metrics=("loss", "tokens_per_s"))
        assert s["step"] == [e["step"] for e in steps]
        assert s["loss"] == pytest.approx([e["loss"] for e in steps])
        assert viewer.step_range(1)[1] == max(
            json.loads(x).get("step") or 0 for x in run.event_file(1).read_text().splitlines()
        )


def test_no_run_db_yet(tmp_path):
    run = RunDir(tmp_path)
    write_attempt(run, list(range(1, 11)))
    assert not run.db.exists()
    with Store(run) as viewer:
        assert sum(viewer.step_series(0)["n"]) == 10
        ingest_all(run)  # run.db appears: read against its offsets from now on
        assert sum(viewer.step_series(0)["n"]) == 10
        assert viewer.step_series(2)["first"] is None


def test_rollups_across_restarts_and_agent_lives(tmp_path, monkeypatch):
    """A restart that lands before a closed 4096-step block, ingested a few hundred events at
    a time by an agent that itself restarts between ticks: the rollups stay exact and every
    window reads the later attempt's steps."""
    run = RunDir(tmp_path)
    write_attempt(run, list(range(1, 9001)), loss=lambda s: 1.0 + s % 5)
    write_attempt(run, list(range(3001, 10001)), loss=lambda s: 2.0 + s % 3, start_step=3000)
    monkeypatch.setattr(Store, "INGEST_BYTES", 150_000)
    ticks = 0
    while True:
        with Store(run, write=True) as agent:
            if not agent.ingest():
                break
        ticks += 1
    assert ticks >= 3
    blocks_match_steps(run)
    expect = {s: (1.0 + s % 5 if s <= 3000 else 2.0 + s % 3) for s in range(1, 10001)}
    with Store(run) as viewer:
        for buckets in (1, 3, 30, 10_000):
            s = viewer.step_series(0, buckets=buckets)
            assert sum(s["n"]) == 10_000
            for k, (lo, hi) in enumerate(zip(s["step"], s["step_max"])):
                values = [expect[j] for j in range(lo, hi + 1)]
                assert s["loss"][k] == pytest.approx(sum(values) / len(values))
                assert (s["loss_min"][k], s["loss_max"][k]) == (min(values), max(values))


@pytest.mark.parametrize("end", [None, 10**6])
def test_the_open_block_is_read_from_finer_parts(tmp_path, end):
    """8192 steps end exactly on a 4096 block: that last block is still open (the agent writes
    a block once the steps move past it), so a reader covers it with finer parts."""
    run = RunDir(tmp_path)
    write_attempt(run, list(range(0, 8192)))
    ingest_all(run)
    with Store(run) as viewer:
        s = viewer.step_series(0, end=end, buckets=1)
        assert s["width"] % 4096 == 0 and sum(s["n"]) == 8192
        assert s["loss"][0] == pytest.approx(sum(loss_at(k) for k in range(8192)) / 8192)
