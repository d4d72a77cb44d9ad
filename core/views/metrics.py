"""Per-step metrics of a run (all ranks, de-duplicated by step) and of `tunedeck metrics`'s
argument, whatever it names: a run id/prefix/name, a run directory or a log file.

A run whose run.db the agent wrote with typed step tables (series format 2) is read in
SQL, as a stream: the lowest rank's step and eval rows in step order; another rank is read
only where it has a step the lowest lacks, an eval it lacks, or a field it lacks, where its
own row lacks a field, and where the lowest logged a NaN loss (the merge takes the key order
from the other ranks' records there). Each rank's span, eval steps, fields it ever has and
steps with a gap are asked first: index probes and its 4096-step rollups for a trainer's
run, not its rows. A record is what the older whole-run merge gave: the lowest rank's record
with what it lacks filled from the next ranks in order, keys in the same order. Everything
else (logs, ms-swift's logging.jsonl, an older run.db, event files no agent ingested) goes
through the log parsers as before.

`--since STEP`, `--every N` (steps that are multiples of N) and `--last N` narrow the rows
in SQL, so a script or a view asks only for what it shows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any
from collections.abc import Iterable, Iterator

from tunedeck.core.ingest.metrics import (
    FileMetrics,
    MetricsParser,
    merge_by_step,
    records_from_file,
)
from tunedeck.core.ingest.native import fastscan
from tunedeck.core.rundir import RunDir, event_rank
from tunedeck.core.store.store import METRIC_STEP_COLS, MetricSources, Store

# the step row's columns by output key (METRIC_STEP_COLS order; 0 is the step)
_OUT = (
    ("loss", 2),
    ("learning_rate", 3),
    ("grad_norm", 4),
    ("tokens_per_s", 5),
    ("step_s", 6),
    ("epoch", 7),
)
_EXTRA = (("t", 1), ("tokens", 8), ("data_wait_s", 9), ("mem_gib", 10))
_KEY_OF_COL = {
    "t": "t",
    "loss": "loss",
    "lr": "learning_rate",
    "grad_norm": "grad_norm",
    "tokens_per_s": "tokens_per_s",
    "step_s": "step_s",
    "epoch": "epoch",
    "tokens": "tokens",
    "data_wait_s": "data_wait_s",
    "mem_gib": "mem_gib",
    "max_steps": "max_steps",
}


def run_metric_files(run: RunDir) -> list[tuple[Path, int | None]]:
    """The best metric source of a run: built-in events, else ms-swift logging.jsonl, else the
    ranks' own output (latest attempt), as (path, rank) in rank order."""
    events = run.event_files()
    if events:
        return [(p, event_rank(p)) for p in events]
    jsonl = run.logging_jsonl_files()
    if jsonl:
        return [(jsonl[-1], 0)]
    logs = run.rank_logs(latest_only=True)
    return [(s.path, s.rank) for s in logs if s.path.name == "stdout.log"] or [
        (s.path, s.rank) for s in logs if s.kind == "log"
    ]


def records_from_run(run_dir: str | Path | RunDir) -> list[dict[str, Any]]:
    return list(iter_run(run_dir))


