"""run.db, the run's SQLite store: the one owner of its schema and of every query on it.

The agent opens it for writing (`Store(run, write=True)`) and is its only writer: step events
and probe records ingested by byte offset, findings, telemetry (through the telemetry tables
on the same connection). Everyone else opens it read-only (`Store(run)`); WAL lets them read
while the agent writes. One Store holds one connection: a viewer keeps its Store for its life.

The offsets of ingested files live in the same database, so a reader adds whatever the agent
has not ingested yet (or ever will, if it died) straight from the files.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Iterable

from tunedeck.core.ingest.tail import Tail
from tunedeck.core.rundir import RunDir, event_rank
from tunedeck.core.telemetry.store import TelemetryStore, read_latest, read_series

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    rank INTEGER NOT NULL,
    kind TEXT NOT NULL,
    step INTEGER,
    t REAL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_kind_rank_step ON events(kind, rank, step);
CREATE TABLE IF NOT EXISTS offsets (file TEXT PRIMARY KEY, offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS findings (
    id INTEGER PRIMARY KEY,
    t REAL,
    category TEXT NOT NULL,
    severity TEXT NOT NULL,
    rank INTEGER,
    data TEXT NOT NULL,
    UNIQUE(category, rank, data)
);
"""


class Store:
    """One connection to a run's run.db. Read-only unless `write` (the agent's)."""

    def __init__(self, run: RunDir | str | Path, write: bool = False):
        self.run = run if isinstance(run, RunDir) else RunDir(run)
        self.write = write
        self.db: sqlite3.Connection | None = None
        self._tails: dict[str, Tail] = {}
        self._telemetry: TelemetryStore | None = None
        if write:
            self.db = sqlite3.connect(self.run.db, timeout=10)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            self._tails = {name: Tail(self.run.events / name, off) for name, off in
                           self.db.execute("SELECT file, offset FROM offsets")}

    def _reader(self) -> sqlite3.Connection | None:
        """The read-only connection, opened once run.db exists (a run that has not started
        has none yet)."""
        if self.db is None and self.run.db.exists():
            try:
                # a viewer polls from worker threads, one poll at a time
                self.db = sqlite3.connect(f"file:{self.run.db}?mode=ro", uri=True, timeout=10,
                                          check_same_thread=False)
            except sqlite3.Error:
                return None
        return self.db

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the agent's side --------------------------------------------------------------
    # At most this much of each file per call: an agent taking over a long backlog (a
    # restart) catches up over a few ticks instead of holding it all in memory at once.
    INGEST_BYTES = 8 << 20

    def ingest(self) -> list[dict[str, Any]]:
        """Move newly appended rank events into the database; returns them."""
        new: list[dict[str, Any]] = []
        for path in self.run.event_files():
            new.extend(self._ingest_file(path, None))
        return new

    def ingest_probe(self) -> list[dict[str, Any]]:
        """Move new DataLoader probe records (kind data_wait) into the database."""
        new: list[dict[str, Any]] = []
        for path in self.run.probe_files():
            new.extend(self._ingest_file(path, "data_wait"))
        return new

    def _ingest_file(self, path: Path, only_kind: str | None) -> list[dict[str, Any]]:
        assert self.db is not None and self.write, "only the agent's Store ingests"
        tail = self._tails.get(path.name)
        if tail is None:
            tail = self._tails[path.name] = Tail(path)
        before = tail.offset
        events = tail.records(self.INGEST_BYTES)
        if tail.offset == before:
            return []
        rank = event_rank(path)
        if only_kind:
            events = [e for e in events if e.get("kind") == only_kind]
        for e in events:   # the probe may leave it out; the file names it
            if not isinstance(e.get("rank"), int) and rank is not None:
                e["rank"] = rank
        with self.db:
            self.db.executemany(
                "INSERT INTO events(rank, kind, step, t, data) VALUES (?,?,?,?,?)",
                [_row(e, -1 if rank is None else rank) for e in events])
            self.db.execute("INSERT OR REPLACE INTO offsets(file, offset) VALUES (?,?)",
                            (path.name, tail.offset))
        return events

    def save_finding(self, finding) -> bool:
        """Store a Finding once; returns False if the same finding was stored before."""
        assert self.db is not None and self.write
        data = json.dumps(finding.to_json(), sort_keys=True, separators=(",", ":"))
        # -1 for "no rank": SQLite's UNIQUE treats NULLs as all different, so a rank-less
        # finding was stored again on every diagnosis poll
        rank = finding.rank if finding.rank is not None else -1
        with self.db:
            cur = self.db.execute(
                "INSERT OR IGNORE INTO findings(t, category, severity, rank, data) "
                "VALUES (?,?,?,?,?)",
                (finding.t, finding.category, finding.severity, rank, data))
        return cur.rowcount > 0

    @property
    def telemetry(self) -> TelemetryStore:
        """The telemetry tables' writer, on this Store's connection."""
        assert self.db is not None and self.write
        if self._telemetry is None:
            self._telemetry = TelemetryStore(self.db)
        return self._telemetry

    # -- readers -----------------------------------------------------------------------
    def events(self, kind: str | None = None, rank: int | None = None
               ) -> list[dict[str, Any]]:
        """All events of the run: what run.db holds plus anything not ingested yet."""
        out: list[dict[str, Any]] = []
        offsets: dict[str, int] = {}
        db = self._reader()
        if db is not None:
            try:
                cond, args = [], []
                if kind:
                    cond.append("kind = ?")
                    args.append(kind)
                if rank is not None:
                    cond.append("rank = ?")
                    args.append(rank)
                q = "SELECT data FROM events" + (" WHERE " + " AND ".join(cond) if cond else "")
                out = [json.loads(d) for (d,) in db.execute(q + " ORDER BY id", args)]
                offsets = dict(db.execute("SELECT file, offset FROM offsets"))
            except sqlite3.Error:
                out, offsets = [], {}
        for path in self.run.event_files():
            if rank is not None and event_rank(path) != rank:
                continue
            events = Tail(path, offsets.get(path.name, 0)).records()
            out.extend(e for e in events if kind is None or e.get("kind") == kind)
        return out

    def findings(self) -> list[dict[str, Any]]:
        """Findings the agent stored, oldest first."""
        db = self._reader()
        if db is None:
            return []
        try:
            return [json.loads(d) for (d,) in db.execute("SELECT data FROM findings ORDER BY id")]
        except sqlite3.Error:
            return []

    def telemetry_latest(self) -> dict[str, Any]:
        """The sampler's last snapshot ({} when the run has no telemetry)."""
        db = self._reader()
        return read_latest(db) if db is not None else {}

    def telemetry_series(self, kind: str, t0: float, t1: float, max_points: int = 500,
                         keys: Iterable[int] | None = None,
                         metrics: Iterable[str] | None = None) -> dict[str, Any]:
        """A telemetry window (see tunedeck.core.telemetry.store.read_series)."""
        return read_series(self._reader(), kind, t0, t1, max_points, keys, metrics)


def _row(e: dict[str, Any], file_rank: int) -> tuple:
    rank = e.get("rank", file_rank)
    step = e.get("step")
    return (int(rank) if isinstance(rank, int) else file_rank, str(e.get("kind", "?")),
            int(step) if isinstance(step, (int, float)) else None, e.get("t"),
            json.dumps(e, separators=(",", ":")))


def read_events(run_dir: str | Path | RunDir, kind: str | None = None,
                rank: int | None = None) -> list[dict[str, Any]]:
    """One query of a run's events (opens and closes its own Store)."""
    with Store(run_dir) as store:
        return store.events(kind, rank)


def read_findings(run_dir: str | Path | RunDir) -> list[dict[str, Any]]:
    with Store(run_dir) as store:
        return store.findings()
