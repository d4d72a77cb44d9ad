"""One file's evidence, gathered incrementally: rule hits, Python tracebacks, torchrun's
failure reports, NCCL setup, metric records. `FileScanner.poll()` reads only what was appended
since the last poll, so a live run can be re-diagnosed cheaply."""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunedeck.core.diagnose.rules import (
    NCCL_FACT_TOKENS,
    REPORT_TOKENS,
    TIME_HINT,
    TIME_HINT_STR,
    TOKENS,
    Rule,
    match_line,
)
from tunedeck.core.rundir import Source
from tunedeck.core.ingest.metrics import MetricsParser
from tunedeck.core.ingest.tail import Tail
from tunedeck.core.ingest.native import fastscan
from tunedeck.core.ingest.parsers.nccl import (
    CHANNEL_VIA_BYTES,
    INFO_HEAD_BYTES,
    NcclSummary,
    last_enqueued_work,
    parse_nccl,
    transport_name,
)
from tunedeck.core.ingest.parsers.normalize import normalize, rejoin
from tunedeck.core.ingest.parsers.prefix import line_time, split_rank
from tunedeck.core.ingest.parsers.torchrun import (
    ChildFailedParser,
    ChildFailedReport,
    parse_torchrun_line,
)

MAX_TB_LINES = 80
PASTE_MAX = 1 << 20  # files up to this size are checked for terminal wrapping when read whole
# a rank named in the message itself, when no prefix named one: `[Rank 3]`, the NCCL
# watchdog's `[PG 0 Rank 3]` / `[PG ID 0 PG GUID 0(default_pg) Rank 3]`, DDP's `for rank 2:`
_RANK_IN_TEXT = re.compile(
    r"\[(?:PG [^\]]*?)?Rank (\d+)\]|\bfor rank (\d+):|\bon rank (\d+)\b"
    r"|\[Rank (\d+)\]|Duplicate GPU detected : rank (\d+)"
)
_FRAME = re.compile(r' {1,4}File "[^"]+", line \d+, in ')
_LOCAL_RANK_ARG = re.compile(r"--local[_-]rank=(\d+)")
# a glog / logging level that says the line is only a warning (c10d retrying a connect,
# binding IPv6 before IPv4): the rules it matches are warnings there, not failures
_WARN_LEVEL = re.compile(
    r"^(?:\[[^\]]*\]:)?\[?W\d{3,4} |^(?:\[[^\]]*\]:)?\[W [\w.]+:\d+\]"
    r"|^WARNING[: ]|\[WARNING\]"
)
_DEMOTE_ON_WARN = {"rendezvous_unreachable", "port_in_use", "nccl_network"}
# per-step timing of loggers that print data and step time: the PyTorch examples'
# `Time  1.234 ( 1.300)  Data  1.100 ( 1.150)`, mmengine/detectron2's `time: 1.2 data_time: 1.1`
_DATA_TIME = re.compile(
    r"\bTime\s+([\d.]+)\s*(?:\(\s*([\d.]+)\))?\s+Data\s+([\d.]+)\s*"
    r"(?:\(\s*([\d.]+)\))?"
)
_DATA_TIME2 = re.compile(
    r"\btime: ([\d.]+),?\s+data_time: ([\d.]+)|"
    r"\bdata_time: ([\d.]+),?\s+time: ([\d.]+)"
)
_SHARDS = re.compile(r"Loading checkpoint shards:\s*(\d+)%")


@dataclass
class Hit:
    rule: Rule
    rank: int | None
    lineno: int
    text: str
    t: float | None
    groups: dict[str, Any] = field(default_factory=dict)
    host: str | None = None  # from the line's prefix (pdsh, compose, kubectl)


@dataclass
class Traceback:
    rank: int | None
    start: int
    end: int
    lines: list[str]

    @property
    def exc_line(self) -> str:
        for line in reversed(self.lines):
            if line.strip() and not line.startswith((" ", "\t")):
                return line.strip()
        return ""


