"""Run directories whose `tunedeck metrics` output is pinned (tests/data/metrics_golden.json,
captured from the release before metrics read run.db's columns): restarts, NaN and missing
losses, evals, ints kept as ints, keys only a later rank has, steps only a later rank has,
lines that are not events, a run.db from before the numeric tables, part ingested and part
still only in the files. Deterministic: the same bytes every time."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# the recorded runs and log folders `metrics` reads today (run directories and files)
FIXTURE_REFS = [
    *(
        f"tests/fixtures/h200/{n}"
        for n in (
            "hung_rank",
            "loader_killed",
            "loader_killed_hang",
            "rank_killed",
            "slow_rank",
            "starved_loader",
        )
    ),
    *(f"tests/fixtures/cpu/{n}" for n in ("ok", "nan", "crash", "two_node_ok", "sigkill")),
    "tests/fixtures/cpu/swift_flag/console.log",
]


def _line(**e) -> str:
    return json.dumps(e) + "\n"


def _rank_lines(rank: int, variant: int) -> list[str]:
    t = 1.7e9 + rank * 0.01
    out = [_line(t=t, kind="start", rank=rank, world_size=3, max_steps=50, restart=0, start_step=0)]
    for s in range(1, 31):
        e = {
            "t": t + s,
            "kind": "step",
            "rank": rank,
            "step": s,
            "loss": round(2.5 - s * 0.03 + rank * 1e-3, 6),
            "lr": 1e-4 * s,
            "grad_norm": 0.5 + (s % 5) * 0.1,
            "tokens": 1000 + s,
            "step_s": 0.25,
            "data_wait_s": 0.01 * (s % 3),
            "compute_s": 0.1,
            "mem_gib": 3.5 + rank,
            "tokens_per_s": 4000 + s if s % 2 else 4000.5 + s,
            "epoch": s // 12,
            "mfu": None,
        }
        if s == 7:
            e["loss"] = None  # a NaN written as null
        if s == 9 and rank == 0:
            del e["loss"]  # no loss at all
            del e["mem_gib"]  # rank 1 fills it
        if s == 11:
            e["lr"] = "bad"  # not a number: left out
        if s == 12:
            e["grad_norm"] = True  # a bool is not a number
        out.append(_line(**e))
        if s % 10 == 0:
            out.append(
                _line(
                    t=t + s + 0.5,
                    kind="eval",
                    rank=rank,
                    step=s,
                    eval_loss=2.0 - s * 0.01,
                    eval_tokens=500,
                )
            )
        if s == 20 and rank == 0:
            out.append(
                _line(
                    t=t + s + 0.6, kind="checkpoint", rank=0, step=20, path="/tmp/out/checkpoint-20"
                )
            )
    out.append("not json at all\n")
    out.append("[1, 2, 3]\n")
    out.append(_line(t=t + 40, kind="step", rank=rank, step=5.0, loss=9.9))  # float step
    # a restart from the checkpoint at step 20, with a new max_steps
    out.append(
        _line(
            t=t + 50, kind="start", rank=rank, world_size=3, max_steps=60, restart=1, start_step=20
        )
    )
    last = 40 if rank == 0 else 42 + variant  # rank 1 goes further
    for s in range(21, last + 1):
        if rank == 0 and s == 33:
            continue  # a step only the others have
        out.append(
            _line(
                t=t + 50 + s,
                kind="step",
                rank=rank,
                step=s,
                loss=1.5 - s * 0.01,
                lr=2e-4,
                grad_norm=0.25,
                tokens=900,
                step_s=0.5,
                data_wait_s=0.0,
                compute_s=0.2,
                mem_gib=4.0,
                tokens_per_s=1800,
                epoch=2,
                mfu=0.3,
            )
        )
        if s == 30:
            out.append(_line(t=t + 50 + s + 0.5, kind="eval", rank=rank, step=s, eval_loss=1.4))
    out.append(_line(t=t + 200, kind="end", rank=rank, step=last, reason="completed", loss=1.1))
    return out


def make_runs(root: Path) -> dict[str, Path]:
    """The synthetic run directories, by case name."""
    from tunedeck.core.store.store import Store

    root.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Path] = {}

    # 1. three ranks; run.db holds the first 40 lines of each file, the rest only the files
    run = root / "restart"
    (run / "events").mkdir(parents=True)
    lines = {r: _rank_lines(r, 0) for r in range(3)}
    for r, ls in lines.items():
        (run / "events" / f"rank{r}.jsonl").write_text("".join(ls[:40]))
    with Store(run, write=True) as store:
        while store.ingest():
            pass
    for r, ls in lines.items():
        with open(run / "events" / f"rank{r}.jsonl", "a") as f:
            f.write("".join(ls[40:]))
    runs["restart"] = run

    # 2. files only (no agent ever ran)
    run = root / "files_only"
    (run / "events").mkdir(parents=True)
    for r in range(2):
        (run / "events" / f"rank{r}.jsonl").write_text("".join(_rank_lines(r, 1)))
    runs["files_only"] = run

    # 3. a run.db written before the numeric tables (events and offsets only), all ingested
    #    but rank 1's last lines
    run = root / "old_db"
    (run / "events").mkdir(parents=True)
    db = sqlite3.connect(run / "run.db")
    db.executescript(
        "CREATE TABLE events (id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, "
        "kind TEXT NOT NULL, step INTEGER, t REAL, data TEXT NOT NULL);"
        "CREATE TABLE offsets (file TEXT PRIMARY KEY, offset INTEGER NOT NULL);"
    )
    for r in range(2):
        ls = _rank_lines(r, 0)
        (run / "events" / f"rank{r}.jsonl").write_text("".join(ls))
        keep = ls if r == 0 else ls[:-5]
        for ln in keep:
            try:
                e = json.loads(ln)
            except ValueError:
                continue
            if not isinstance(e, dict):
                continue
            step = e.get("step")
            db.execute(
                "INSERT INTO events(rank, kind, step, t, data) VALUES (?,?,?,?,?)",
                (
                    r,
                    e["kind"],
                    int(step) if isinstance(step, (int, float)) else None,
                    e["t"],
                    json.dumps(e, separators=(",", ":")),
                ),
            )
        db.execute(
            "INSERT INTO offsets VALUES (?, ?)",
            (f"rank{r}.jsonl", sum(len(x.encode()) for x in keep)),
        )
    db.commit()
    db.close()
    runs["old_db"] = run

    # 4. sixteen ranks of five steps; rank 0 lacks step 3 and starts late
    run = root / "wide"
    (run / "events").mkdir(parents=True)
    for r in range(16):
        body = [_line(t=1.7e9, kind="start", rank=r, world_size=16, max_steps=5)]
        for s in range(1 if r else 2, 6):
            if r == 0 and s == 3:
                continue
            body.append(
                _line(
                    t=1.7e9 + s,
                    kind="step",
                    rank=r,
                    step=s,
                    loss=1.0 + r / 100,
                    lr=1e-3,
                    grad_norm=1.0,
                    tokens=10 * r,
                    step_s=0.1,
                    data_wait_s=0.0,
                    mem_gib=float(r),
                    tokens_per_s=100 * r,
                    epoch=0,
                )
            )
        (run / "events" / f"rank{r}.jsonl").write_text("".join(body))
    with Store(run, write=True) as store:
        while store.ingest():
            pass
    runs["wide"] = run
    return runs
