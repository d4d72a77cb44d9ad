"""run.db: the run's SQLite store. The agent is its only writer; readers open it read-only.

WAL mode lets the TUI and CLI read while the agent writes. Events from the rank files are
ingested by byte offset, and the offsets live in the same database, so a reader can pick up
whatever the agent has not ingested yet (or ever will, if it died) straight from the files.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from tunedeck.core.ingest.tail import read_new_json

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


def rank_of(path: Path) -> int:
    stem = path.stem  # rank3
    return int(stem[4:]) if stem.startswith("rank") and stem[4:].isdigit() else -1


def event_files(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "events").glob("rank*.jsonl"), key=rank_of)


class Store:
    """Writer side, used by the agent."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.db = sqlite3.connect(run_dir / "run.db", timeout=10)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self.offsets = dict(self.db.execute("SELECT file, offset FROM offsets"))

    def ingest(self) -> list[dict[str, Any]]:
        """Move newly appended events into the database; returns them."""
        new: list[dict[str, Any]] = []
        with self.db:
            for path in event_files(self.run_dir):
                key = path.name
                events, off = read_new_json(path, self.offsets.get(key, 0))
                if off == self.offsets.get(key, 0):
                    continue
                self.db.executemany(
                    "INSERT INTO events(rank, kind, step, t, data) VALUES (?,?,?,?,?)",
                    [_row(e, rank_of(path)) for e in events])
                self.db.execute("INSERT OR REPLACE INTO offsets(file, offset) VALUES (?,?)",
                                (key, off))
                self.offsets[key] = off
                new.extend(events)
        return new

    def save_finding(self, finding) -> bool:
        """Store a Finding once; returns False if the same finding was stored before."""
        data = json.dumps(finding.to_json(), sort_keys=True, separators=(",", ":"))
        with self.db:
            cur = self.db.execute(
                "INSERT OR IGNORE INTO findings(t, category, severity, rank, data) "
                "VALUES (?,?,?,?,?)",
                (finding.t, finding.category, finding.severity, finding.rank, data))
        return cur.rowcount > 0

    def close(self) -> None:
        self.db.close()


def _row(e: dict[str, Any], file_rank: int) -> tuple:
    rank = e.get("rank", file_rank)
    step = e.get("step")
    return (int(rank) if isinstance(rank, int) else file_rank, str(e.get("kind", "?")),
            int(step) if isinstance(step, (int, float)) else None, e.get("t"),
            json.dumps(e, separators=(",", ":")))


def read_events(run_dir: Path, kind: str | None = None, rank: int | None = None
                ) -> list[dict[str, Any]]:
    """All events of a run: what run.db holds plus anything the agent has not ingested yet."""
    out: list[dict[str, Any]] = []
    offsets: dict[str, int] = {}
    db_path = run_dir / "run.db"
    if db_path.exists():
        try:
            db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
            try:
                q = "SELECT data FROM events"
                cond, args = [], []
                if kind:
                    cond.append("kind = ?")
                    args.append(kind)
                if rank is not None:
                    cond.append("rank = ?")
                    args.append(rank)
                if cond:
                    q += " WHERE " + " AND ".join(cond)
                q += " ORDER BY id"
                out = [json.loads(d) for (d,) in db.execute(q, args)]
                offsets = dict(db.execute("SELECT file, offset FROM offsets"))
            finally:
                db.close()
        except sqlite3.Error:
            out, offsets = [], {}
    for path in event_files(run_dir):
        if rank is not None and rank_of(path) != rank:
            continue
        events, _ = read_new_json(path, offsets.get(path.name, 0))
        out.extend(e for e in events if kind is None or e.get("kind") == kind)
    return out


def read_findings(run_dir: Path) -> list[dict[str, Any]]:
    """Findings the agent stored for a run, oldest first."""
    db_path = run_dir / "run.db"
    if not db_path.exists():
        return []
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
        try:
            return [json.loads(d) for (d,) in db.execute("SELECT data FROM findings ORDER BY id")]
        finally:
            db.close()
    except sqlite3.Error:
        return []