class _TbState:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.start = 0
        self.mode = "none"  # none | in | after_exc


class FileScanner:
    # the native classifier when built; False forces the pure-Python fast path (tests)
    native: bool = fastscan is not None
    # (b"\n{" needs no token there: the classifier looks at each line's first byte)
    _matcher = (
        fastscan.matcher([t for t in REPORT_TOKENS if b"\n" not in t], NCCL_FACT_TOKENS)
        if fastscan
        else None
    )

    def __init__(self, source: Source, year: int | None = None, metrics: bool = True) -> None:
        self.source = source
        self.tail = Tail(source.path)
        self.year = year
        self.hits: list[Hit] = []
        self.tracebacks: list[Traceback] = []
        self.reports: list[ChildFailedReport] = []
        self.torchrun_lines: list[tuple[int, dict[str, Any], float | None]] = []
        self.nccl = NcclSummary()
        self.nccl_ranks: dict[int, int] = {}  # pid → NCCL rank seen in comm lines
        self.metrics = MetricsParser(source.rank)
        # the agent reads metrics from the event stream instead: records would only pile up
        self.keep_metrics = metrics
        self._tb: dict[int | None, _TbState] = {}
        self._cfp = ChildFailedParser()
        self._last_t: float | None = None
        self.enqueued: dict[int, int] = {}  # rank → last enqueued collective (watchdog)
        # what diagnose/chain.py weighs beyond single lines
        self.hosts: set[str] = set()  # hosts named by line prefixes
        self.ranks_seen: set[int] = set()  # ranks named by line prefixes
        self.shards: int | None = None  # last "Loading checkpoint shards" percent
        self.data_time: list[tuple[int, float, float]] = []  # (line, data s, step s)
        self.lines_after_shards = 0  # error-free lines since the shards bar

    @property
    def name(self) -> str:
        return str(self.source.path)

    def poll(self, final: bool = False) -> None:
        metric_lines: list[str] = []
        chunk_fn = self._chunk_native if self.native else self._chunk
        if self.tail.offset == 0 and final:
            self._wrapped_paste(chunk_fn, metric_lines)
        for base, chunk in self.tail.chunks():
            chunk_fn(base, chunk, metric_lines)
        if final:
            for logical in self.tail.assembler.flush():
                self._logical(self.tail.lineno, logical, metric_lines)
        if metric_lines and self.keep_metrics:
            self.metrics.feed_into(metric_lines, {})
        if final:
            for rank in list(self._tb):
                self._tb_finish(rank, self.tail.lineno)
            report = self._cfp.flush(self.tail.lineno)
            if report is not None:
                self.reports.append(report)

    def _wrapped_paste(self, chunk_fn, metric_lines: list[str]) -> None:
        """A small file read whole (a pasted excerpt, not a live log) whose long lines a
        terminal or web page hard-wrapped: read with the wrapped lines joined again, so a
        message and the rank it names are one line. Line numbers count joined lines."""
        try:
            if self.source.path.stat().st_size > PASTE_MAX:
                return
            data = self.source.path.read_bytes()
        except OSError:
            return
        if not data.endswith(b"\n"):
            return  # still being written: read it line by line as it grows
        lines = data.decode("utf-8", errors="replace").split("\n")[:-1]
        joined = rejoin(lines)
        if len(joined) == len(lines):
            return
        text = "\n".join(joined) + "\n"
        chunk_fn(0, text.encode(), metric_lines)
        self.tail.offset, self.tail.lineno = len(data), len(joined)

    # -- chunk-level fast path ---------------------------------------------------------------
    # Most lines of a log change nothing but counters. Byte searches (C speed) find the few
    # lines that can matter (a rule's literal, a traceback, torchrun's report, a time stamp, a
    # metric, a non-trivial NCCL line); they go through `_line` one by one, in order. Lines in
    # between are accounted for in bulk. While a multi-line block is open (traceback, torchrun
    # report, wrapped dict) every line goes the slow way, so the state machines see it all.

    def _chunk(self, base: int, chunk: bytes, metric_lines: list[str]) -> None:
        # a piece after the last newline (an over-long line cut by the reader) is dropped, as
        # the line-by-line path does
        chunk = chunk[: chunk.rfind(b"\n") + 1]
        n = len(chunk)
        # next occurrence of each token, as a heap: only tokens behind `pos` are searched again
        heap = [(at, tok) for tok in TOKENS if (at := chunk.find(tok)) >= 0]
        heapq.heapify(heap)
        time_at = -2
        pos, lineno = 0, base
        while pos < n:
            if self._busy():
                end = chunk.index(b"\n", pos)
                lineno += 1
                self._slow(lineno, chunk[pos:end], metric_lines)
                pos = end + 1
                continue
            while heap and heap[0][0] < pos:
                tok = heap[0][1]
                at = chunk.find(tok, pos)
                if at < 0:
                    heapq.heappop(heap)
                else:
                    heapq.heapreplace(heap, (at, tok))
            hit = heap[0][0] if heap else n
            if time_at < pos and time_at != -1:
                m = TIME_HINT.search(chunk, pos)
                time_at = m.start() if m else -1
            if 0 <= time_at < hit:
                hit = time_at
            if chunk.startswith(b"{", pos):
                hit = pos
            start = chunk.rfind(b"\n", pos, hit) + 1 if hit < n else n
            if start == 0 and pos > 0:
                start = pos
            if start > pos:
                lineno += self._bulk(chunk, pos, start, lineno, metric_lines)
                pos = start
                continue
            end = chunk.index(b"\n", pos)
            lineno += 1
            self._slow(lineno, chunk[pos:end], metric_lines)
            pos = end + 1

    def _chunk_native(self, base: int, chunk: bytes, metric_lines: list[str]) -> None:
        """Like _chunk, with the line classification done in C (core/ingest/_fastscan.c) in
        one pass over the chunk instead of one `find` per token."""
        chunk = chunk[: chunk.rfind(b"\n") + 1]
        n = len(chunk)
        pos, lineno = 0, base
        classify = fastscan.classify
        while pos < n:
            if not self._busy():
                stop, lines, heads, transports, facts, hint, other = classify(
                    self._matcher, chunk, pos, n
                )
                if lines:
                    self._passed_over(chunk, pos, heads, transports, facts, hint, other)
                    lineno += lines
                    pos = stop
                    if pos >= n:
                        break
            end = chunk.index(b"\n", pos)
            lineno += 1
            self._slow(lineno, chunk[pos:end], metric_lines)
            pos = end + 1

    def _passed_over(
        self,
        chunk: bytes,
        a: int,
        heads: int,
        transports: dict[str, int],
        facts: list[bytes],
        hint: int,
        other: int,
    ) -> None:
        """What `_line` would have done with the lines the classifier passed over."""
        self.nccl.lines += heads
        tr = self.nccl.transports
        for name, k in transports.items():
            tr[name] = tr.get(name, 0) + k
        # NCCL repeats its fact lines (once per rank and communicator); each distinct line is
        # parsed once, in the order of its last occurrence, which leaves the same summary
        for raw in list(dict.fromkeys(reversed(facts)))[::-1]:
            rec = parse_nccl(raw.decode())
            if rec is not None:
                self.nccl.add(rec, count=False)
                if rec.kind == "comm":
                    self.nccl_ranks[rec.pid] = rec.rank
        if other:
            self._cfp.plain_line()  # a plain line was the last one torchrun's parser saw
        while hint >= a:
            # the last time stamp passed over is the one `_line` would have kept
            t = self._time_of(split_rank(chunk[hint : chunk.index(b"\n", hint)].decode())[1])
            if t is not None:
                self._last_t = t
                return
            earlier = None
            for m in TIME_HINT.finditer(chunk, a, hint):
                earlier = m.start()
            hint = -1 if earlier is None else chunk.rfind(b"\n", a, earlier) + 1 or a

    def _time_of(self, text: str) -> float | None:
        """The time stamp of a line (rank prefix removed), if it has one."""
        return line_time(text, self.year) if text[:1] in "IWEF[" or "-" in text[:12] else None

    def _busy(self) -> bool:
        if self.tail.assembler.is_open or self._cfp.in_report:
            return True
        for st in self._tb.values():
            if st.mode != "none":
                return True
        return False

    def _bulk(self, chunk: bytes, a: int, b: int, lineno: int, metric_lines) -> int:
        """Lines [a, b) hold no token: only NCCL INFO counters can change. Returns lines read."""
        lines = chunk.count(b"\n", a, b)
        nccl = chunk.count(b"NCCL", a, b)
        span = chunk[a:b]
        ascii_ = span.isascii()
        if not ascii_ and TIME_HINT_STR.search(span.decode("utf-8", errors="replace")):
            nccl = -1  # str \d also matches non-ASCII digits: let line_time decide, per line
        if nccl:
            heads = len(INFO_HEAD_BYTES.findall(span)) if ascii_ else -2
            vias = CHANNEL_VIA_BYTES.findall(span) if heads == nccl else None
            if vias is None or len(vias) != span.count(b" via "):
                # something unusual about these NCCL lines: read them exactly, one by one
                for i, raw in enumerate(span.split(b"\n")[:-1]):
                    self._slow(lineno + i + 1, raw, metric_lines)
                return lines
            self.nccl.lines += heads
            tr = self.nccl.transports
            for v in vias:
                name = transport_name(v.decode())
                tr[name] = tr.get(name, 0) + 1
        if lines > nccl:
            self._cfp.plain_line()  # a plain line was the last one torchrun's parser saw
        return lines

    def _slow(self, lineno: int, raw: bytes, metric_lines: list[str]) -> None:
        for logical in self.tail.assembler.feed_lines((raw.decode("utf-8", errors="replace"),)):
            self._logical(lineno, logical, metric_lines)

    def _logical(self, lineno: int, raw: str, metric_lines: list[str]) -> None:
        self._line(lineno, raw)
        if raw[:1] == "{" or "|" in raw or "step" in raw or "loss" in raw:
            metric_lines.append(raw)

    def _line(self, lineno: int, raw: str) -> None:
        norm = normalize(raw)
        text, rank = norm.text, norm.rank
        if rank is not None:
            self.ranks_seen.add(rank)
        if norm.host is not None:
            self.hosts.add(norm.host)
        if rank is None:
            rank = self.source.rank
        if rank is None and "ank " in text:
            m = _RANK_IN_TEXT.search(text)
            rank = int(next(g for g in m.groups() if g is not None)) if m else None
        if (
            rank is None
            and "local_rank=" in text
            and ("<Signals." in text or "exit status" in text)
        ):
            # the old launcher's CalledProcessError quotes the failed child's own argv
            m = _LOCAL_RANK_ARG.search(text)
            rank = int(m.group(1)) if m else None
        t = self._time_of(split_rank(raw)[1]) if norm.stamped or raw[:1] in "IWEF[" else None
        if t is not None:
            self._last_t = t
        if "Data" in text or "data_time" in text:
            self._data_time(lineno, text)
        if "checkpoint shards" in text:
            m = None
            for m in _SHARDS.finditer(text):
                pass
            if m is not None:
                self.shards = int(m.group(1))
        if "NCCL" in text:
            rec = parse_nccl(text)
            if rec is not None:
                self.nccl.add(rec)
                if rec.kind == "comm":
                    self.nccl_ranks[rec.pid] = rec.rank
                if rec.level == "INFO":
                    return
        report = self._cfp.feed(text, lineno)
        if report is not None:
            self.reports.append(report)
        if self._cfp.in_report or (report is not None and self._cfp.consumed):
            return  # torchrun's report is read as a whole (engine._apply_failures)
        if "nqueued" in text and rank is not None:
            n = last_enqueued_work(text)
            if n is not None:
                self.enqueued[rank] = n
        if self._tb_feed(rank, lineno, text):
            # inside a traceback: frames are evidence, but the exception line is also a hit
            st = self._tb[rank]
            if st.mode != "after_exc" or text != st.lines[-1]:
                return
        tl = parse_torchrun_line(text)
        if tl is not None:
            self.torchrun_lines.append((lineno, tl, t or self._last_t))
            return
        m = match_line(text)
        if m is not None:
            rule, match = m
            if rule.category in _DEMOTE_ON_WARN and _WARN_LEVEL.search(raw):
                rule = _as_warning(rule)
            self.hits.append(
                Hit(
                    rule,
                    rank,
                    lineno,
                    text,
                    t or self._last_t,
                    {k: v for k, v in match.groupdict().items() if v},
                    host=norm.host,
                )
            )

    def _data_time(self, lineno: int, text: str) -> None:
        m = _DATA_TIME.search(text)
        if m:  # prefer the running averages in brackets
            step = float(m.group(2) or m.group(1))
            data = float(m.group(4) or m.group(3))
        else:
            m = _DATA_TIME2.search(text)
            if not m:
                return
            step, data = (
                (float(m.group(1)), float(m.group(2)))
                if m.group(1)
                else (float(m.group(4)), float(m.group(3)))
            )
        if step > 0:
            self.data_time.append((lineno, data, step))

    # -- Python tracebacks, one per rank stream --------------------------------------------

    def _tb_feed(self, rank: int | None, lineno: int, text: str) -> bool:
        st = self._tb.get(rank)
        if st is None:
            st = self._tb[rank] = _TbState()
        if st.mode == "none":
            if text.startswith("Traceback (most recent call last)"):
                st.mode, st.start, st.lines = "in", lineno, [text]
                return True
            if text[:1] == " " and _FRAME.match(text):
                # a paste cut above its header: the frames and the exception are still there
                st.mode, st.start = "in", lineno
                st.lines = ["Traceback (most recent call last):", text]
                return True
            return False
        if st.mode == "in":
            if not text.strip() or text[:1] in " \t" or text.startswith("Traceback (most"):
                st.lines.append(text)
            else:
                st.lines.append(text)  # the exception line
                st.mode = "after_exc"
            if len(st.lines) > MAX_TB_LINES:
                del st.lines[1 : len(st.lines) - MAX_TB_LINES + 10]
            return True
        # after the exception line: a chained exception continues the block
        if not text.strip():
            st.lines.append(text)
            return True
        if text.startswith(("The above exception", "During handling")) or text.startswith(
            "Traceback (most"
        ):
            st.lines.append(text)
            st.mode = "in"
            return True
        self._tb_finish(rank, lineno - 1)
        return False

    def _tb_finish(self, rank: int | None, end: int) -> None:
        st = self._tb.get(rank)
        if st is None or st.mode == "none":
            return
        lines = list(st.lines)
        while lines and not lines[-1].strip():
            lines.pop()
        self.tracebacks.append(Traceback(rank, st.start, end, lines))
        self._tb[rank] = _TbState()

    def ref(self, lineno: int) -> str:
        return f"{self.source.path}:{lineno}"


_WARN_RULES: dict[int, Rule] = {}


def _as_warning(rule: Rule) -> Rule:
    from dataclasses import replace

    w = _WARN_RULES.get(id(rule))
    if w is None:
        w = _WARN_RULES[id(rule)] = replace(
            rule, severity="warning", summary=rule.summary + " (a warning; it was retried)"
        )
    return w


def read_error_json(path: Path) -> dict[str, Any] | None:
    """error.json as written by torch.distributed.elastic's @record: message + traceback."""
    import json

    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    msg = d.get("message")
    if isinstance(msg, dict):
        info = msg.get("extraInfo") or {}
        ts = info.get("timestamp")
        return {
            "message": str(msg.get("message", "")),
            "traceback": str(info.get("py_callstack", "")),
            "t": float(ts) if str(ts).isdigit() else None,
        }
    if isinstance(msg, str):
        return {"message": msg, "traceback": "", "t": None}
    return None
