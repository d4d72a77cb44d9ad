"""Telemetry tables in run.db: full resolution for recent data, min/mean/max buckets for older.

Three series kinds, each keyed by an integer `k`: `gpu` (k = GPU index), `rank` (k = rank:
the rank process plus its DataLoader workers) and `host` (k = 0). Each kind has three tiers:

    tel_<kind>_1    every sample          kept RAW_KEEP_S (1 h)
    tel_<kind>_10   10 s buckets          kept TIER10_KEEP_S (24 h)
    tel_<kind>_60   60 s buckets          kept for the whole run

Buckets are rolled up in memory as samples arrive (no aggregation queries while writing) and
each row holds n, and per metric <m>_min, <m> (the mean) and <m>_max. The latest per-process
rows and the GPU → pid map are a one-row-per-kind snapshot (`tel_latest`), not a history.
A week at 1 Hz on 8 GPUs stays a few tens of MB (tests/test_telemetry_store.py measures it).

Not every metric is read every sample (core/telemetry/sampler.py): GPU power_w, temp_c,
sm_mhz, mem_mhz, pcie_*_kbs, nvlink_*_kbs and host shm_free_mib, disk_free_mib are read every
~10 s and each 1 s row carries the last value read (None only while never read or not
supported), so charts stay continuous and bucket means are not skewed by gaps. The
latest "gpus" snapshot says when they were read: each GPU record's "slow_t".

The agent is the only writer, on its Store's connection; readers query through a read-only
Store (tunedeck.core.store.store), which owns run.db.
"""

from __future__ import annotations

import json
import math
import sqlite3
from typing import Any
from collections.abc import Iterable

from tunedeck.core.telemetry.host import HOST_METRICS, RANK_METRICS
from tunedeck.core.telemetry.nvml import GPU_METRICS

METRICS = {"gpu": GPU_METRICS, "rank": RANK_METRICS, "host": HOST_METRICS}
TIERS = (1, 10, 60)
RAW_KEEP_S = 3600.0
TIER10_KEEP_S = 86400.0
PRUNE_EVERY_S = 60.0


def _table(kind: str, res: int) -> str:
    return f"tel_{kind}_{res}"


def schema() -> str:
    parts = ["CREATE TABLE IF NOT EXISTS tel_latest (kind TEXT PRIMARY KEY, t REAL, data TEXT);"]
    for kind, metrics in METRICS.items():
        for res in TIERS:
            if res == 1:
                cols = ", ".join(f"{m} REAL" for m in metrics)
                parts.append(
                    f"CREATE TABLE IF NOT EXISTS {_table(kind, 1)} "
                    f"(t REAL NOT NULL, k INTEGER NOT NULL, {cols});"
                )
            else:
                cols = ", ".join(f"{m}_min REAL, {m} REAL, {m}_max REAL" for m in metrics)
                parts.append(
                    f"CREATE TABLE IF NOT EXISTS {_table(kind, res)} "
                    f"(t REAL NOT NULL, k INTEGER NOT NULL, n INTEGER NOT NULL, {cols});"
                )
            parts.append(
                f"CREATE INDEX IF NOT EXISTS {_table(kind, res)}_t ON {_table(kind, res)}(t);"
            )
    return "\n".join(parts)


class _Bucket:
    __slots__ = ("start", "n", "mins", "sums", "cnts", "maxs")

    def __init__(self, start: float, width: int):
        self.start = start
        self.n = 0
        self.mins = [math.inf] * width
        self.sums = [0.0] * width
        self.cnts = [0] * width
        self.maxs = [-math.inf] * width

    def add(self, values: list) -> None:
        self.n += 1
        for i, v in enumerate(values):
            if v is None:
                continue
            if v < self.mins[i]:
                self.mins[i] = v
            if v > self.maxs[i]:
                self.maxs[i] = v
            self.sums[i] += v
            self.cnts[i] += 1

    def row(self, k: int) -> list:
        out: list = [self.start, k, self.n]
        for lo, s, c, hi in zip(self.mins, self.sums, self.cnts, self.maxs):
            if c:
                out += [lo, round(s / c, 2), hi]
            else:
                out += [None, None, None]
        return out