def iter_run(
    run_dir: str | Path | RunDir,
    since: int | None = None,
    every: int | None = None,
    last: int | None = None,
) -> Iterator[dict[str, Any]]:
    """A run's records in step order, streamed where run.db allows it."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    if not run.path.is_dir():
        raise FileNotFoundError(f"no such run directory: {run.path}")
    if run.event_files() or run.db.exists():
        store = Store(run)
        try:
            if store.series_format() >= 2:
                yield from _stream(store, since, every, last)
                return
        finally:
            store.close()
    yield from _narrow(_records_whole(run), since, every, last)


def _records_whole(run: RunDir) -> list[dict[str, Any]]:
    """The whole-run merge through the parsers (logs, an older run.db, un-ingested files)."""
    if run.event_files():
        return merge_by_step(_records_from_events(run))
    per_source = []
    for path, rank in run_metric_files(run):
        fm = FileMetrics(path, rank)
        fm.poll(final=True)
        per_source.append(fm.records())
    return merge_by_step(per_source)


def _records_from_events(run: RunDir) -> list[list[dict[str, Any]]]:
    by_rank: dict[int, list[dict[str, Any]]] = {}
    with Store(run) as store:
        events = store.events()
    for e in events:
        rank = e.get("rank")
        by_rank.setdefault(rank if isinstance(rank, int) else -1, []).append(e)
    out = []
    for rank in sorted(by_rank, key=lambda r: (r < 0, r)):
        parser = MetricsParser(rank if rank >= 0 else None)
        parser.feed_dicts(by_rank[rank])
        out.append(parser.records())
    return out


def _narrow(
    recs: list[dict[str, Any]], since: int | None, every: int | None, last: int | None
) -> Iterator[dict[str, Any]]:
    if since is not None:
        recs = [r for r in recs if r["step"] >= since]
    if every:
        recs = [r for r in recs if r["step"] % every == 0]
    if last is not None:
        recs = recs[-last:] if last > 0 else []
    return iter(recs)


# -- the SQL stream -------------------------------------------------------------------------


def _record(rank: int, step: int, row: tuple | None, ev: tuple | None) -> dict[str, Any]:
    """One rank's record at a step, built as the parser builds it from that rank's events
    (same keys, same order; a NaN loss is None, as JSON prints it)."""
    if row is not None and row[12] is None and None not in row[1:11]:
        # a trainer's step: every field there (one dict display, no per-key test)
        rec: dict[str, Any] = {
            "step": step,
            "loss": row[2],
            "learning_rate": row[3],
            "grad_norm": row[4],
            "tokens_per_s": row[5],
            "step_s": row[6],
            "epoch": row[7],
            "rank": rank,
            "t": row[1],
            "tokens": row[8],
            "data_wait_s": row[9],
            "mem_gib": row[10],
        }
        if row[11]:
            rec["max_steps"] = row[11]
    else:
        rec = {"step": step}
        if row is not None:
            for key, i in _OUT:
                if row[i] is not None:
                    rec[key] = row[i]
            rec["rank"] = rank
            for key, i in _EXTRA:
                if row[i] is not None:
                    rec[key] = row[i]
            if row[12] and "loss" not in rec:
                rec["loss"] = None  # written, but not a number
            if row[11]:
                rec["max_steps"] = row[11]
    if ev is not None:  # an eval merges into its step's record: its keys go last
        rec.update(_eval_part(rank, ev))
    return rec


def _eval_part(rank: int, ev: tuple) -> dict[str, Any]:
    part: dict[str, Any] = {"step": ev[0]}
    if ev[2] is not None:
        part["eval_loss"] = ev[2]
    part["rank"] = rank
    if ev[1] is not None:
        part["t"] = ev[1]
    if ev[3]:
        part["max_steps"] = ev[3]
    return part


class Rendered(str):
    """A record already written as its indented JSON text (a trainer's full step row, by
    `_FULL`: what json.dump(indent=2) prints for it, without a dict or the encoder)."""


class Written:
    """Records the native writer wrote as one text (thousands of rows), held as it came: a
    str subclass such as Rendered copies the text it is made from, 390 MB over 1M steps."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


_FULL = (
    '  {\n    "step": %d,\n    "loss": %r,\n    "learning_rate": %r,\n    "grad_norm": %r,'
    '\n    "tokens_per_s": %r,\n    "step_s": %r,\n    "epoch": %r,\n    "rank": %d,\n    '
    '"t": %r,\n    "tokens": %r,\n    "data_wait_s": %r,\n    "mem_gib": %r'
)


def _rendered(rank: int, row: tuple) -> Rendered | None:
    """`_record`'s JSON text for a full step row without an eval; None for any other."""
    if row[12] is not None or None in row[1:11]:
        return None
    text = _FULL % (
        row[0],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        row[7],
        rank,
        row[1],
        row[8],
        row[9],
        row[10],
    )
    if row[11]:
        return Rendered(f'{text},\n    "max_steps": {row[11]!r}\n  }}')
    return Rendered(text + "\n  }")


