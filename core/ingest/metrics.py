"""Per-step training metrics from any log format, with one set of key names.

    records_from_file(path)    a log file, a rank's stdout, ms-swift logging.jsonl, events
    records_from_run(run_dir)  a tunedeck run directory (all ranks, de-duplicated by step)

Each record: `step` plus whichever of `max_steps, loss, learning_rate, grad_norm, epoch,
eval_loss, tokens_per_s, samples_per_s, step_s` the source had (built-in events add `rank, t,
tokens, data_wait_s, mem_gib`). Non-finite values (a NaN loss) are kept as float('nan') /
inf here; `to_json_safe` turns them into None for JSON output.

Files are read by byte offset through `TextTail`, so the same objects serve a live run:
keep a `FileMetrics` and call `poll()`; each poll costs only what was appended since.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Iterable

from tunedeck.core.ingest.columns import BatchList, RecordBatch
from tunedeck.core.ingest.native import fastscan
from tunedeck.core.ingest.parsers import LineAssembler, parse_metrics_line

_EVENT_EXTRA = ("rank", "t", "tokens", "data_wait_s", "mem_gib")
# Reads of 1 MB stay in the CPU cache for the parse that follows (a 57 MB log polls ~20 %
# faster than with 8 MB reads); a line is cut only past MAX_LINE.
READ_BYTES = 1 << 20
MAX_LINE = 8 << 20


class TextTail:
    """Logical lines appended to a file since the last call (byte offsets, never re-reads).

    Unlike splitting on every line break, `\\r` stays inside a line so the assembler can see
    tqdm redraws for what they are. A file that shrank is read again from its start.
    """

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = Path(path)
        self.offset = offset
        self.lineno = 0          # physical lines consumed so far (for file:line evidence)
        self.assembler = LineAssembler()

    def _check_size(self) -> bool:
        """False when the file is gone; a file that shrank is read again from its start."""
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return False
        if size < self.offset:
            self.offset, self.lineno, self.assembler = 0, 0, LineAssembler()
        return True

    def chunks(self, count_lines: bool = True):
        """(line number before the chunk, bytes of complete lines) for what was appended;
        advances offset and lineno as each chunk is handed out (lineno only when
        `count_lines`: a reader that cites no line numbers skips the count)."""
        if not self._check_size():
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            while True:
                data = f.read(READ_BYTES)
                if not data:
                    break
                end = data.rfind(b"\n")
                while end < 0 and len(data) < MAX_LINE:   # a long line: read on
                    more = f.read(READ_BYTES)
                    if not more:
                        break
                    data += more
                    end = data.rfind(b"\n")
                if end < 0:
                    if len(data) < MAX_LINE:
                        break  # a line still being written: next poll
                    end = len(data) - 1   # over-long: cut here
                chunk = data[: end + 1]
                self.offset += len(chunk)
                f.seek(self.offset)
                base = self.lineno
                if count_lines:
                    self.lineno += chunk.count(b"\n")
                yield base, chunk

    def views(self):
        """Like chunks(count_lines=False) without a copy per chunk: (view, end), [0, end) of
        the view holding complete lines. The view is a reused buffer, valid only until the
        next one. A line longer than the buffer goes through chunks()."""
        if not self._check_size():
            return
        buf = bytearray(READ_BYTES)
        view = memoryview(buf)
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            while True:
                n = f.readinto(buf)
                if not n:
                    return
                end = buf.rfind(b"\n", 0, n) + 1
                if not end:
                    if n < len(buf):
                        return  # a line still being written: next poll
                    break       # a long line
                self.offset += end
                f.seek(self.offset)
                yield view, end
        for _, chunk in self.chunks(count_lines=False):
            yield chunk, len(chunk)

    def read(self, final: bool = False) -> list[tuple[int, str]]:
        """(line number, logical line) pairs; `final` also returns an unterminated last line."""
        out: list[tuple[int, str]] = []
        for base, chunk in self.chunks():
            phys = chunk.decode("utf-8", errors="replace").split("\n")[:-1]
            for i, line in enumerate(phys):
                for logical in self.assembler.feed_lines((line,)):
                    out.append((base + i + 1, logical))
        if final:
            out.extend((self.lineno, s) for s in self.assembler.flush())
        return out


class MetricsParser:
    """Turns logical lines of one source (one rank's output) into records keyed by step."""

    def __init__(self, rank: int | None = None) -> None:
        self.rank = rank
        self.by_step: dict[int, dict[str, Any]] = {}
        self.progress: dict[int, dict[str, Any]] = {}  # from tqdm bars, used if nothing else
        self.max_steps: int | None = None
        self.last_step = 0
        self.top_step = -math.inf      # the highest step in by_step and batches
        # native batches: steps rising, disjoint from each other and from by_step
        self.batches: list[RecordBatch] = []
        self.bar_step: int | None = None

    def feed(self, lines: Iterable[str]) -> list[dict[str, Any]]:
        """New or updated records for these lines."""
        touched: dict[int, dict[str, Any]] = {}
        self.feed_into(lines, touched)
        return [touched[s] for s in sorted(touched)]

    def feed_into(self, lines: Iterable[str], touched: dict[int, dict[str, Any]]) -> None:
        for line in lines:
            got = parse_metrics_line(line)
            if got is not None:
                self._add(*got, touched)

    def absorb(self, batch: RecordBatch, ascending: bool, touched: dict[int, dict[str, Any]],
               new: list[RecordBatch]) -> None:
        """Records the native reader made. The common case, steps rising past everything seen,
        needs no merging: the batch is kept whole, as columns (`batches`)."""
        if ascending and batch.first > self.top_step:
            self.batches.append(batch)
            new.append(batch)
            self.last_step = self.top_step = batch.last
            return
        for rec in batch.rows():
            self._merge(rec["step"], rec, touched)

    def feed_dicts(self, dicts: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Like feed, for metric dicts already parsed (events read back from run.db)."""
        touched: dict[int, dict[str, Any]] = {}
        for d in dicts:
            self._add("dict", d, touched)
        return [touched[s] for s in sorted(touched)]

    def spill(self, batches: list[RecordBatch]) -> None:
        """Turn these kept batches into by_step records, so they can be merged."""
        for b in batches:
            self.batches.remove(b)
            self.by_step.update((r["step"], r) for r in b.rows())

    def _add(self, fmt: str, raw: dict[str, Any], touched: dict[int, dict[str, Any]]) -> None:
        if fmt == "tqdm":
            self._bar(raw)
            return
        rec = self._normalise(fmt, raw)
        if rec is None:
            return
        self._merge(rec["step"], rec, touched)

    def _merge(self, step: int, rec: dict[str, Any], touched: dict[int, dict[str, Any]]) -> None:
        if self.batches and step <= self.top_step:   # a restart repeating kept steps
            self.spill([b for b in self.batches if b.first <= step <= b.last])
        cur = self.by_step.get(step)
        if cur is None or "eval_loss" in rec and "loss" not in rec:
            merged = {**(cur or {}), **rec}
        else:
            merged = rec if "loss" in rec else {**cur, **rec}  # a restart repeats: later wins
        self.by_step[step] = merged
        touched[step] = merged
        self.last_step = step
        if step > self.top_step:
            self.top_step = step

    def records(self) -> list[dict[str, Any]]:
        if self.batches:
            kept = [r for b in self.batches for r in b.rows()]
            if not self.by_step:
                return kept
            return sorted((*self.by_step.values(), *kept), key=lambda r: r["step"])
        src = self.by_step or self.progress
        return [src[s] for s in sorted(src)]

    # -- per format ----------------------------------------------------------------------

    def _bar(self, raw: dict[str, Any]) -> None:
        if raw["total"] <= 0:
            return
        self.bar_step = raw["n"]
        self.max_steps = self.max_steps or raw["total"]
        rec = {"step": raw["n"], "max_steps": raw["total"]}
        if "s_per_it" in raw:
            rec["step_s"] = raw["s_per_it"]
        elif raw.get("it_per_s"):
            rec["step_s"] = 1.0 / raw["it_per_s"]
        if raw["n"] > 0:
            self.progress[raw["n"]] = rec

    def _normalise(self, fmt: str, d: dict[str, Any]) -> dict[str, Any] | None:
        if fmt == "torchtitan":
            rec = {"step": d["step"]}
            _copy(rec, d, (("loss", "loss"), ("grad_norm", "grad_norm"), ("lr", "learning_rate"),
                           ("tps", "tokens_per_s"), ("memory_gib", "mem_gib"), ("mfu", "mfu")))
            return self._finish(rec)
        if fmt == "deepspeed":
            rec = {"step": d["step"]}
            _copy(rec, d, (("lr", "learning_rate"), ("samples_per_s", "samples_per_s")))
            return self._finish(rec) if len(rec) > 1 else None
        return self._dict(d)

    def _dict(self, d: dict[str, Any]) -> dict[str, Any] | None:
        kind = d.get("kind")
        if kind is not None:  # built-in event stream
            if kind == "start" and isinstance(d.get("max_steps"), int):
                self.max_steps = d["max_steps"]
            if kind not in ("step", "eval") or not isinstance(d.get("step"), int):
                return None
            rec = {"step": d["step"]}
            _copy(rec, d, (("loss", "loss"), ("lr", "learning_rate"),
                           ("grad_norm", "grad_norm"), ("tokens_per_s", "tokens_per_s"),
                           ("step_s", "step_s"), ("epoch", "epoch"), ("eval_loss", "eval_loss")))
            if kind == "eval" and "loss" in rec and "eval_loss" not in rec:
                rec["eval_loss"] = rec.pop("loss")
            for k in _EVENT_EXTRA:
                if d.get(k) is not None:
                    rec[k] = d[k]
            if rec.get("loss") is None and kind == "step" and "loss" in d:
                rec["loss"] = math.nan  # the stream writes a NaN loss as null
            return self._finish(rec)
        if "train_runtime" in d or "log_history" in d or "model_parameter_info" in d:
            return None  # end-of-training summary, not a step
        rec: dict[str, Any] = {}
        frac = d.get("global_step/max_steps") or d.get("iteration")
        if isinstance(frac, str) and "/" in frac:
            a, _, b = frac.partition("/")
            if a.strip().isdigit():
                rec["step"] = int(a)
            if b.strip().isdigit():
                rec["max_steps"] = int(b)
        for key in ("step", "global_step", "steps"):
            if "step" not in rec and isinstance(d.get(key), (int, float)) and \
                    not isinstance(d.get(key), bool):
                rec["step"] = int(d[key])
        _copy(rec, d, (("loss", "loss"), ("learning_rate", "learning_rate"), ("lr", "learning_rate"),
                       ("grad_norm", "grad_norm"), ("epoch", "epoch"), ("eval_loss", "eval_loss"),
                       ("train_speed(s/it)", "step_s"), ("tokens_per_second", "tokens_per_s"),
                       ("samples_per_second", "samples_per_s")))
        speed = d.get("train_speed(iter/s)")
        if _num(speed) and speed > 0:
            rec["step_s"] = 1.0 / speed
        if not any(k in rec for k in ("loss", "eval_loss", "learning_rate", "grad_norm")):
            return None  # some other dict (config dump, summary line of a script)
        if "step" not in rec:
            # HF Trainer dicts carry no step: use the progress bar, else count log lines
            eval_only = "loss" not in rec and "eval_loss" in rec
            rec["step"] = self.bar_step if self.bar_step is not None else (
                self.last_step if eval_only else self.last_step + 1)
        return self._finish(rec)

    def _finish(self, rec: dict[str, Any]) -> dict[str, Any]:
        if "max_steps" in rec:
            self.max_steps = rec["max_steps"]
        elif self.max_steps:
            rec["max_steps"] = self.max_steps
        if self.rank is not None and "rank" not in rec:
            rec["rank"] = self.rank
        return rec


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _copy(rec: dict[str, Any], d: dict[str, Any], pairs) -> None:
    for src, dst in pairs:
        v = d.get(src)
        if _num(v) and dst not in rec:
            rec[dst] = v


class FileMetrics:
    """Incremental records of one file: `poll()` parses only what was appended."""

    # the native reader when built; False forces the pure-Python path (tests)
    native: bool = fastscan is not None

    def __init__(self, path: Path, rank: int | None = None) -> None:
        self.tail = TextTail(Path(path))
        self.parser = MetricsParser(rank)

    def poll(self, final: bool = False) -> Sequence[dict[str, Any]]:
        """New or updated records, in step order (a BatchList: dicts built when read)."""
        if not self.native:
            return self.parser.feed(line for _, line in self.tail.read(final=final))
        # Console dict lines go through the native reader in runs; any other line (and every
        # line while a hard-wrapped dict is open) goes through the assembler and the parser.
        parser, asm = self.parser, self.tail.assembler
        touched: dict[int, dict[str, Any]] = {}
        new: list[RecordBatch] = []
        for chunk, n in self.tail.views():
            pos = 0
            while pos < n:
                if not asm.is_open:
                    pos, count, *cols, ascending, parser.max_steps, parser.bar_step = \
                        fastscan.dict_records(chunk, pos, n, parser.max_steps, parser.bar_step)
                    if count:
                        parser.absorb(RecordBatch(*cols, parser.rank), ascending, touched, new)
                end = _find_newline(chunk, pos, n)
                if end < 0:
                    break   # the cut end of an over-long line, dropped as TextTail.read does
                parser.feed_into(asm.feed_lines((str(chunk[pos:end], "utf-8", "replace"),)),
                                 touched)
                pos = end + 1
        if final:
            parser.feed_into(asm.flush(), touched)
        if not touched:
            return BatchList(new)
        # records of both kinds in this poll. A kept batch shares no step with by_step
        # (merging a kept step spills its batch into by_step first); a spilled one is there.
        out = dict(touched)
        for b in new:
            if b in parser.batches:
                out.update((r["step"], r) for r in b.rows())
            else:
                out.update((s, parser.by_step[s]) for s in b.steps.tolist())
        return [out[s] for s in sorted(out)]

    def records(self) -> list[dict[str, Any]]:
        return self.parser.records()


def _find_newline(buf, start: int, end: int) -> int:
    """bytes.find for a bytes chunk or a memoryview (which has no find)."""
    if isinstance(buf, bytes):
        return buf.find(b"\n", start, end)
    return buf.obj.find(b"\n", start, end)


def records_from_file(path: str | Path) -> list[dict[str, Any]]:
    """One record per step from a log or metrics file of any supported format."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    fm = FileMetrics(path)
    fm.poll(final=True)
    return fm.records()


def merge_by_step(sources: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """De-duplicate records of several ranks by step: the first source (lowest rank) wins
    for every key it has; the others only fill keys it lacks."""
    merged: dict[int, dict[str, Any]] = {}
    for recs in sources:
        for r in recs:
            cur = merged.get(r["step"])
            merged[r["step"]] = dict(r) if cur is None else {**r, **cur}
    return [merged[s] for s in sorted(merged)]


def run_metric_files(run_dir: Path) -> list[tuple[Path, int | None]]:
    """The best metric source of a run: built-in events, else ms-swift logging.jsonl, else the
    ranks' own output (latest attempt), as (path, rank) in rank order."""
    from tunedeck.core.runs.store import event_files, rank_of  # lazy, as read_events below

    events = event_files(run_dir)
    if events:
        return [(p, rank_of(p)) for p in events]
    from tunedeck.core.diagnose.sources import logging_jsonl_files, rank_logs  # lazy: diagnose uses ingest

    jsonl = logging_jsonl_files(run_dir)
    if jsonl:
        return [(jsonl[-1], 0)]

    logs = rank_logs(run_dir, latest_only=True)
    return [(s.path, s.rank) for s in logs if s.path.name == "stdout.log"] or \
        [(s.path, s.rank) for s in logs]


def records_from_run(run_dir: str | Path) -> list[dict[str, Any]]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no such run directory: {run_dir}")
    sources = run_metric_files(run_dir)
    if sources and sources[0][0].parent == run_dir / "events":
        # event streams: what the agent already ingested into run.db plus what it has not
        # read yet, so a week-long run is not re-parsed from its files on every call
        return merge_by_step(_records_from_events(run_dir))
    per_source = []
    for path, rank in sources:
        fm = FileMetrics(path, rank)
        fm.poll(final=True)
        per_source.append(fm.records())
    return merge_by_step(per_source)


def _records_from_events(run_dir: Path) -> list[list[dict[str, Any]]]:
    from tunedeck.core.runs.store import read_events

    by_rank: dict[int, list[dict[str, Any]]] = {}
    for e in read_events(run_dir):
        rank = e.get("rank")
        by_rank.setdefault(rank if isinstance(rank, int) else -1, []).append(e)
    out = []
    for rank in sorted(by_rank, key=lambda r: (r < 0, r)):
        parser = MetricsParser(rank if rank >= 0 else None)
        parser.feed_dicts(by_rank[rank])
        out.append(parser.records())
    return out


def records(ref: str | Path) -> list[dict[str, Any]]:
    """`tunedeck metrics RUN_OR_FILE`: a file, a run directory, or a run id/prefix/name."""
    p = Path(ref)
    if p.is_file():
        return records_from_file(p)
    if p.is_dir():
        return records_from_run(p)
    from tunedeck.core.runs.registry import find_run

    return records_from_run(find_run(str(ref)).run_dir)


def to_json_safe(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in r.items()} for r in recs]
