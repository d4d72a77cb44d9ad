"""The median stopping rule of a sweep: once past `median_after` steps, a run whose recent
loss is worse than the median of its siblings' at the same step (each sibling that reached
it, at least MIN_SIBLINGS) is stopped gracefully (checkpoint and all) through its own
stop.json, which says why. A NaN or infinite loss counts as worse than any number.

The siblings are the runs the sweep file lists (core/sweep); their losses are read from
their run.db files (read-only, a few rows each), every CHECK_S."""

from __future__ import annotations

import logging
import math
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

from tunedeck.core.paths import home
from tunedeck.core.rundir import RunDir, read_json, write_json_atomic

log = logging.getLogger("tunedeck.stoprule")

CHECK_S = 3.0
WINDOW = 5  # steps averaged: one step's loss is noise
MIN_SIBLINGS = 2


def sweep_file(sweep_id: str) -> Path:
    return home() / "sweeps" / f"{sweep_id}.json"


def recent_loss(db: Path, step: int | None = None) -> tuple[int, float] | None:
    """(newest step ≤ `step`, mean loss of rank 0's last WINDOW steps to it); inf when one
    of them is NaN. None when the run has no step there yet."""
    if not db.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2.0)
    except sqlite3.Error:
        return None
    try:
        rows = con.execute(
            "SELECT step, loss, loss_nan FROM steps WHERE rank = 0 AND step <= ? "
            "ORDER BY step DESC LIMIT ?",
            (step if step is not None else 1 << 62, WINDOW),
        ).fetchall()
    except sqlite3.Error:
        return None
    finally:
        con.close()
    if not rows:
        return None
    losses = [math.inf if nan or loss is None else float(loss) for _, loss, nan in rows]
    value = sum(losses) / len(losses)
    return rows[0][0], value if math.isfinite(value) else math.inf


class MedianRule:
    def __init__(self, run: RunDir, sweep: dict[str, Any] | None):
        self.run = run
        self.sweep = sweep or {}
        self.after = int(self.sweep.get("median_after") or 0)
        self.last = 0.0
        self.done = False

    def tick(self, now: float | None = None) -> None:
        if not self.after or self.done:
            return
        now = now or time.time()
        if now - self.last < CHECK_S:
            return
        self.last = now
        try:
            self._check()
        except Exception:
            log.exception("median rule: the check failed")

    def _check(self) -> None:
        mine = recent_loss(self.run.db)
        if mine is None or mine[0] < self.after:
            return
        step, loss = mine
        listed = read_json(sweep_file(str(self.sweep.get("id"))), {}) or {}
        others = []
        for p in listed.get("points") or []:
            d = Path(str(p.get("run_dir") or ""))
            if d.name == self.run.run_id or not d.name:
                continue
            theirs = recent_loss(d / "run.db", step)
            if theirs is not None and theirs[0] == step:
                others.append(theirs[1])
        if len(others) < MIN_SIBLINGS:
            return
        median = statistics.median(others)
        if loss > median:
            self.done = True
            by = (
                f"the sweep's median stopping rule: loss {_num(loss)} at step {step} is worse "
                f"than the median {_num(median)} of {len(others)} other runs at that step"
            )
            log.info("%s; stopping gracefully", by)
            write_json_atomic(
                self.run.stop_request, {"mode": "graceful", "t": time.time(), "by": by}
            )


def _num(x: float) -> str:
    return "nan/inf" if not math.isfinite(x) else f"{x:.4g}"
