"""Per-step training metrics from any log format, with one set of key names.

    records_from_file(path)    a log file, a rank's stdout, ms-swift logging.jsonl, events
    (a run's records, all ranks: tunedeck.core.views.metrics)

Each record: `step` plus whichever of `max_steps, loss, learning_rate, grad_norm, epoch,
eval_loss, tokens_per_s, samples_per_s, step_s` the source had (built-in events add `rank, t,
tokens, data_wait_s, mem_gib`). Non-finite values (a NaN loss) are kept as float('nan') /
inf here; `to_json_safe` turns them into None for JSON output.

Files are read by byte offset through `Tail`, so the same objects serve a live run:
keep a `FileMetrics` and call `poll()`; each poll costs only what was appended since.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from collections.abc import Iterable

from tunedeck.core.ingest.columns import BatchList, RecordBatch
from tunedeck.core.ingest.native import fastscan
from tunedeck.core.ingest.parsers import parse_metrics_line
from tunedeck.core.ingest.tail import Tail

_EVENT_EXTRA = ("rank", "t", "tokens", "data_wait_s", "mem_gib")


class MetricsParser:
    """Turns logical lines of one source (one rank's output) into records keyed by step.

    HF Trainer dicts carry no step. By default they take the progress bar's step (else they
    are counted); with `logging_steps` (known from the script's own arguments) the n-th one
    is step n x logging_steps, which a bar redrawn at its own pace cannot get wrong.
    """

    def __init__(self, rank: int | None = None, logging_steps: int | None = None) -> None:
        self.rank = rank
        self.logging_steps = logging_steps
        self.counted = 0  # step-less train dicts seen (with logging_steps)
        self.by_step: dict[int, dict[str, Any]] = {}
        self.progress: dict[int, dict[str, Any]] = {}  # from tqdm bars, used if nothing else
        self.max_steps: int | None = None
        self.last_step = 0
        self.top_step = -math.inf  # the highest step in by_step and batches
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

    def absorb(
        self,
        batch: RecordBatch,
        ascending: bool,
        touched: dict[int, dict[str, Any]],
        new: list[RecordBatch],
    ) -> None:
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
        rec = self.normalise(fmt, raw)
        if rec is not None:
            self._merge(rec["step"], rec, touched)

    def normalise(self, fmt: str, raw: dict[str, Any]) -> dict[str, Any] | None:
        """One line's record (`parse_metrics_line`'s result), not merged with others of its
        step. A tqdm bar gives None: it moves the bar step and the progress records."""
        if fmt == "tqdm":
            self._bar(raw)
            return None
        return self._normalise(fmt, raw)

    def _merge(self, step: int, rec: dict[str, Any], touched: dict[int, dict[str, Any]]) -> None:
        if self.batches and step <= self.top_step:  # a restart repeating kept steps
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
        if "loss" in raw:
            rec["loss"] = raw["loss"]
        if raw["n"] > 0:
            self.progress[raw["n"]] = rec

    def _normalise(self, fmt: str, d: dict[str, Any]) -> dict[str, Any] | None:
        if fmt == "torchtitan":
            rec = {"step": d["step"]}
            _copy(
                rec,
                d,
                (
                    ("loss", "loss"),
                    ("grad_norm", "grad_norm"),
                    ("lr", "learning_rate"),
                    ("tps", "tokens_per_s"),
                    ("memory_gib", "mem_gib"),
                    ("mfu", "mfu"),
                ),
            )
            return self._finish(rec)
        if fmt == "plain":
            return self._finish(dict(d))
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
            _copy(
                rec,
                d,
                (
                    ("loss", "loss"),
                    ("lr", "learning_rate"),
                    ("grad_norm", "grad_norm"),
                    ("tokens_per_s", "tokens_per_s"),
                    ("step_s", "step_s"),
                    ("epoch", "epoch"),
                    ("eval_loss", "eval_loss"),
                ),
            )
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
        if _num(d.get("total_steps")) and not isinstance(d["total_steps"], bool):
            rec["max_steps"] = int(d["total_steps"])
        for key in ("step", "global_step", "steps", "current_steps", "iter"):
            if (
                "step" not in rec
                and isinstance(d.get(key), (int, float))
                and not isinstance(d.get(key), bool)
            ):
                rec["step"] = int(d[key])
        _copy(
            rec,
            d,
            (
                ("loss", "loss"),
                ("learning_rate", "learning_rate"),
                ("lr", "learning_rate"),
                ("grad_norm", "grad_norm"),
                ("epoch", "epoch"),
                ("eval_loss", "eval_loss"),
                ("train_speed(s/it)", "step_s"),
                ("tokens_per_second", "tokens_per_s"),
                ("train_tokens_per_second", "tokens_per_s"),
                ("tokens_per_s", "tokens_per_s"),
                ("samples_per_second", "samples_per_s"),
                ("memory(GiB)", "mem_gib"),
                ("token_acc", "token_acc"),
            ),
        )
        speed = d.get("train_speed(iter/s)")
        if _num(speed) and speed > 0:
            rec["step_s"] = 1.0 / speed
        if not any(k in rec for k in ("loss", "eval_loss", "learning_rate", "grad_norm")):
            return None  # some other dict (config dump, summary line of a script)
        if "step" not in rec:
            # HF Trainer dicts carry no step: use the progress bar, else count log lines
            eval_only = "loss" not in rec and "eval_loss" in rec
            if self.logging_steps:
                self.counted += 0 if eval_only else 1
                rec["step"] = self.counted * self.logging_steps
            else:
                rec["step"] = (
                    self.bar_step
                    if self.bar_step is not None
                    else (self.last_step if eval_only else self.last_step + 1)
                )
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
        self.tail = Tail(path)
        self.parser = MetricsParser(rank)

    def poll(self, final: bool = False) -> Sequence[dict[str, Any]]:
        """New or updated records, in step order (a BatchList: dicts built when read)."""
        if not self.native:
            return self.parser.feed(line for _, line in self.tail.logical_lines(final=final))
        # Console dict lines go through the native reader in runs; any other line (and every
        # line while a hard-wrapped dict is open) goes through the assembler and the parser.
        parser, asm = self.parser, self.tail.assembler
        touched: dict[int, dict[str, Any]] = {}
        new: list[RecordBatch] = []
        for chunk, n in self.tail.views():
            pos = 0
            while pos < n:
                if not asm.is_open:
                    pos, count, *cols, ascending, parser.max_steps, parser.bar_step = (
                        fastscan.dict_records(chunk, pos, n, parser.max_steps, parser.bar_step)
                    )
                    if count:
                        parser.absorb(RecordBatch(*cols, parser.rank), ascending, touched, new)
                end = _find_newline(chunk, pos, n)
                if end < 0:
                    break  # the cut end of an over-long line, dropped as Tail.logical_lines does
                parser.feed_into(
                    asm.feed_lines((str(chunk[pos:end], "utf-8", "replace"),)), touched
                )
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
    recs = fm.records()
    # a file ends where it was cut: steps after the last loss that carry no loss of their own
    # (an optimizer's step line whose loss line never came) say nothing about training
    if any("loss" in r for r in recs):
        while recs and "loss" not in recs[-1] and "eval_loss" not in recs[-1]:
            recs.pop()
    return recs


def merge_by_step(sources: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """De-duplicate records of several ranks by step: the first source (lowest rank) wins
    for every key it has; the others only fill keys it lacks."""
    merged: dict[int, dict[str, Any]] = {}
    for recs in sources:
        for r in recs:
            cur = merged.get(r["step"])
            merged[r["step"]] = dict(r) if cur is None else {**r, **cur}
    return [merged[s] for s in sorted(merged)]


def to_json_safe(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
        for r in recs
    ]