def _stream(
    store: Store, since: int | None, every: int | None, last: int | None, text: bool = False
) -> Iterator[dict[str, Any]]:
    """The records; with `text`, a trainer's full step row comes as its JSON text
    (`Rendered`, or `Written` for a run of them) unless another rank has to be merged into
    it."""
    ranks = store.metric_ranks()
    if not ranks:
        return
    src = store.metric_sources()
    lead, others = ranks[0], ranks[1:]
    floor = since
    if last is not None and last > 0 and others:
        # no step below the lead's own N-th highest can be among the N highest of all: the
        # other ranks are asked only from there (a run logging every 10 steps, whose lead is
        # not contiguous, compared every step of every rank for `--last 100`)
        mine = sorted(
            set(src.last_steps(lead, "step", last, since, every))
            | set(src.last_steps(lead, "eval", last, since, every)),
            reverse=True,
        )[:last]
        if len(mine) == last:
            floor = mine[-1]
    special, fill_keys = _where_others_count(src, lead, others, floor)
    extra = sorted(
        s for s in special if (since is None or s >= since) and (not every or s % every == 0)
    )
    if last is not None:
        if last <= 0:
            return
        # the N highest steps any record has: the lead's rows and the other ranks' own steps
        tops = sorted(
            set(src.last_steps(lead, "step", last, since, every))
            | set(src.last_steps(lead, "eval", last, since, every))
            | set(extra),
            reverse=True,
        )[:last]
        if not tops:
            return
        since = tops[-1]
        extra = [s for s in extra if s >= since]
    steps = src.rows(lead, "step", since, every)
    evals = src.rows(lead, "eval", since, every)
    never = float("inf")
    ev = next(evals, None)
    xi = 0
    nx = extra[0] if extra else never

    def others_only(s: int) -> dict[str, Any] | None:
        """A record at a step the lead has no step row for (an eval of its own, or only
        the other ranks' rows)."""
        nonlocal ev, xi, nx
        mine = None
        if ev is not None and ev[0] == s:
            mine = _record(lead, s, None, ev)
            ev = next(evals, None)
        if nx == s:
            xi += 1
            nx = extra[xi] if xi < len(extra) else never
            return _merged(src, s, mine, others)
        if mine is not None and fill_keys and not fill_keys <= mine.keys():
            return _merged(src, s, mine, others)
        return mine

    need_max = "max_steps" in fill_keys
    for row, chunk in _batched(steps, text and fastscan is not None):
        if chunk is not None:
            # rows in a batch: the run of full rows before the next eval or merged step is
            # written by the native module in one call (the same text, ~5x faster)
            stop = min(ev[0] if ev is not None else never, nx)
            body, nxt = fastscan.step_text(
                chunk, row, stop if stop < never else _NO_STOP, lead, need_max
            )
            if nxt > row:
                yield Written(body)
                chunk.skip = nxt
                continue
            row = chunk[row]
        s = row[0]
        while (ev is not None and ev[0] < s) or nx < s:
            first = min(ev[0] if ev is not None else never, nx)
            rec = others_only(first)
            if rec is not None:
                yield rec
        if ev is not None and ev[0] == s:
            rec = _record(lead, s, row, ev)
            ev = next(evals, None)
        elif (
            text
            and nx != s
            and (row[11] or "max_steps" not in fill_keys)
            and (out := _rendered(lead, row)) is not None
        ):  # has every key there is
            yield out
            continue
        else:
            rec = _record(lead, s, row, None)
        if nx == s:
            xi += 1
            nx = extra[xi] if xi < len(extra) else never
            rec = _merged(src, s, rec, others)
        elif (fill_keys and not fill_keys <= rec.keys()) or (row[12] and others):
            # a NaN loss puts "loss" late in the lead's record: another rank's record at the
            # step sets the key order, as in the whole-run merge
            rec = _merged(src, s, rec, others)
        yield rec
    while ev is not None or nx < never:
        rec = others_only(min(ev[0] if ev is not None else never, nx))
        if rec is not None:
            yield rec


_NO_STOP = 1 << 62


class _Batch(list):
    """A fetched batch of rows; `skip` is the next index to hand out."""

    skip = 0


def _batched(cur: Iterator[tuple], batches: bool) -> Iterator[tuple[Any, _Batch | None]]:
    """The cursor's rows as (row, None); with `batches`, as (index, batch) from batches
    fetched 4096 at a time (the consumer may move `batch.skip` past rows it wrote)."""
    if not batches:
        for row in cur:
            yield row, None
        return
    while batch := _Batch(cur.fetchmany(4096)):
        while batch.skip < len(batch):
            i = batch.skip
            batch.skip = i + 1
            yield i, batch


def _where_others_count(
    src: MetricSources, lead: int, others: list[int], floor: int | None = None
) -> tuple[set[int], set[str]]:
    """Steps (from `floor` on) where another rank adds a record or an eval the lead lacks,
    and the keys some other rank ever has (a lead record lacking one is merged with the
    others')."""
    special: set[int] = set()
    if not others:
        return special, set()
    n0, a0, b0 = src.span(lead)
    contiguous = n0 and n0 == b0 - a0 + 1
    lead_evals = {s for (s, *_) in src.rows(lead, "eval", floor)}
    fill: set[str] = set()
    cols = [c for c in METRIC_STEP_COLS if c in _KEY_OF_COL]
    for r in others:
        n, a, b = src.span(r, count=False)
        if a is not None and not (contiguous and a >= a0 and b <= b0):
            # a live run: the others may be a few steps ahead of the lead
            special.update(src.missing(r, lead, (a0, b0) if contiguous else None, floor))
        for s, *_ in src.rows(r, "eval", floor):
            if s not in lead_evals:
                special.add(s)
        # where its record lacks a key the lead's may have, the merge moves that key last
        special.update(src.gaps(r, floor))
        for c in cols:
            if _KEY_OF_COL[c] not in fill and src.has(r, "step", c):
                fill.add(_KEY_OF_COL[c])
    return special, fill