class TelemetryStore:
    """Writer. `add(kind, t, rows)` then `commit()`; the sampler commits once per sample."""

    def __init__(
        self,
        db: sqlite3.Connection,
        raw_keep_s: float = RAW_KEEP_S,
        tier10_keep_s: float = TIER10_KEEP_S,
    ):
        self.db = db
        self.db.executescript(schema())
        self.keep = {1: raw_keep_s, 10: tier10_keep_s}
        self._open: dict[tuple[str, int, int], _Bucket] = {}
        self._last_prune = 0.0
        self._sql = {}
        for kind, metrics in METRICS.items():
            self._sql[(kind, 1)] = (
                f"INSERT INTO {_table(kind, 1)} VALUES ({','.join('?' * (len(metrics) + 2))})"
            )
            for res in TIERS[1:]:
                self._sql[(kind, res)] = (
                    f"INSERT INTO {_table(kind, res)} VALUES "
                    f"({','.join('?' * (3 * len(metrics) + 3))})"
                )

    def add(self, kind: str, t: float, rows: Iterable[tuple[int, dict[str, Any]]]) -> None:
        """rows: (k, {metric: value or None}) for one sample time."""
        metrics = METRICS[kind]
        raw, closed = [], {res: [] for res in TIERS[1:]}
        for k, rec in rows:
            values = [rec.get(m) for m in metrics]
            raw.append([t, k, *values])
            for res in TIERS[1:]:
                start = math.floor(t / res) * res
                b = self._open.get((kind, res, k))
                if b is None or b.start != start:
                    if b is not None:
                        closed[res].append(b.row(k))
                    b = self._open[(kind, res, k)] = _Bucket(start, len(metrics))
                b.add(values)
        self.db.executemany(self._sql[(kind, 1)], raw)
        for res, out in closed.items():
            if out:
                self.db.executemany(self._sql[(kind, res)], out)
        if t - self._last_prune >= PRUNE_EVERY_S:
            self._prune(t)

    def set_latest(self, kind: str, t: float, data: Any) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO tel_latest(kind, t, data) VALUES (?,?,?)",
            (kind, t, json.dumps(data, separators=(",", ":"))),
        )

    def _prune(self, now: float) -> None:
        self._last_prune = now
        for kind in METRICS:
            for res, keep in self.keep.items():
                self.db.execute(f"DELETE FROM {_table(kind, res)} WHERE t < ?", (now - keep,))

    def flush_buckets(self) -> None:
        """Write the partly filled buckets (at the end of a run)."""
        for (kind, res, k), b in list(self._open.items()):
            if b.n:
                self.db.execute(self._sql[(kind, res)], b.row(k))
        self._open.clear()
        self.commit()

    def commit(self) -> None:
        self.db.commit()


# -- reading (on a connection the run's Store gives) ------------------------------------


