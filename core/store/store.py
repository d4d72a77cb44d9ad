"""run.db, the run's SQLite store: the one owner of its schema and of every query on it.

The agent opens it for writing (`Store(run, write=True)`) and is its only writer: step events
and probe records ingested by byte offset, findings, telemetry (through the telemetry tables
on the same connection). Everyone else opens it read-only (`Store(run)`); WAL lets them read
while the agent writes. One Store holds one connection: a viewer keeps its Store for its life.

The offsets of ingested files live in the same database, so a reader adds whatever the agent
has not ingested yet (or ever will, if it died) straight from the files.

Step and eval events are also kept as numbers (`steps`, `evals`: one row per rank and step,
filled in the same transaction as `events`) with rollups of 64 and 4096 steps per row
(`steps_64`, `steps_4096`), so a chart asks for a window of a million-step run decimated to a
few hundred min/mean/max buckets in SQL (`step_series`, `eval_series`) reading a few hundred
rows, and never holds the run in Python.
A restart repeats steps: the later attempt wins, and what the earlier attempt wrote past the
step the new one resumed from is dropped (the same rule as the live watcher's). A run.db
written before these tables existed gets them when the agent next opens it; until then
readers compute the same series from the `events` table.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Iterator

from tunedeck.core.diagnose.finding import finding_key
from tunedeck.core.ingest.native import fastscan
from tunedeck.core.ingest.tail import Tail, decode_lines
from tunedeck.core.rundir import RunDir, event_rank, strict_json
from tunedeck.core.rundir.events import clean_event
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
    key TEXT,
    rev INTEGER NOT NULL DEFAULT 1
);
"""
# One row per finding: `key` is the JSON of `Finding.key()` (its category, rank, node and
# ident or summary), so a finding refined by later evidence (LossWatch's counts) replaces its
# row, keeping its id (its place, and what the trackers and alerts saw of it by id); `rev`
# counts its versions, so a reader notices a change from COUNT and TOTAL(rev) alone. A
# run.db of an older agent has neither column (and UNIQUE(category, rank, data), which let
# every refinement add a row): the agent adds them when it opens it (`_key_findings`), and
# readers of one it did not open yet keep a finding's newest version only (`findings`).
FINDINGS_KEY_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS findings_key ON findings(key)"


# Numeric columns of a step event (core/rundir/events.py), one column each in `steps` (no
# type affinity since series format 2: an int the trainer wrote reads back an int, so
# `tunedeck metrics` prints what the event said). New metrics go last: an older run.db gets
# them by ALTER TABLE, which appends.
STEP_METRICS = (
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "step_s",
    "data_wait_s",
    "mem_gib",
    "mfu",
    "epoch",
    "tokens",
)
# Series format: 2 = typed values, `tokens`, `max_steps` (the rank's last start event's) and
# `loss_nan` (a loss that was written but is not a number) in `steps`, `max_steps` in
# `evals`; a run.db of format 1 (or none) is read by `tunedeck metrics` from its JSON events.
SERIES_FORMAT = 2
EVAL_METRICS = ("eval_loss",)
# Steps per rollup row, finest first (table steps_<n>). A window wide enough for buckets of
# whole blocks reads tier n's rows (a whole 1M-step run: ~250 rows of steps_4096), whole finer
# blocks at its ragged edges, single rows only within 64 steps of them; a narrower one (under
# ~96 steps per bucket) reads its rows. A tier holds closed blocks only: the agent keeps each rank's open
# block in memory and writes it once the steps have moved past it, so a tick costs no rollup
# write; readers cover the open block with finer blocks and rows.
TIERS = (64, 4096)

