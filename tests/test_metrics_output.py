"""`tunedeck metrics` prints exactly what it printed before it read run.db's columns
(tests/data/metrics_golden.json, captured from that release): on the recorded runs and log
folders, and on synthetic runs (tests/metrics_cases.py) ingested by today's agent Store."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from metrics_cases import FIXTURE_REFS, REPO, make_runs

GOLDEN = json.loads((REPO / "tests" / "data" / "metrics_golden.json").read_text())


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return make_runs(tmp_path_factory.mktemp("metrics-cases"))


def metrics(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tunedeck.cli", "metrics", *args],
        capture_output=True,
        cwd=REPO,
        timeout=120,
    )


def check(name: str, path) -> None:
    for mode in ("json", "text"):
        p = metrics(str(path), *(["--json"] if mode == "json" else []))
        want = GOLDEN[name][mode]
        assert p.returncode == want["rc"], p.stderr.decode()
        got = hashlib.sha256(p.stdout).hexdigest()
        assert (got, len(p.stdout)) == (want["sha256"], want["bytes"]), (
            f"{name} {mode}: output differs from the pinned one\n{p.stdout[:2000].decode()}"
        )


@pytest.mark.parametrize("ref", FIXTURE_REFS)
def test_metrics_output_unchanged_on_fixtures(ref):
    check(ref, REPO / ref)


@pytest.mark.parametrize("case", ["restart", "files_only", "old_db", "wide"])
def test_metrics_output_unchanged_on_synthetic_runs(synthetic, case):
    check(f"synthetic:{case}", synthetic[case])


def _row(step, /, **over):
    row = dict(
        step=step,
        t=1764632952.123456 + step,
        loss=2.0 + 1 / (step + 3),
        lr=1e-05,
        grad_norm=0.30000000000000004,
        tokens_per_s=13653.0,
        step_s=0.6,
        epoch=step // 3,
        tokens=8192,
        data_wait_s=1e-4,
        mem_gib=61.3,
        max_steps=1000,
        loss_nan=None,
    )
    row.update(over)
    return tuple(row.values())


def test_native_step_text_is_the_python_text():
    """The native writer of full step rows prints what the Python format prints (float
    repr of every awkward kind) and stops at the first row Python must read."""
    from tunedeck.core.ingest.native import fastscan
    from tunedeck.core.views.metrics import _rendered

    if fastscan is None:
        pytest.skip("native module not built")
    odd = [1e-05, 1e16, 1.5e300, -0.0, 5e-324, 123456789.0, 0.1 + 0.2, 2**53 + 1.0, -7]
    rows = [
        _row(s, loss=odd[s % len(odd)], epoch=2**40 + s, max_steps=None if s % 2 else 9)
        for s in range(1, 40)
    ]
    # a column repeating a value (the writer reuses its text) or flipping between 0.0 and -0.0
    rows += [
        _row(s, loss=[0.0, -0.0, -0.0, 0.0, 1e-05, 1e-05][s % 6], mem_gib=61.3)
        for s in range(40, 52)
    ]
    for rank in (0, 1023):
        text, nxt = fastscan.step_text(rows, 0, 1 << 62, rank, False)
        assert nxt == len(rows)
        assert text == ",\n".join(_rendered(rank, r) for r in rows)
        text, nxt = fastscan.step_text(rows, 5, 1 << 62, rank, False)
        assert (text, nxt) == (",\n".join(_rendered(rank, r) for r in rows[5:]), len(rows))
    # each row Python must read stops it there, with the rows before it written
    for bad in (
        dict(t=None),
        dict(mem_gib=None),
        dict(loss_nan=1),
        dict(loss=float("nan")),
        dict(lr="0.1"),
        dict(max_steps=2.0),
        dict(tokens=True),
        dict(step=2**70),
    ):
        rs = rows[:3] + [_row(4, **bad)] + rows[4:]
        text, nxt = fastscan.step_text(rs, 0, 1 << 62, 0, False)
        assert (text, nxt) == (",\n".join(_rendered(0, r) for r in rows[:3]), 3), bad
    assert fastscan.step_text(rows, 0, 4, 0, False)[1] == 3  # steps from 4 on: Python's
    # max_steps wanted: step 1 lacks it, step 2 has it, step 3 lacks it
    assert fastscan.step_text(rows, 0, 1 << 62, 0, True) == ("", 0)
    assert fastscan.step_text(rows, 1, 1 << 62, 0, True) == (_rendered(0, rows[1]), 2)
    assert fastscan.step_text([], 0, 1 << 62, 0, False) == ("", 0)


def test_native_float_text_is_repr():
    """The native writer's float text (Grisu3, Python's dtoa only where Grisu3 is unsure) is
    repr's on random doubles of every exponent, the values a trainer logs, and the powers of
    two and ten with their neighbours (the uneven gaps); and Grisu3 decides nearly all."""
    import math
    import random
    import struct

    from tunedeck.core.ingest.native import fastscan

    if fastscan is None:
        pytest.skip("native module not built")
    rng = random.Random(32)
    xs = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(100_000)]
    xs += [rng.random() * 10 ** rng.randint(-8, 8) for _ in range(100_000)]
    xs += [rng.randint(0, 10**12) / 10 ** rng.randint(0, 12) for _ in range(50_000)]
    for e in range(-1074, 1024):
        xs.append(math.ldexp(1.0, e))
    for k in range(-323, 309):
        xs.append(float(f"1e{k}"))
    xs += [
        y for x in xs[-(2098 + 632) :] for y in (math.nextafter(x, 0), math.nextafter(x, math.inf))
    ]
    xs += [0.0, -0.0, 5e-324, 1.7976931348623157e308, 9.999999999999999e22, 2**53 + 1.0]
    xs = [x for x in xs if math.isfinite(x)]
    xs += [-x for x in xs[:1000]]
    unsure = 0
    for x in xs:
        fast = fastscan.float_text(x, True)
        if fast is None:
            unsure += 1
            fast = fastscan.float_text(x)
        assert fast == repr(x), (repr(x), fast)
    assert unsure < len(xs) // 100
    assert fastscan.float_text(9.999999999999999e22, True) is None  # 1e+23: Grisu3 unsure


@pytest.mark.parametrize("case", ["restart", "files_only", "old_db", "wide"])
def test_metrics_json_same_with_and_without_native_writer(synthetic, case, monkeypatch):
    import io

    from tunedeck.core.views import metrics as m

    def dump() -> str:
        out = io.StringIO()
        recs = m.iter_records(synthetic[case], text=True)
        m.write_json(recs, out, plain=recs.plain)
        return out.getvalue()

    native = dump()
    monkeypatch.setattr(m, "fastscan", None)
    assert dump() == native


def _gapped_run(path, steps: int):
    """Rank 0 logs every 10th step (its rows are not one contiguous span), rank 1 every 5th
    with an eval of its own and two steps past rank 0's last."""
    from tunedeck.core.rundir import RunDir
    from tunedeck.core.rundir.events import EventWriter
    from tunedeck.core.store.store import Store

    run = RunDir(path)
    for rank, every in ((0, 10), (1, 5)):
        w = EventWriter(run.path, rank)
        w.emit("start", world_size=2, max_steps=steps + 10, restart=0, start_step=0)
        last = steps + (10 if rank else 0)
        for s in range(every, last + 1, every):
            w.emit(
                "step",
                step=s,
                loss=2.0 + rank + 1 / s,
                lr=1e-4,
                grad_norm=0.5,
                tokens=512,
                step_s=0.1,
                data_wait_s=0.001,
                mem_gib=1.5,
                tokens_per_s=5120.0,
                epoch=0,
            )
            if rank and s % 1000 == 5:
                w.emit("eval", step=s, eval_loss=1.0)
        w.close()
    with Store(run, write=True) as agent:
        while agent.ingest():
            pass
    return run