def read_series(
    db: sqlite3.Connection | None,
    kind: str,
    t0: float,
    t1: float,
    max_points: int = 500,
    keys: Iterable[int] | None = None,
    metrics: Iterable[str] | None = None,
) -> dict[str, Any]:
    """At most ~max_points points per key between t0 and t1 from the finest tier that still
    holds t0. Returns {"resolution_s", "step_s", "series": {k: {"t": [...], m: [...],
    m+"_min": [...], m+"_max": [...]}}}; None where a value was N/A."""
    names = list(metrics or METRICS[kind])
    bad = [m for m in names if m not in METRICS[kind]]
    if bad:
        raise ValueError(f"unknown {kind} metric(s): {', '.join(bad)}")
    empty = {"resolution_s": None, "step_s": None, "series": {}}
    if db is None:
        return empty
    try:
        res = _pick_tier(db, kind, t0, t1, max_points)
        if res is None:
            return empty
        step = res * max(1, math.ceil((t1 - t0) / (res * max(1, max_points))))
        key_list = sorted(set(keys)) if keys is not None else None
        # a bucket starting after t0 - res overlaps the window
        where = "t >= ? AND t <= ?" if res == 1 else "t > ? AND t <= ?"
        args: list = [t0 if res == 1 else t0 - res, t1]
        if key_list is not None:
            where += f" AND k IN ({','.join('?' * len(key_list))})"
            args += key_list
        table = _table(kind, res)
        cols = []
        for m in names:
            if res == 1:
                cols += [f"MIN({m})", f"AVG({m})", f"MAX({m})"]
            else:
                cols += [
                    f"MIN({m}_min)",
                    f"SUM({m}*n)/NULLIF(SUM(CASE WHEN {m} IS NULL THEN 0 ELSE n END),0)",
                    f"MAX({m}_max)",
                ]
        q = (
            f"SELECT CAST(t / {step} AS INTEGER) * {step} AS b, k, {', '.join(cols)} "
            f"FROM {table} WHERE {where} GROUP BY b, k ORDER BY k, b"
        )
        series: dict[int, dict[str, list]] = {}
        for row in db.execute(q, args):
            b, k = row[0], row[1]
            s = series.get(k)
            if s is None:
                s = series[k] = {"t": []}
                for m in names:
                    s[m], s[m + "_min"], s[m + "_max"] = [], [], []
            s["t"].append(b)
            for i, m in enumerate(names):
                lo, mean, hi = row[2 + 3 * i : 5 + 3 * i]
                s[m + "_min"].append(lo)
                s[m].append(round(mean, 2) if mean is not None else None)
                s[m + "_max"].append(hi)
        return {"resolution_s": res, "step_s": step, "series": series}
    except sqlite3.Error:
        return empty


def _pick_tier(
    db: sqlite3.Connection, kind: str, t0: float, t1: float, max_points: int
) -> int | None:
    """Coarsest tier not coarser than the step the window needs, among tiers still holding t0;
    so a week-long window reads 60 s buckets and the last five minutes read raw samples."""
    need = (t1 - t0) / max(1, max_points)
    covering = []
    for res in TIERS:
        try:
            (first,) = db.execute(f"SELECT MIN(t) FROM {_table(kind, res)}").fetchone()
        except sqlite3.OperationalError:  # no telemetry tables in this run.db
            return None
        if first is not None and first <= t0 + res:
            covering.append(res)
    if not covering:  # the window starts before any data: the tier with the oldest data
        for res in reversed(TIERS):
            (n,) = db.execute(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM {_table(kind, res)} LIMIT 1)"
            ).fetchone()
            if n:
                covering = [res]
                break
        if not covering:
            return None
    fine_enough = [r for r in covering if r <= need]
    return max(fine_enough) if fine_enough else min(covering)


def _latest(db: sqlite3.Connection) -> tuple[dict[str, Any], dict[str, float]]:
    """tel_latest's samples by kind and each kind's sample time (a row that does not parse is
    left out)."""
    snap: dict[str, Any] = {}
    times: dict[str, float] = {}
    for kind, t, data in db.execute("SELECT kind, t, data FROM tel_latest").fetchall():
        try:
            snap[kind] = json.loads(data)
        except (TypeError, ValueError):
            continue
        if isinstance(t, (int, float)):
            times[kind] = float(t)
    return snap, times


def read_latest(db: sqlite3.Connection) -> dict[str, Any]:
    """The last snapshot: {"status": {...nvml state...}, "gpus": [...], "procs": [...],
    "host": {...}} as the sampler stored it; {} when the run has no telemetry."""
    try:
        return _latest(db)[0]
    except sqlite3.Error:
        return {}


def read_latest_file(path: Any, timeout: float = 0.2) -> tuple[dict[str, Any], dict[str, float]]:
    """`read_latest` of the run.db at `path`, opened read-only (another process writes it),
    with each kind's sample time: ({}, {}) when it holds no telemetry yet."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout)
        try:
            return _latest(db)
        finally:
            db.close()
    except sqlite3.Error:  # not created yet, or no telemetry table
        return {}, {}
