"""The agent's side of the probe: tail events/probe_rank<r>.jsonl by byte offset.

New records go into run.db's `events` table (kind "data_wait") with their offsets in the
`offsets` table, like the rank event files, so readers see them and nothing is read twice.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from tunedeck.core.ingest.tail import read_new_json


def probe_files(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "events").glob("probe_rank*.jsonl"))


def probe_rank(path: Path) -> int:
    tail = path.stem[len("probe_rank"):]
    return int(tail) if tail.isdigit() else -1


class ProbeTail:
    def __init__(self, run_dir: Path, db: sqlite3.Connection | None = None):
        self.run_dir = run_dir
        self.db = db
        self.offsets: dict[str, int] = {}
        if db is not None:
            try:
                self.offsets = {k: v for k, v in db.execute(
                    "SELECT file, offset FROM offsets WHERE file LIKE 'probe_rank%'")}
            except sqlite3.Error:
                self.offsets = {}

    def poll(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in probe_files(self.run_dir):
            key = path.name
            events, off = read_new_json(path, self.offsets.get(key, 0))
            if off == self.offsets.get(key, 0):
                continue
            rank = probe_rank(path)
            events = [e for e in events if e.get("kind") == "data_wait"]
            for e in events:
                if not isinstance(e.get("rank"), int):
                    e["rank"] = rank
            if self.db is not None:
                with self.db:
                    self.db.executemany(
                        "INSERT INTO events(rank, kind, step, t, data) VALUES (?,?,?,?,?)",
                        [(e["rank"], "data_wait", None, e.get("t"),
                          json.dumps(e, separators=(",", ":"))) for e in events])
                    self.db.execute("INSERT OR REPLACE INTO offsets(file, offset) VALUES (?,?)",
                                    (key, off))
            self.offsets[key] = off
            out.extend(events)
        return out