def _merged(
    src: MetricSources, step: int, lead_rec: dict[str, Any] | None, others: list[int]
) -> dict[str, Any] | None:
    """The record at a step from every rank's, as the whole-run merge made it: the first
    rank's values win, each later rank fills what is missing and sets the key order."""
    merged = lead_rec
    for r in others:
        rows = list(src.rows(r, "step", steps=[step]))
        evs = list(src.rows(r, "eval", steps=[step]))
        if not rows and not evs:
            continue
        rec = _record(r, step, rows[0] if rows else None, evs[0] if evs else None)
        merged = rec if merged is None else {**rec, **merged}
    return merged


# -- output ---------------------------------------------------------------------------------


def records(ref: str | Path) -> list[dict[str, Any]]:
    """`tunedeck metrics RUN_OR_FILE`: a file, a run directory, or a run id/prefix/name."""
    return list(iter_records(ref))


class Records:
    """`iter_records`'s result: JSON-safe records (None for NaN) in step order; `plain`
    when every value is a number or None (the SQL stream's), which write_json encodes in
    batches."""

    def __init__(self, recs: Iterator[dict[str, Any]], plain: bool) -> None:
        self.recs = recs
        self.plain = plain

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.recs

    def __next__(self) -> dict[str, Any]:
        return next(self.recs)


def iter_records(
    ref: str | Path,
    since: int | None = None,
    every: int | None = None,
    last: int | None = None,
    text: bool = False,
) -> Records:
    """`tunedeck metrics RUN_OR_FILE`'s records. A missing run or file raises
    FileNotFoundError here, before the first record. `text`: for write_json (records may
    come as their JSON text)."""
    p = Path(ref)
    if p.is_file():
        return Records(map(json_safe, _narrow(records_from_file(p), since, every, last)), False)
    run = RunDir(p if p.is_dir() else _find(str(ref)))
    if not run.path.is_dir():
        raise FileNotFoundError(f"no such run directory: {run.path}")
    if run.event_files() or run.db.exists():
        store = Store(run)
        if store.series_format() >= 2:
            return Records(_closing(store, _stream(store, since, every, last, text)), True)
        store.close()
    return Records(map(json_safe, _narrow(_records_whole(run), since, every, last)), False)


def _find(ref: str) -> Path:
    from tunedeck.core.views.registry import find_run

    return find_run(ref).run_dir


def _closing(store: Store, recs: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    try:
        yield from recs
    finally:
        store.close()


def json_safe(rec: dict[str, Any]) -> dict[str, Any]:
    for k, v in rec.items():
        if type(v) is float and not math.isfinite(v):
            return {
                k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in rec.items()
            }
    return rec


def write_json(
    recs: Iterable[dict[str, Any]], out: IO[str], batch: int = 2000, plain: bool = False
) -> None:
    """`json.dump(list(recs), out, indent=2)` and a newline, written as it goes: records of
    numbers are encoded a batch at a time by the C encoder and re-indented (no key or value
    of such a record holds a brace or a quote-comma). `plain`: the caller knows every value
    is a number or None."""
    sep = "[\n"
    dicts: list[dict[str, Any]] = []
    for r in recs:
        kind = type(r)
        if kind is Written or kind is Rendered:  # text already: out at once, not copied
            if dicts:
                out.write(sep + _encode(dicts, plain))
                sep = ",\n"
                dicts = []
            out.write(sep)
            out.write(r.text if kind is Written else r)
            sep = ",\n"
        else:
            dicts.append(r)
            if len(dicts) >= batch:
                out.write(sep + _encode(dicts, plain))
                sep = ",\n"
                dicts = []
    if dicts:
        out.write(sep + _encode(dicts, plain))
        sep = ",\n"
    out.write("[]\n" if sep == "[\n" else "\n]\n")


def _encode(recs: list[dict[str, Any]], plain: bool) -> str:
    """Records as json.dump(indent=2) prints them inside a list, joined by ",\\n"."""
    if not plain and any(not _plain(r) for r in recs):  # text values: the exact encoder
        return ",\n".join("  " + json.dumps(r, indent=2).replace("\n", "\n  ") for r in recs)
    flat = json.dumps(recs)[2:-2]
    return (
        "  {\n    " + flat.replace("}, {", "\n  },\n  {\n    ").replace(', "', ',\n    "') + "\n  }"
    )


def _plain(rec: dict[str, Any]) -> bool:
    return all(v is None or type(v) in (int, float) for v in rec.values())