def test_last_n_reads_only_the_end_of_a_run_with_gaps(tmp_path, monkeypatch):
    """`--last N` on a run whose lead logs every 10th step: the last N records of the whole
    output, at a cost that does not grow with the run (SQLite's VM steps counted)."""
    from tunedeck.core.views import metrics as m
    from tunedeck.core.store.store import Store

    ops = [0]
    opened = Store._reader

    def counting(self):
        db = opened(self)
        if db is not None:

            def tick() -> int:
                ops[0] += 1
                return 0

            db.set_progress_handler(tick, 100)
        return db

    cost = {}
    for steps in (2_000, 40_000):
        run = _gapped_run(tmp_path / str(steps), steps)
        whole = list(m.iter_records(run.path))
        for n in (1, 3, 7):
            assert list(m.iter_records(run.path, last=n)) == whole[-n:]
        monkeypatch.setattr(Store, "_reader", counting)
        ops[0] = 0
        assert list(m.iter_records(run.path, last=5)) == whole[-5:]
        cost[steps] = ops[0]
        monkeypatch.setattr(Store, "_reader", opened)
    assert cost[40_000] < 3 * cost[2_000], cost


def _varying_run(path, steps: int):
    """Three ranks whose every field varies by step and rank, with what a merge must mend: the
    lead (rank 0) skips some steps, lacks mem_gib at some and logs a NaN loss; rank 1 runs 7
    steps ahead with evals the lead lacks, lacks grad_norm at some steps and logs NaN losses
    (the merge puts the lead's keys it lacks last); rank 2 logs every 3rd step under another
    max_steps."""
    import math

    from tunedeck.core.rundir import RunDir
    from tunedeck.core.rundir.events import EventWriter
    from tunedeck.core.store.store import Store

    run = RunDir(path)
    for rank in (0, 1, 2):
        w = EventWriter(run.path, rank)
        w.emit("start", world_size=3, max_steps=steps + 10 * rank, restart=0, start_step=0)
        for s in range(1, steps + (8 if rank == 1 else 1)):
            if (rank == 0 and s % 1111 == 0) or (rank == 2 and s % 3):
                continue
            h = (s * 2654435761 + rank * 40503) % 1000003 / 1000003.0
            fields = dict(
                step=s,
                loss=2.0 + 1 / (1 + s / 500) + 0.05 * (h - 0.5),
                lr=1e-4 * 0.5 * (1 + math.cos(math.pi * s / steps)),
                grad_norm=0.5 + 0.3 * h,
                tokens=7000 + int(1192 * h),
                step_s=0.55 + 0.1 * h,
                data_wait_s=0.002 + 0.004 * ((h * 7) % 1),
                mem_gib=61.0 + 0.6 * ((h * 13) % 1),
                tokens_per_s=(7000 + int(1192 * h)) / (0.55 + 0.1 * h),
                epoch=s // 1000,
            )
            if rank == 0 and s % 97 == 0:
                del fields["mem_gib"]
            if rank == 1 and s % 89 == 0:  # the merge moves the lead's grad_norm last
                del fields["grad_norm"]
            if (rank, s) in ((0, 500), (1, 601), (1, 8999)):
                fields["loss"] = float("nan")
            w.emit("step", **fields)
            if (rank == 0 and s % 1000 == 0) or (rank == 1 and s % 1500 == 0):
                w.emit("eval", step=s, eval_loss=1.5 + h)
        w.close()
    with Store(run, write=True) as agent:
        while agent.ingest():
            pass
    return run