SERIES_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS steps (
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    t REAL,
    {", ".join(STEP_METRICS)}, max_steps INTEGER, loss_nan INTEGER,
    PRIMARY KEY (rank, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS evals (
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    t REAL,
    eval_loss,
    max_steps INTEGER,
    PRIMARY KEY (rank, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
"""
# columns a format-1 table lacks, added when the agent opens it
_ADDED_COLUMNS = {
    "steps": ("tokens", "max_steps INTEGER", "loss_nan INTEGER"),
    "evals": ("max_steps INTEGER",),
    **{
        f"steps_{size}": (
            "tokens_min REAL",
            "tokens_sum REAL",
            "tokens_cnt INTEGER",
            "tokens_max REAL",
        )
        for size in (64, 4096)
    },
}
STEP_COLS = 3 + len(STEP_METRICS) + 2  # rank, step, t, metrics, max_steps, loss_nan

# one rollup table per tier, same columns: n steps, their range, per metric min/sum/count/max
_TIER_COLS = (
    "rank INTEGER NOT NULL, block INTEGER NOT NULL, n INTEGER NOT NULL, "
    "step_min INTEGER NOT NULL, step_max INTEGER NOT NULL, "
    + ", ".join(f"{m}_min REAL, {m}_sum REAL, {m}_cnt INTEGER, {m}_max REAL" for m in STEP_METRICS)
    + ", PRIMARY KEY (rank, block)"
)
TIER_SCHEMA = {
    size: f"CREATE TABLE IF NOT EXISTS steps_{size} ({_TIER_COLS}) WITHOUT ROWID" for size in TIERS
}


def _tier_select(size: int) -> str:
    """A rank's tier-`size` blocks over steps [?, ?], aggregated from the steps table."""
    return (
        f"SELECT rank, step / {size}, COUNT(*), MIN(step), MAX(step), "
        + ", ".join(f"MIN({m}), SUM({m}), COUNT({m}), MAX({m})" for m in STEP_METRICS)
        + f" FROM steps WHERE rank = ? AND step >= ? AND step <= ? GROUP BY step / {size}"
    )


def _tier_sql(size: int) -> str:
    return f"INSERT OR REPLACE INTO steps_{size} " + _tier_select(size)


def _rollup_sql(size: int, finer: int) -> str:
    """A rank's tier-`size` blocks [?, ?] from tier `finer`'s (64 rows for a 4096-step block,
    not 4096: aggregating the steps again cost the agent as much as the 64-step tier did)."""
    k = size // finer
    return (
        f"INSERT OR REPLACE INTO steps_{size} SELECT rank, block / {k}, SUM(n), "
        "MIN(step_min), MAX(step_max), "
        + ", ".join(f"MIN({m}_min), SUM({m}_sum), SUM({m}_cnt), MAX({m}_max)" for m in STEP_METRICS)
        + f" FROM steps_{finer} WHERE rank = ? AND block >= ? * {k} AND "
        f"block < (? + 1) * {k} GROUP BY block / {k}"
    )


# What a reader has not seen in run.db yet, parsed from the files' tails (a temp table of the
# reader's own connection: a dead agent's whole backlog stays in SQLite, not in Python).
_TAIL_SCHEMA = (
    "CREATE TEMP TABLE IF NOT EXISTS tail_series (file TEXT NOT NULL, "
    "off INTEGER NOT NULL, rank INTEGER NOT NULL, kind INTEGER NOT NULL, "
    "step INTEGER NOT NULL, t REAL, "
    + ", ".join(STEP_METRICS + EVAL_METRICS)
    + ", max_steps INTEGER, "
    "loss_nan INTEGER)"
)
_TAIL_COLS = 6 + len(STEP_METRICS) + len(EVAL_METRICS) + 2
_KIND_CODE = {"step": 0, "eval": 1}


class Store:
    """One connection to a run's run.db. Read-only unless `write` (the agent's)."""

    def __init__(self, run: RunDir | str | Path, write: bool = False):
        self.run = run if isinstance(run, RunDir) else RunDir(run)
        self.write = write
        self.db: sqlite3.Connection | None = None
        self._tails: dict[str, Tail] = {}
        self._telemetry: TelemetryStore | None = None
        self._last_step: dict[int, int] = {}  # the writer's newest step per rank
        self._max_steps: dict[int, int | None] = {}  # the writer's rank's last start's max_steps
        self._format: int | None = None
        self._blocks: dict[tuple[int, int], int] = {}  # (rank, tier): the open block
        self._mem: sqlite3.Connection | None = None  # a reader's tail table before run.db exists
        self._tail_at: dict[str, tuple[int, Tail]] = {}  # file -> (first offset held, tail)
        self._tables: set[str] = set()
        self.file_id: tuple[int, int] | None = None  # the writer's run.db (device, inode)
        if write:
            self.db = sqlite3.connect(self.run.db, timeout=10)
            st = os.stat(self.run.db)
            self.file_id = (st.st_dev, st.st_ino)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            had_series = self._has_table(self.db, "steps")
            self.db.executescript(SCHEMA)
            self._key_findings()
            if not had_series:
                self._create_series()
            else:
                self._add_columns()
            self._create_tiers()
            self._tails = {
                name: Tail(self.run.events / name, off)
                for name, off in self.db.execute("SELECT file, offset FROM offsets")
            }

    def _reader(self) -> sqlite3.Connection | None:
        """The read-only connection, opened once run.db exists (a run that has not started
        has none yet)."""
        if self.db is None and self.run.db.exists():
            try:
                # a viewer polls from worker threads, one poll at a time
                self.db = sqlite3.connect(
                    f"file:{self.run.db}?mode=ro", uri=True, timeout=10, check_same_thread=False
                )
            except sqlite3.Error:
                return None
        return self.db

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
        if self._mem is not None:
            self._mem.close()
            self._mem = None
        self._tail_at.clear()

    # -- the writer's file going away -----------------------------------------------------
    def file_gone(self) -> str | None:
        """The writer's run.db is no longer at its path: 'deleted' or 'replaced' (another
        file there); None while it is the file this Store opened."""
        if self.file_id is None:
            return None
        try:
            st = os.stat(self.run.db)
        except FileNotFoundError:
            return "deleted"
        except OSError:
            return None
        return None if (st.st_dev, st.st_ino) == self.file_id else "replaced"

    def restore_file(self) -> str | None:
        """Put this connection's database back at run.db (it still reads the unlinked file):
        a full copy through SQLite's backup, written beside it and renamed into place. A file
        that replaced it is kept as run.db.replaced-<time>; its name is returned."""
        assert self.db is not None and self.write
        self.db.commit()
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        folder = self.run.db.parent
        tmp = folder / f".run.db.restore-{os.getpid()}"
        for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-journal")):
            p.unlink(missing_ok=True)
        copy = sqlite3.connect(tmp)
        try:
            self.db.backup(copy)
            copy.commit()
        finally:
            copy.close()
        kept = None
        if self.file_gone() == "replaced":
            kept = f"run.db.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.rename(f"{self.run.db}{suffix}", folder / f"{kept}{suffix}")
                except FileNotFoundError:
                    pass
        else:  # the deleted file's side files would be read as the new file's
            for suffix in ("-wal", "-shm"):
                Path(f"{self.run.db}{suffix}").unlink(missing_ok=True)
        os.rename(tmp, self.run.db)
        return kept

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the agent's side --------------------------------------------------------------
    # At most this much of each file per call: an agent taking over a long backlog (a
    # restart) catches up over a few ticks instead of holding it all in memory at once.
    INGEST_BYTES = 8 << 20

    def ingest(
        self, newest_steps: int | None = None, every_step_of: int | None = None
    ) -> list[dict[str, Any]]:
        """Move newly appended rank events into the database; returns them. With
        `newest_steps`, a rank's step events come back only as its `newest_steps` newest of
        this call (every one for rank `every_step_of`): the rest go to run.db without ever
        becoming a dict."""
        new: list[dict[str, Any]] = []
        with self.db:  # one transaction for every file's lines (a commit each cost more)
            for path in self.run.event_files():
                new.extend(self._ingest_file(path, None, newest_steps, every_step_of))
        return new

    def ingest_probe(self) -> list[dict[str, Any]]:
        """Move new DataLoader probe records (kind data_wait) into the database."""
        new: list[dict[str, Any]] = []
        with self.db:
            for path in self.run.probe_files():
                new.extend(self._ingest_file(path, "data_wait"))
        return new

    def _ingest_file(
        self,
        path: Path,
        only_kind: str | None,
        newest_steps: int | None = None,
        every_step_of: int | None = None,
    ) -> list[dict[str, Any]]:
        assert self.db is not None and self.write, "only the agent's Store ingests"
        tail = self._tails.get(path.name)
        if tail is None:
            tail = self._tails[path.name] = Tail(path)
        before = tail.offset
        # each line parsed once; run.db keeps the line as written (no re-encoding) with the
        # few fields readers index by
        lines = tail.object_lines(self.INGEST_BYTES)
        if tail.offset == before:
            return []
        # a trainer's step line: its fields picked by the native module (no dict); any other
        # line (or every line, without the module) decoded by json
        picks = (
            fastscan.pick_steps(lines, STEP_METRICS)
            if fastscan is not None and only_kind is None
            else [None] * len(lines)
        )
        wanted = _wanted(picks, newest_steps, every_step_of)
        objs = iter(decode_lines([ln for ln, p, w in zip(lines, picks, wanted) if p is None or w]))
        rank = event_rank(path)
        file_rank = -1 if rank is None else rank
        rows = []
        events = []
        ranked: list[tuple[int, Any]] = []
        for ln, pick, want in zip(lines, picks, wanted):
            if pick is not None:
                if want and type(e := next(objs)) is dict:
                    events.append(clean_event(dict(e)))
                rows.append((pick[0], "step", pick[1], pick[2], ln))
                ranked.append((pick[0], pick))
                continue
            e = next(objs)
            if type(e) is not dict or (only_kind and e.get("kind") != only_kind):
                continue
            r = e.get("rank")
            if _int64(r) is None:
                r = file_rank
                if rank is not None:  # the probe may leave it out; the file names it
                    e["rank"] = rank
            step, t, kind = e.get("step"), e.get("t"), e.get("kind", "?")
            if _int64(step) is None:
                step = (
                    _int64(int(step))
                    if isinstance(step, (int, float)) and math.isfinite(step)
                    else None
                )
            if type(t) is not float or t - t != 0.0:
                t = _num(t)
            rows.append((r, kind if type(kind) is str else str(kind), step, t, ln))
            events.append(clean_event(dict(e)))
            ranked.append((r, e))
        # in the caller's transaction
        self.db.executemany(
            "INSERT INTO events(rank, kind, step, t, data) VALUES (?,?,?,?,?)", rows
        )
        if only_kind is None:
            self._add_series(ranked)
        self.db.execute(
            "INSERT OR REPLACE INTO offsets(file, offset) VALUES (?,?)", (path.name, tail.offset)
        )
        return events

    def _create_series(self) -> None:
        """The numeric tables, filled from the events an older agent stored (one transaction:
        a reader sees no table or a complete one)."""
        assert self.db is not None
        self.db.execute("BEGIN")
        try:
            for stmt in SERIES_SCHEMA.split(";") + list(TIER_SCHEMA.values()):
                if stmt.strip():
                    self.db.execute(stmt)
            self.db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('series_format', ?)", (SERIES_FORMAT,)
            )
            last = 0
            while True:  # in pages: an old run's events never all in memory at once
                page = self.db.execute(
                    "SELECT id, rank, data FROM events WHERE kind IN ('step', 'eval') "
                    "AND id > ? ORDER BY id LIMIT 20000",
                    (last,),
                ).fetchall()
                if not page:
                    break
                last = page[-1][0]
                self._add_series((rank, json.loads(data)) for _, rank, data in page)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _add_columns(self) -> None:
        """A format-1 run.db (an older agent's): the columns its tables lack, so this agent
        can write; readers still read it as format 1 (its older rows lack them)."""
        assert self.db is not None
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value)")
        for table, cols in _ADDED_COLUMNS.items():
            if not self._has_table(self.db, table):
                continue
            have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
            for col in cols:
                if col.split()[0] not in have:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {col}")
        self.db.commit()

    def _key_findings(self) -> None:
        """An older agent's findings table: the `key` and `rev` columns added, and the rows
        it stored for one finding (a version per refinement) made one, at the first row's
        place with the newest version's data (one transaction)."""
        assert self.db is not None
        have = {row[1] for row in self.db.execute("PRAGMA table_info(findings)")}
        self.db.execute("BEGIN")
        try:
            if "key" not in have:
                self.db.execute("ALTER TABLE findings ADD COLUMN key TEXT")
            if "rev" not in have:
                self.db.execute("ALTER TABLE findings ADD COLUMN rev INTEGER NOT NULL DEFAULT 1")
            rows = self.db.execute(
                "SELECT id, data FROM findings WHERE key IS NULL ORDER BY id"
            ).fetchall()
            if rows:
                kept = dict(self.db.execute("SELECT key, id FROM findings WHERE key IS NOT NULL"))
                versions: dict[str, list[tuple[int, str]]] = {}
                for i, data in rows:
                    try:
                        key = _key_json(finding_key(json.loads(data)))
                    except (ValueError, TypeError, AttributeError):
                        key = json.dumps(["unreadable", i])  # kept as it is, on its own
                    versions.setdefault(key, []).append((i, data))
                for key, vs in versions.items():
                    first = kept.get(key, vs[0][0])
                    newest = vs[-1][1]
                    gone = [i for i, _ in vs if i != first]
                    if not gone:  # one version: it only gets its key
                        self.db.execute("UPDATE findings SET key = ? WHERE id = ?", (key, first))
                        continue
                    # the others first: UNIQUE(category, rank, data) holds the newest's data
                    self.db.executemany("DELETE FROM findings WHERE id = ?", [(i,) for i in gone])
                    d = _loads(newest)
                    self.db.execute(
                        "UPDATE findings SET data = ?, key = ?, rev = rev + ?, t = ?, "
                        "severity = ? WHERE id = ?",
                        (
                            newest,
                            key,
                            len(gone),
                            _num(d.get("t")),
                            str(d.get("severity") or "info"),
                            first,
                        ),
                    )
            self.db.execute(FINDINGS_KEY_INDEX)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _create_tiers(self) -> None:
        """Rollup tables this run.db lacks, aggregated from its steps (one transaction)."""
        assert self.db is not None
        missing = [t for t in TIERS if not self._has_table(self.db, f"steps_{t}")]
        if not missing:
            return
        self.db.execute("BEGIN")
        try:
            for size in missing:
                self.db.execute(TIER_SCHEMA[size])
                for rank, last in self.db.execute(
                    "SELECT rank, MAX(step) FROM steps GROUP BY rank"
                ).fetchall():
                    # closed blocks only: the one holding the newest step is still open
                    self.db.execute(_tier_sql(size), (rank, 0, last // size * size - 1))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def _add_series(self, ranked_events: Iterable[tuple[int, dict[str, Any]]]) -> None:
        """Step and eval events (in file order) into `steps`/`evals`, and their blocks.

        A step at or below the rank's newest one is a restart repeating steps: everything of
        that rank from that step on belongs to the earlier attempt and goes first. A rollup
        block is written once the rank's steps move past it, aggregated by SQL from the rows
        just written (no per-step work in Python)."""
        assert self.db is not None
        steps: list[tuple] = []
        evals: list[tuple] = []
        closed: list[tuple[int, int, int]] = []  # (size, rank, block) to write

        def flush() -> None:
            if steps:
                self.db.executemany(
                    f"INSERT OR REPLACE INTO steps VALUES ({','.join('?' * STEP_COLS)})", steps
                )
                steps.clear()
            if evals:
                self.db.executemany("INSERT OR REPLACE INTO evals VALUES (?,?,?,?,?)", evals)
                evals.clear()
            for size, rank, block in closed:  # a block's finer blocks are closed before it
                if size == TIERS[0]:
                    self.db.execute(_tier_sql(size), (rank, block * size, block * size + size - 1))
                else:
                    self.db.execute(
                        _rollup_sql(size, TIERS[TIERS.index(size) - 1]), (rank, block, block)
                    )
            closed.clear()

        max_steps, last_step, open_block = self._max_steps, self._last_step, self._blocks
        metrics = STEP_METRICS
        nk = len(metrics)
        for rank, e in ranked_events:
            if type(e) is tuple:  # a picked step line: (rank, step, t, *values, had loss)
                step = e[1]
            else:
                kind = e.get("kind")
                if kind != "step" and kind != "eval":
                    if kind == "start":
                        ms = e.get("max_steps")
                        if (ms := _int64(ms)) is not None:
                            max_steps[rank] = ms or None
                    continue
                step = e.get("step")
                if type(step) is not int or step < 0 or step > I64:
                    step = _step_of(e)
                    if step is None:
                        continue
            if rank not in max_steps:
                max_steps[rank] = self._last_max_steps(rank)
            if type(e) is dict and kind == "eval":
                ev = _num(e.get("eval_loss"))
                if ev is None:  # an eval event naming it "loss"
                    ev = _num(e.get("loss"))
                evals.append((rank, step, _num(e.get("t")), ev, max_steps[rank]))
                continue
            last = last_step.get(rank)
            if last is None:
                got = self.db.execute(
                    "SELECT MAX(step) FROM steps WHERE rank = ?", (rank,)
                ).fetchone()[0]
                last = -1 if got is None else got
                for size in TIERS:  # the block the last agent life left open
                    open_block[(rank, size)] = (last if last >= 0 else step) // size
            if step <= last:
                flush()
                for table in ("steps", "evals"):
                    self.db.execute(
                        f"DELETE FROM {table} WHERE rank = ? AND step >= ?", (rank, step)
                    )
                for size in TIERS:
                    self.db.execute(
                        f"DELETE FROM steps_{size} WHERE rank = ? AND block >= ?",
                        (rank, step // size),
                    )
                    open_block[(rank, size)] = step // size  # reopened with the steps left
            last_step[rank] = step
            if type(e) is tuple:  # already finite numbers or None
                steps.append(
                    (
                        rank,
                        step,
                        e[2],
                        *e[3 : 3 + nk],
                        max_steps[rank],
                        1 if e[3] is None and e[3 + nk] else None,
                    )
                )
            else:
                # finite numbers as written; anything else (null, NaN, text, a bool) is None
                values = [
                    v
                    if (type(v) is float and v - v == 0.0)
                    or (type(v) is int and -I64 - 1 <= v <= I64)
                    else _num(v)
                    for v in map(e.get, metrics)
                ]
                t = e.get("t")
                steps.append(
                    (
                        rank,
                        step,
                        t if type(t) is float and t - t == 0.0 else _num(t),
                        *values,
                        max_steps[rank],
                        1 if values[0] is None and "loss" in e else None,
                    )
                )
            for size in TIERS:
                block = step // size
                if open_block[(rank, size)] != block:  # the steps moved past it: complete
                    closed.append((size, rank, open_block[(rank, size)]))
                    open_block[(rank, size)] = block
        flush()

    def _last_max_steps(self, rank: int) -> int | None:
        """max_steps of the rank's last start event in run.db that names one (a new agent
        life continues the file where the last one stopped)."""
        assert self.db is not None
        return last_max_steps(self.db, rank)

    def save_finding(self, finding) -> bool:
        """Store a Finding: a new one adds a row, one with the key of a stored finding (the
        same finding, refined) replaces that row's version in place. True when it was new or
        changed, False when run.db held exactly this already."""
        assert self.db is not None and self.write
        # its time and rank may come from a rank's event line: stored as the schema says
        t = _num(finding.t)
        finding.t = float(t) if t is not None else time.time()
        if finding.rank is not None and _int64(finding.rank) is None:
            finding.rank = None
        d = strict_json(finding.to_json())
        data = json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False)
        # -1 for "no rank" in the column (an older run.db's UNIQUE treats NULLs as all
        # different); the key holds the finding's own rank
        rank = finding.rank if finding.rank is not None else -1
        key = _key_json(finding_key(d))
        with self.db:
            cur = self.db.execute(
                "INSERT INTO findings(t, category, severity, rank, data, key) "
                "VALUES (?,?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET t = excluded.t, "
                "severity = excluded.severity, data = excluded.data, rev = rev + 1 "
                "WHERE data != excluded.data",
                (finding.t, finding.category, finding.severity, rank, data, key),
            )
        return cur.rowcount > 0

    @property
    def telemetry(self) -> TelemetryStore:
        """The telemetry tables' writer, on this Store's connection."""
        assert self.db is not None and self.write
        if self._telemetry is None:
            self._telemetry = TelemetryStore(self.db)
        return self._telemetry

    # -- readers -----------------------------------------------------------------------
    def events(self, kind: str | None = None, rank: int | None = None) -> list[dict[str, Any]]:
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
                q = "SELECT rank, data FROM events" + (
                    " WHERE " + " AND ".join(cond) if cond else ""
                )
                for r, d in db.execute(q + " ORDER BY id", args):
                    e = json.loads(d)
                    if "rank" not in e and r >= 0:  # a probe line: its file names the rank
                        e["rank"] = r
                    out.append(e)
                offsets = dict(db.execute("SELECT file, offset FROM offsets"))
            except sqlite3.Error:
                out, offsets = [], {}
        for path in self.run.event_files():
            if rank is not None and event_rank(path) != rank:
                continue
            events = Tail(path, offsets.get(path.name, 0)).records()
            out.extend(e for e in events if kind is None or e.get("kind") == kind)
        return out

    # -- numeric series (charts) --------------------------------------------------------
    def step_range(self, rank: int = 0) -> tuple[int, int] | None:
        """(first, last) step of a rank's step events, run.db and the files' tails together;
        None before the first step."""
        got = self.step_series(rank, buckets=0, metrics=())
        return None if got["first"] is None else (got["first"], got["last"])

    def step_series(
        self,
        rank: int = 0,
        start: int | None = None,
        end: int | None = None,
        buckets: int = 200,
        metrics: Iterable[str] = ("loss",),
    ) -> dict[str, Any]:
        """A rank's step metrics over steps [start, end] (None: the run's first / last step)
        in at most about `buckets` buckets, aggregated in SQL.

        Returns {"rank", "first", "last" (the whole run's step range, None when it has no
        steps), "start", "end" (the window), "width" (steps per bucket), "step", "step_max"
        (each bucket's first and last step present), "n" (steps in it), "nan" (steps whose
        loss was null/NaN) and per metric m: m (mean), m+"_min", m+"_max"}: lists, one entry
        per bucket that holds a step, in step order; None where a bucket has no value.
        Wide buckets are whole multiples of a rollup tier's block, read from the rollup, so
        there may be fewer buckets than asked for, never more than buckets + 1."""
        names = list(metrics)
        bad = [m for m in names if m not in STEP_METRICS]
        if bad:
            raise ValueError(f"unknown step metric(s): {', '.join(bad)}")
        return self._series("step", rank, start, end, buckets, names)

    def eval_series(
        self, rank: int = 0, start: int | None = None, end: int | None = None, buckets: int = 200
    ) -> dict[str, Any]:
        """Eval loss like `step_series` (metric "eval_loss"; first/last are the eval steps)."""
        return self._series("eval", rank, start, end, buckets, ["eval_loss"])

    def _series(
        self,
        kind: str,
        rank: int,
        start: int | None,
        end: int | None,
        buckets: int,
        metrics: list[str],
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": rank,
            "first": None,
            "last": None,
            "start": start,
            "end": end,
            "width": None,
            "step": [],
            "step_max": [],
            "n": [],
            "nan": [],
        }
        for m in metrics:
            out[m] = []
            out[m + "_min"] = []
            out[m + "_max"] = []
        db = self._series_db()
        try:
            main, tail_min = self._series_sources(db, kind, rank)
            # main rows from the step where the tail starts on are older than the tail's
            # (a restart, or the agent ingested since we read its offsets): the tail wins
            cut = tail_min if tail_min is not None else None
            args: dict[str, Any] = {"rank": rank, "cut": cut}
            first, last = db.execute(
                f"SELECT MIN(step), MAX(step) FROM ({main['range']})", args
            ).fetchone()
            if first is None:
                return out
            out["first"], out["last"] = first, last
            lo = first if start is None else max(int(start), 0)
            hi = last if end is None else int(end)
            out["start"], out["end"] = lo, hi
            if hi < lo or buckets <= 0:  # 0 buckets: the range only
                return out
            buckets = int(buckets)
            span = hi - lo + 1
            args.update(lo=lo, hi=hi)
            # the coarsest tier whose whole-block buckets still give 3/4 of the buckets asked
            # for (a 1M-step run in 306: 244 buckets of 4096 steps, ~250 rows read)
            size = next(
                (
                    t
                    for t in reversed(TIERS)
                    if main["blocks"]
                    and span / (t * math.ceil(span / (buckets * t))) >= 0.75 * buckets
                ),
                None,
            )
            if size is not None:
                width = size * math.ceil(span / (buckets * size))
                closed = {
                    t: db.execute(
                        f"SELECT MAX(block) FROM steps_{t} WHERE rank = ?", (rank,)
                    ).fetchone()[0]
                    for t in TIERS
                }
                q = self._block_query(main, metrics, lo, hi, size, width, cut, closed, args)
            else:
                width = span / buckets if span > buckets else 1
                args.update(n=min(buckets, span), span=span)
                cols = ", ".join(f"MIN({m}), AVG({m}), MAX({m})" for m in metrics)
                null_loss = "SUM(loss IS NULL)" if kind == "step" else "0"
                q = (
                    f"SELECT (step - :lo) * :n / :span AS b, MIN(step), MAX(step), COUNT(*), "
                    f"{null_loss}{', ' + cols if cols else ''} FROM ({main['rows']}) "
                    f"WHERE step BETWEEN :lo AND :hi GROUP BY b ORDER BY b"
                )
            out["width"] = width
            for row in db.execute(q, args):
                out["step"].append(row[1])
                out["step_max"].append(row[2])
                out["n"].append(row[3])
                out["nan"].append(row[4] or 0)
                for i, m in enumerate(metrics):
                    lo_v, mean, hi_v = row[5 + 3 * i : 8 + 3 * i]
                    out[m + "_min"].append(lo_v)
                    out[m].append(mean)
                    out[m + "_max"].append(hi_v)
        except sqlite3.Error:
            return out
        return out

    @staticmethod
    def _block_query(
        main: dict[str, str],
        metrics: list[str],
        lo: int,
        hi: int,
        size: int,
        width: int,
        cut: int | None,
        closed: dict[int, int | None],
        args: dict[str, Any],
    ) -> str:
        """Buckets of `width` steps (a multiple of `size`, aligned to it) from the whole
        blocks of tier `size` inside the window, whole finer blocks at its ragged edges (and
        over the open block, past `closed`: each tier's last written block), single rows at
        theirs and from the tail: every step in exactly one part."""
        top = hi if cut is None else min(hi, cut - 1)  # run.db's part ends here
        args.update(origin=lo - lo % size, width=width)
        sep = ", " if metrics else ""
        block_cols = ", ".join(f"{m}_min, {m}_sum, {m}_cnt, {m}_max" for m in metrics)
        row_cols = ", ".join(f"{m}, {m}, {m} IS NOT NULL, {m}" for m in metrics)
        arms: list[str] = []

        def cover(a: int, b: int, tiers: list[int]) -> None:
            if a > b:
                return
            if not tiers:  # single rows (a range is one index search, never an OR)
                arms.append(
                    f"SELECT step AS s, step AS e, 1 AS n, loss IS NULL AS z{sep}"
                    f"{row_cols} FROM ({main['rows']}) WHERE step BETWEEN {a} AND {b}"
                )
                return
            t = tiers[0]
            b0, b1 = -(-a // t), (b + 1) // t - 1  # whole blocks inside [a, b]
            b1 = min(b1, -1 if closed.get(t) is None else closed[t])
            if b1 < b0:
                cover(a, b, tiers[1:])
                return
            arms.append(
                f"SELECT step_min AS s, step_max AS e, n, n - loss_cnt AS z{sep}"
                f"{block_cols} FROM steps_{t} WHERE rank = :rank "
                f"AND block BETWEEN {b0} AND {b1}"
            )
            cover(a, b0 * t - 1, tiers[1:])
            cover((b1 + 1) * t, b, tiers[1:])

        cover(lo, top, [t for t in reversed(TIERS) if t <= size])
        cover(top + 1, hi, [])  # the tail's rows
        agg = ", ".join(f"MIN({m}_min), SUM({m}_sum) / SUM({m}_cnt), MAX({m}_max)" for m in metrics)
        return (
            f"SELECT (s - :origin) / :width AS b, MIN(s), MAX(e), SUM(n), SUM(z)"
            f"{sep}{agg} FROM ({' UNION ALL '.join(arms)}) GROUP BY b ORDER BY b"
        )

    def _series_db(self) -> sqlite3.Connection:
        """run.db's connection, or (before run.db exists) a private in-memory one that holds
        only the tail table."""
        db = self._reader()
        if db is not None:
            if self._mem is not None:  # run.db appeared: read the files against its offsets
                self._mem.close()
                self._mem = None
                self._tail_at.clear()
            return db
        if self._mem is None:
            self._mem = sqlite3.connect(":memory:", check_same_thread=False)
        return self._mem

    def _has_table(self, db: sqlite3.Connection, name: str) -> bool:
        if (
            name not in self._tables
            and db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
            ).fetchone()
        ):
            self._tables.add(name)  # tables are never dropped: remember only yes
        return name in self._tables

    def _series_sources(
        self, db: sqlite3.Connection, kind: str, rank: int
    ) -> tuple[dict[str, str], int | None]:
        """SQL for the rows of one kind for one rank (parameters :rank, :cut): `rows` (step
        and every column), `range` (step only) and whether `blocks` can be used; and the
        lowest step in the tail (the cut: run.db's rows from there on are superseded)."""
        self._sync_tail(db, rank)
        tail_min = db.execute(
            "SELECT MIN(step) FROM temp.tail_series WHERE rank = ? AND kind = 0", (rank,)
        ).fetchone()[0]
        cols = STEP_METRICS if kind == "step" else EVAL_METRICS
        code = _KIND_CODE[kind]
        # the same rule as the writer's, over rows in file order: a row stays unless a later
        # step row has a step at or below its own (a later attempt redid it)
        tail = (
            f"SELECT step, {', '.join(cols)} FROM (SELECT kind, step, {', '.join(cols)}, "
            f"MIN(CASE WHEN kind = 0 THEN step END) OVER (PARTITION BY file ORDER BY off "
            f"DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS later "
            f"FROM temp.tail_series WHERE rank = :rank) "
            f"WHERE kind = {code} AND (later IS NULL OR step < later)"
        )
        cut = "" if tail_min is None else " AND step < :cut"
        use_blocks = False
        if self._has_table(db, "steps"):
            table = "steps" if kind == "step" else "evals"
            main = f"SELECT step, {', '.join(cols)} FROM {table} WHERE rank = :rank{cut}"
            # MIN and MAX each one index probe, not a scan of the rank's rows
            rng = (
                f"SELECT MIN(step) AS step FROM {table} WHERE rank = :rank{cut} UNION ALL "
                f"SELECT MAX(step) FROM {table} WHERE rank = :rank{cut} UNION ALL "
                f"SELECT step FROM ({tail})"
            )
            use_blocks = kind == "step" and all(self._has_table(db, f"steps_{t}") for t in TIERS)
        elif self._has_table(db, "events"):
            # run.db from before the numeric tables: the same rows from the JSON blobs
            values = ", ".join(
                f"CASE WHEN json_type(data, '$.{m}') IN ('integer', 'real') "
                f"THEN json_extract(data, '$.{m}') END AS {m}"
                for m in cols
            )
            main = (
                f"SELECT step, {values} FROM (SELECT kind, step, data, "
                f"MIN(CASE WHEN kind = 'step' THEN step END) OVER (ORDER BY id DESC ROWS "
                f"BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS later FROM events "
                f"WHERE rank = :rank AND kind IN ('step', 'eval') AND step >= 0) "
                f"WHERE kind = '{kind}' AND (later IS NULL OR step < later){cut}"
            )
            rng = ""
        else:
            main = rng = ""
        rows = f"{main} UNION ALL {tail}" if main else tail
        rng = rng or f"SELECT step FROM ({rows})"
        return {"rows": rows, "range": rng, "blocks": use_blocks}, tail_min

    def _sync_tail(self, db: sqlite3.Connection, rank: int | None) -> None:
        """Bring the tail table up to the end of the rank's event file (every rank's: None):
        drop what the agent has ingested since (by each row's line-end offset), parse only
        what was appended."""
        db.execute(_TAIL_SCHEMA)
        try:
            offsets = (
                dict(db.execute("SELECT file, offset FROM offsets"))
                if self._has_table(db, "offsets")
                else {}
            )
        except sqlite3.Error:
            offsets = {}
        insert = f"INSERT INTO temp.tail_series VALUES ({','.join('?' * _TAIL_COLS)})"
        for path in self.run.event_files():
            file_rank = event_rank(path)
            if rank is not None and file_rank != rank:
                continue  # a chart of rank 0 never parses the other ranks' backlogs
            name, done = path.name, offsets.get(path.name, 0)
            held = self._tail_at.get(name)
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size == done and held is None:
                continue  # all ingested: nothing to hold
            if held is None or not held[0] <= done < held[1].offset or size < held[1].offset:
                if held is not None:
                    db.execute("DELETE FROM temp.tail_series WHERE file = ?", (name,))
                # the max_steps in force where the tail starts: the last start run.db holds
                state = [
                    last_max_steps(db, file_rank)
                    if done and file_rank is not None and self._has_table(db, "events")
                    else None
                ]
                held = (done, Tail(path, done), state)
            elif done > held[0]:
                db.execute("DELETE FROM temp.tail_series WHERE file = ? AND off <= ?", (name, done))
                held = (done, held[1], held[2])
            self._tail_at[name] = held
            tail, state = held[1], held[2]
            for _, chunk in tail.chunks(count_lines=False):
                pos = tail.offset - len(chunk)
                rows = []
                for line in chunk.split(b"\n")[:-1]:
                    pos += len(line) + 1
                    row = _tail_row(name, pos, line, file_rank, state)
                    if row is not None:
                        rows.append(row)
                db.executemany(insert, rows)
        db.commit()

    # -- metric rows (`tunedeck metrics`) ------------------------------------------------
    def series_format(self) -> int:
        """2: run.db's step tables hold typed values with every field `tunedeck metrics`
        prints; 1: older tables (read from the JSON events instead); 0: none."""
        db = self._reader()
        if db is None or not self._has_table(db, "steps"):
            return 0
        if not self._has_table(db, "meta"):
            return 1
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'series_format'").fetchone()
        except sqlite3.Error:
            return 1
        return int(row[0]) if row else 1

    def metric_ranks(self) -> list[int]:
        """Ranks with event files or step rows, lowest first (one index probe per rank)."""
        ranks = {r for p in self.run.event_files() if (r := event_rank(p)) is not None}
        db = self._reader()
        if db is not None and self._has_table(db, "steps"):
            r = -(1 << 62)
            while (
                r := db.execute("SELECT MIN(rank) FROM steps WHERE rank > ?", (r,)).fetchone()[0]
            ) is not None:
                ranks.add(r)
        return sorted(ranks, key=lambda r: (r < 0, r))

    def metric_sources(self) -> "MetricSources":
        """Per rank SQL over run.db's rows and the files' un-ingested tails together (the
        tail wins from its first step on, as in the charts), for `tunedeck metrics`."""
        db = self._series_db()
        self._sync_tail(db, None)
        cuts = dict(
            db.execute("SELECT rank, MIN(step) FROM temp.tail_series WHERE kind = 0 GROUP BY rank")
        )
        tail_ranks = {r for (r,) in db.execute("SELECT DISTINCT rank FROM temp.tail_series")}
        return MetricSources(db, cuts, tail_ranks)

    def findings(self, category: str | None = None) -> list[dict[str, Any]]:
        """Findings the agent stored, oldest first, one per `Finding.key()`; only
        `category`'s when given. A run.db the agent has not opened since an older agent
        stored a version of a finding per refinement reads as the newest version, at the
        first one's place."""
        db = self._reader()
        if db is None:
            return []
        where, args = ("WHERE category = ?", (category,)) if category else ("", ())
        try:
            rows = db.execute(f"SELECT data FROM findings {where} ORDER BY id", args).fetchall()
        except sqlite3.Error:
            return []
        out: dict[Any, dict[str, Any]] = {}
        for n, (d,) in enumerate(rows):
            f = json.loads(d)
            try:
                out[finding_key(f)] = f  # a dict keeps the first one's place
            except (AttributeError, TypeError):  # not a finding as tunedeck writes one
                out[n] = f
        return list(out.values())

    def findings_after(self, last_id: int) -> list[tuple[int, dict[str, Any]]]:
        """(row id, finding) of the findings first stored after row `last_id`, in order: a
        finding refined later keeps its row, so it is not among them again."""
        db = self._reader()
        if db is None:
            return []
        try:
            rows = db.execute(
                "SELECT id, data FROM findings WHERE id > ? ORDER BY id", (last_id,)
            ).fetchall()
        except sqlite3.Error:
            return []
        return [(i, json.loads(d)) for i, d in rows]

    def findings_mark(self) -> tuple | None:
        """A few numbers that change whenever a finding is stored or refined (its row
        count, total versions and last id): a viewer polling every second reads the rows
        again only when it changes. None while run.db or its findings table is missing."""
        db = self._reader()
        if db is None:
            return None
        try:
            return db.execute("SELECT COUNT(*), TOTAL(rev), MAX(id) FROM findings").fetchone()
        except sqlite3.Error:  # an older agent's table, not opened by an agent since: no rev
            try:
                return ("old",) + db.execute("SELECT COUNT(*), MAX(id) FROM findings").fetchone()
            except sqlite3.Error:
                return None

    def telemetry_latest(self) -> dict[str, Any]:
        """The sampler's last snapshot ({} when the run has no telemetry)."""
        db = self._reader()
        return read_latest(db) if db is not None else {}

    def telemetry_series(
        self,
        kind: str,
        t0: float,
        t1: float,
        max_points: int = 500,
        keys: Iterable[int] | None = None,
        metrics: Iterable[str] | None = None,
    ) -> dict[str, Any]:
        """A telemetry window (see tunedeck.core.telemetry.store.read_series)."""
        return read_series(self._reader(), kind, t0, t1, max_points, keys, metrics)


# what `tunedeck metrics` reads of a step and of an eval row, after the step
METRIC_STEP_COLS = (
    "t",
    "loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "step_s",
    "epoch",
    "tokens",
    "data_wait_s",
    "mem_gib",
    "max_steps",
    "loss_nan",
)
METRIC_EVAL_COLS = ("t", "eval_loss", "max_steps")


class MetricSources:
    """One rank's step or eval rows as SQL: run.db's table below the cut (the rank's first
    step in the files' tail) and the tail's rows a later step did not redo. Ranks and cuts
    are ints, written into the SQL."""

    def __init__(self, db: sqlite3.Connection, cuts: dict[int, int], tail_ranks: set[int]):
        self.db = db
        self.cuts = cuts
        self.tail_ranks = tail_ranks

    def sql(self, rank: int, kind: str, every: int | None = None, since: int | None = None) -> str:
        """`every`: run.db's part reads only the multiples of `every` (from `since`), one
        index probe each, so every 10,000th step of a 10M-step run reads 1,000 rows."""
        rank = int(rank)
        cols = METRIC_STEP_COLS if kind == "step" else METRIC_EVAL_COLS
        table = "steps" if kind == "step" else "evals"
        cut = self.cuts.get(rank)
        cut_cond = f" AND step < {int(cut)}" if cut is not None else ""
        if every and kind == "step":
            every = int(every)
            first = -(-max(int(since or 0), 0) // every) * every
            main = (
                f"SELECT step, {', '.join(cols)} FROM (WITH RECURSIVE k(s) AS (SELECT "
                f"{first} UNION ALL SELECT s + {every} FROM k WHERE s + {every} <= "
                f"(SELECT MAX(step) FROM {table} WHERE rank = {rank})) SELECT d.* FROM k "
                f"JOIN {table} d ON d.rank = {rank} AND d.step = k.s){' WHERE 1' + cut_cond if cut_cond else ''}"
            )
        else:
            main = f"SELECT step, {', '.join(cols)} FROM {table} WHERE rank = {rank}{cut_cond}"
        if rank not in self.tail_ranks:
            return main
        return f"SELECT * FROM ({main} UNION ALL {self._tail(rank, kind, cols)})"

    @staticmethod
    def _tail(rank: int, kind: str, cols: Iterable[str]) -> str:
        """The tail's rows of a rank that a later step row did not redo."""
        cols = ", ".join(cols)
        return (
            f"SELECT step, {cols} FROM (SELECT kind, step, {cols}, MIN(CASE WHEN kind = 0 "
            f"THEN step END) OVER (PARTITION BY file ORDER BY off DESC ROWS BETWEEN "
            f"UNBOUNDED PRECEDING AND 1 PRECEDING) AS later FROM temp.tail_series WHERE "
            f"rank = {int(rank)}) WHERE kind = {_KIND_CODE[kind]} AND (later IS NULL OR "
            f"step < later)"
        )

    def rows(
        self,
        rank: int,
        kind: str,
        since: int | None = None,
        every: int | None = None,
        steps: Iterable[int] | None = None,
    ) -> Iterator[tuple]:
        """(step, *cols) in step order, from `since` on, only multiples of `every`, or only
        at `steps`."""
        cond = []
        if since is not None:
            cond.append(f"step >= {int(since)}")
        if every:
            cond.append(f"step % {int(every)} = 0")
        if steps is not None:
            wanted = sorted(set(int(s) for s in steps))
            if not wanted:
                return iter(())
            cond.append(f"step IN ({','.join(map(str, wanted))})")
        where = f" WHERE {' AND '.join(cond)}" if cond else ""
        return self.db.execute(
            f"SELECT * FROM ({self.sql(rank, kind, every, since)}){where} ORDER BY step"
        )

    def last_steps(
        self, rank: int, kind: str, n: int, since: int | None = None, every: int | None = None
    ) -> list[int]:
        """The rank's n highest steps (from `since` on, multiples of `every`)."""
        rank, n = int(rank), int(n)
        cond = ([f"step >= {int(since)}"] if since is not None else []) + (
            [f"step % {int(every)} = 0"] if every else []
        )
        cut = self.cuts.get(rank)
        table = "steps" if kind == "step" else "evals"
        # each part by itself: run.db's backwards along its index, the tail's few rows (an
        # ORDER BY over their union would sort the whole rank)
        main = " AND ".join(
            [f"rank = {rank}"] + cond + ([f"step < {int(cut)}"] if cut is not None else [])
        )
        got = [
            s
            for (s,) in self.db.execute(
                f"SELECT step FROM {table} WHERE {main} ORDER BY step DESC LIMIT {n}"
            )
        ]
        if rank in self.tail_ranks:
            where = f" WHERE {' AND '.join(cond)}" if cond else ""
            got += [
                s
                for (s,) in self.db.execute(
                    f"SELECT step FROM ({self._tail(rank, kind, ['t'])}){where} ORDER BY step "
                    f"DESC LIMIT {n}"
                )
            ]
        return sorted(got, reverse=True)[:n]

    def span(self, rank: int, count: bool = True) -> tuple[int | None, int | None, int | None]:
        """(count, first, last) of the rank's step rows; the first and last are index
        probes, the count is the closed 4096-step rollups' plus the rows past them (not a
        pass over the rank's rows); without `count` it is None."""
        rank, cut = int(rank), self.cuts.get(rank)
        cut_cond = f" AND step < {int(cut)}" if cut is not None else ""
        if count:
            _, first, last = self.span(rank, count=False)
            if first is None:
                return 0, None, None
            below = f" AND block < {int(cut) // 4096}" if cut is not None else ""
            closed, top = self.db.execute(
                f"SELECT SUM(n), MAX(block) FROM steps_4096 WHERE rank = {rank}{below}"
            ).fetchone()
            start = 0 if top is None else (top + 1) * 4096
            n = (closed or 0) + self.db.execute(
                f"SELECT COUNT(*) FROM steps WHERE rank = {rank} AND step >= {start}{cut_cond}"
            ).fetchone()[0]
            if rank in self.tail_ranks:
                n += self.db.execute(
                    f"SELECT COUNT(*) FROM ({self._tail(rank, 'step', ['t'])})"
                ).fetchone()[0]
            return n, first, last
        ends = [
            v
            for q in ("MIN", "MAX")
            for (v,) in self.db.execute(
                f"SELECT {q}(step) FROM steps WHERE rank = {rank}{cut_cond}"
            )
            if v is not None
        ]
        if rank in self.tail_ranks:
            ends += [
                v
                for (v,) in self.db.execute(
                    f"SELECT step FROM ({self.sql(rank, 'step')}) WHERE step >= "
                    f"{int(cut) if cut is not None else 0}"
                )
                if v is not None
            ]
        return (None, min(ends), max(ends)) if ends else (0, None, None)

    def missing(
        self,
        rank: int,
        lead: int,
        lead_span: tuple[int, int] | None = None,
        since: int | None = None,
    ) -> list[int]:
        """Steps (step or eval rows) of `rank` where `lead` has no row of either kind, from
        `since` on. `lead_span`: the lead's step rows are exactly these steps (no gap): only
        the rank's steps outside it are looked at, by index."""
        low = f" AND step >= {int(since)}" if since is not None else ""
        if lead_span is not None:
            a, b = int(lead_span[0]), int(lead_span[1])
            have = {
                s
                for (s,) in self.db.execute(
                    f"SELECT step FROM ({self.sql(lead, 'eval')}) WHERE 1{low}"
                )
            }
            got: set[int] = set()
            for kind in ("step", "eval"):
                for outside in (f"step < {a}", f"step > {b}"):  # each an index range
                    got.update(
                        s
                        for (s,) in self.db.execute(
                            f"SELECT step FROM ({self.sql(rank, kind)}) WHERE {outside}{low}"
                        )
                        if s not in have
                    )
            return sorted(got)
        have = (
            f"SELECT step FROM ({self.sql(lead, 'step')}) WHERE 1{low} UNION "
            f"SELECT step FROM ({self.sql(lead, 'eval')}) WHERE 1{low}"
        )
        return [
            s
            for (s,) in self.db.execute(
                f"SELECT step FROM ({self.sql(rank, 'step')}) WHERE step NOT IN ({have}){low} "
                f"UNION SELECT step FROM ({self.sql(rank, 'eval')}) WHERE step NOT IN ({have})"
                f"{low} ORDER BY step"
            )
        ]

    def gaps(self, rank: int, since: int | None = None) -> list[int]:
        """Steps (from `since` on) where the rank's step row lacks a value `tunedeck metrics`
        prints (a NaN loss is a lacking one): its record there lacks a key, which a merge
        with it moves last. Closed blocks are asked through the rollups' counts (4096 steps,
        then 64 past those; a missing `t` there is not seen: the trainer always writes it);
        only rows of blocks with a gap, of the open block and of the tail are read."""
        rank, big, small = int(rank), TIERS[-1], TIERS[0]
        since = max(int(since or 0), 0)
        cols = ("loss", "lr", "grad_norm", "tokens_per_s", "step_s", "epoch", "tokens")
        cols += ("data_wait_s", "mem_gib")
        counted = " OR ".join(f"{c}_cnt < n" for c in cols)
        lacking = " OR ".join(f"{c} IS NULL" for c in ("t",) + cols)
        db = self.db
        # parameters, not text: one compiled statement for every rank of a 1,024-rank run
        (top,) = db.execute(
            f"SELECT MAX(block) FROM steps_{big} WHERE rank = ?", (rank,)
        ).fetchone()
        ranges = [
            (b * big, b * big + big - 1)
            for (b,) in db.execute(
                f"SELECT block FROM steps_{big} WHERE rank = ? AND block >= ? AND ({counted})",
                (rank, since // big),
            )
        ]
        first = 0 if top is None else (top + 1) * big // small  # 64-blocks past the closed 4096
        (top_small,) = db.execute(
            f"SELECT MAX(block) FROM steps_{small} WHERE rank = ? AND block >= ?", (rank, first)
        ).fetchone()
        ranges += [
            (b * small, b * small + small - 1)
            for (b,) in db.execute(
                f"SELECT block FROM steps_{small} WHERE rank = ? AND block >= ? AND ({counted})",
                (rank, max(first, since // small)),
            )
        ]
        ranges.append(((first if top_small is None else top_small + 1) * small, 1 << 62))
        cut = self.cuts.get(rank)
        got: set[int] = set()
        for a, b in ranges:
            b = min(b, cut - 1) if cut is not None else b  # the tail's rows come next
            got.update(
                s
                for (s,) in db.execute(
                    "SELECT step FROM steps WHERE rank = ? AND step BETWEEN ? AND ? AND "
                    f"({lacking})",
                    (rank, max(a, since), b),
                )
            )
        if rank in self.tail_ranks:
            got.update(
                s
                for (s,) in db.execute(
                    f"SELECT step FROM ({self._tail(rank, 'step', ('t',) + cols)}) WHERE "
                    f"step >= {since} AND ({lacking})"
                )
            )
        return sorted(got)

    def has(self, rank: int, kind: str, col: str) -> bool:
        """Whether any of the rank's rows has a value there (stops at the first)."""
        cond = f"{col} IS NOT NULL" + (" OR loss_nan IS NOT NULL" if col == "loss" else "")
        return (
            self.db.execute(
                f"SELECT 1 FROM ({self.sql(rank, kind)}) WHERE {cond} LIMIT 1"
            ).fetchone()
            is not None
        )


def _wanted(picks: list, newest: int | None, every_of: int | None) -> list[bool]:
    """Which picked step lines the caller gets as dicts: all without `newest`, else each
    rank's `newest` last ones (and every one of rank `every_of`)."""
    if newest is None:
        return [True] * len(picks)
    out = [False] * len(picks)
    seen: dict[int, int] = {}
    for i in range(len(picks) - 1, -1, -1):
        p = picks[i]
        if p is not None:
            r = p[0]
            n = seen.get(r, 0)
            if n < newest or r == every_of:
                out[i] = True
                seen[r] = n + 1
    return out


I64 = (1 << 63) - 1  # SQLite's integers: a larger Python int raises OverflowError


def _int64(v: Any) -> int | None:
    """An int SQLite can hold (a rank, a step, max_steps), else None: a line with a step of
    2**64 is noise, not a reason for the agent to stop ingesting."""
    return v if type(v) is int and -I64 - 1 <= v <= I64 else None


def _num(v: Any) -> int | float | None:
    """A finite number as written (an int stays an int, one past SQLite's 64 bits becomes a
    float), else None (null, NaN, a string)."""
    if type(v) is float:
        return v if math.isfinite(v) else None
    if isinstance(v, int) and not isinstance(v, bool):
        if -I64 - 1 <= v <= I64:
            return v
        try:
            return float(v)
        except OverflowError:
            return None
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else None
    return None


def _step_of(e: dict[str, Any]) -> int | None:
    """The step of a step/eval event: an int, as the schema says (a float step is not one,
    as `tunedeck metrics` has always read it)."""
    step = _int64(e.get("step"))
    return step if step is not None and step >= 0 else None


def last_max_steps(db: sqlite3.Connection, rank: int) -> int | None:
    """max_steps of a rank's last start event in run.db that names one (None: none, or 0)."""
    try:
        for (data,) in db.execute(
            "SELECT data FROM events WHERE kind = 'start' AND rank = ? ORDER BY id DESC", (rank,)
        ):
            try:
                ms = json.loads(data).get("max_steps")
            except (ValueError, AttributeError):
                continue
            if (ms := _int64(ms)) is not None:
                return ms or None
    except sqlite3.Error:
        pass
    return None


def _tail_row(name: str, off: int, line: bytes, file_rank: int | None, state: list) -> tuple | None:
    """A tail_series row for one JSON line of an event file (None: not a step or eval).
    `state` is [the file's current max_steps]: a start line moves it."""
    if b'"step"' not in line and b'"eval"' not in line and b'"start"' not in line:
        return None  # end, checkpoint lines: skip the parse
    try:
        e = json.loads(line)
    except ValueError:
        return None
    if not isinstance(e, dict):
        return None
    kind = e.get("kind")
    if kind == "start":
        ms = e.get("max_steps")
        if (ms := _int64(ms)) is not None:
            state[0] = ms or None
        return None
    code = _KIND_CODE.get(kind)
    step = _step_of(e)
    if code is None or step is None:
        return None
    rank = e.get("rank")
    rank = rank if _int64(rank) is not None else file_rank
    if rank is None:
        return None
    values = [_num(e.get(m)) for m in STEP_METRICS]
    ev = _num(e.get("eval_loss"))
    if code == 1 and ev is None:
        ev = _num(e.get("loss"))
    return (
        name,
        off,
        rank,
        code,
        step,
        _num(e.get("t")),
        *values,
        ev,
        state[0],
        1 if code == 0 and values[0] is None and "loss" in e else None,
    )


def read_events(
    run_dir: str | Path | RunDir, kind: str | None = None, rank: int | None = None
) -> list[dict[str, Any]]:
    """One query of a run's events (opens and closes its own Store)."""
    with Store(run_dir) as store:
        return store.events(kind, rank)


def read_findings(run_dir: str | Path | RunDir) -> list[dict[str, Any]]:
    with Store(run_dir) as store:
        return store.findings()


def _key_json(key: tuple) -> str:
    """A finding's key as run.db's `key` column holds it."""
    return json.dumps(list(key), separators=(",", ":"), allow_nan=False)


def _loads(data: str) -> dict[str, Any]:
    try:
        d = json.loads(data)
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}