def test_metrics_json_on_varying_ranks_is_the_documented_merge(tmp_path, monkeypatch):
    """On a multi-rank run whose every field varies, `tunedeck metrics RUN --json` (the SQL
    stream, the native writer) prints what core/views/metrics.py's docstring promises: per
    step, the lowest rank's record with what it lacks filled from the next ranks in order,
    keys in the same order, as json.dump(indent=2) prints the list (a NaN loss as null)."""
    import io

    from tunedeck.core.ingest.metrics import MetricsParser, merge_by_step
    from tunedeck.core.views import metrics as m

    steps = 9000  # over two 4096-row batches of the stream
    run = _varying_run(tmp_path / "vary", steps)
    per_rank = []
    for rank in (0, 1, 2):
        parser = MetricsParser(rank)
        lines = run.event_file(rank).read_text().splitlines()
        parser.feed_dicts([json.loads(ln) for ln in lines])
        per_rank.append(parser.records())
    merged: dict[int, dict] = {}
    for recs in per_rank:  # lowest rank first: its values win, the next fill what it lacks
        for r in recs:
            cur = merged.get(r["step"])
            merged[r["step"]] = dict(r) if cur is None else {**r, **cur}
    want = [m.json_safe(merged[s]) for s in sorted(merged)]
    assert want == [m.json_safe(r) for r in merge_by_step(per_rank)]
    # the case is what it claims: merged steps, filled keys, other ranks' evals and steps
    assert len(want) == steps + 7 and want[1110]["rank"] == 1 and want[-1]["rank"] == 1
    assert "mem_gib" in want[96] and want[96]["rank"] == 0 and want[499]["loss"] is None
    assert "eval_loss" in want[1499] and want[1499]["rank"] == 0
    assert list(want[88])[-1] == "grad_norm" and list(want[600])[-2:] == ["loss", "max_steps"]
    text = json.dumps(want, indent=2) + "\n"

    p = metrics(str(run.path), "--json")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode() == text
    for native in (True, False):
        if not native:
            monkeypatch.setattr(m, "fastscan", None)
        out = io.StringIO()
        recs = m.iter_records(run.path, text=True)
        m.write_json(recs, out, plain=recs.plain)
        assert out.getvalue() == text, native
    assert list(m.iter_records(run.path, since=4000, every=7)) == [
        r for r in want if r["step"] >= 4000 and r["step"] % 7 == 0
    ]
