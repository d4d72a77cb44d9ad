"""RunWatcher: the incremental view of one run that live displays poll; RankLog: one rank's
log, indexed by byte offsets so a 1 GB file opens in well under a second and scrolls
without ever being held in memory.

Each `RunWatcher.poll()` reads only what was appended since the last one: the ranks' event
files (started near their end: the run's history is not replayed), the NCCL lines of the
rank logs (`NcclReader`), findings and the latest telemetry from run.db, and every
few seconds the whole run's telemetry, downsampled by run.db's tiers. So watching a
week-long run costs the same per poll as watching a new one. The watcher keeps one
read-only Store (one run.db connection) for its life: call close().

Logs: `RankLog` shows a rank's stdout and stderr as one list of lines. The files carry no
time stamps, so "interleaved by time" can only mean *in the order the watcher saw them
arrive*: what each poll finds appended to stdout, then what it finds appended to stderr.
Lines written within one poll interval (1 s) may therefore appear in the wrong order
between the two files (never within a file), and lines that were already in the files
when the view opened (an attach to a running or finished run) cannot be interleaved at
all: they show as all of stdout, then all of stderr. Each line keeps which file it came
from (the monitor marks stderr lines).
"""

from __future__ import annotations

import bisect
import collections
import os
import re
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from tunedeck.core.ingest.tail import Tail
from tunedeck.core.rundir import RunDir, event_rank
from tunedeck.core.views.nccl import NcclReader, RankNccl
from tunedeck.core.views.registry import RunInfo, read_run
from tunedeck.core.store.store import Store

HISTORY_EVERY_S = 10.0  # the whole-run telemetry strip changes slowly: at most this
# often, and no more than 4 times per cell of the strip
HISTORY_POINTS = 240  # points per series; the view resamples to its width
LOSS_POINTS = 400  # the loss sparkline's resolution
EVENT_TAIL_BYTES = 64 << 10  # where an event file is first read from, back from its end
# (~200 steps: the rates need RECENT_STEPS; the curve and its
# stats come from run.db's series, not from these lines)
SAMPLE_BELOW_BYTES = 8 << 20  # smaller event files are read whole for the loss curve
RECENT_STEPS = 50  # window of the rates (tokens/s, data-wait share, ETA)
PROBE_WINDOW_S = 60.0


# -- what a poll returns -------------------------------------------------------------------


@dataclass
class Progress:
    step: int = 0
    max_steps: int = 0
    epoch: float | None = None
    loss: float | None = None
    lr: float | None = None
    tokens_per_s: float | None = None  # all ranks together
    mfu: float | None = None  # mean over ranks, a fraction
    eta_s: float | None = None
    data_wait: float | None = None  # share of step time spent waiting for data
    worst_wait: tuple[int, float] | None = None  # (rank, share) of the most starved rank
    elapsed_s: float | None = None
    ranks: int = 0


@dataclass
class Snapshot:
    run: RunInfo | None
    progress: Progress
    last_step: dict[str, Any] | None
    loss_points: list[float]  # <= LOSS_POINTS, each the max of its steps
    loss_stats: dict[str, Any]  # first, min, last, steps, sampled
    checkpoints: list[str] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)  # newest version of each
    telemetry: dict[str, Any] = field(default_factory=dict)  # latest sample
    history: dict[str, Any] | None = None  # {"gpu": series, "rank": series}; None = unchanged
    nccl: list[RankNccl] | None = None  # None = unchanged since the last poll
    ranks: list[int] = field(default_factory=list)  # ranks that have logs or events
    # the lead rank's phase between steps ({"phase": "compiling", "est_s", "shape", "t"}),
    # None once steps resume; the last eager fallback stays (it is a warning for the run)
    phase: dict[str, Any] | None = None
    fallback: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)  # multi-node: core/nodes/view

    @property
    def losses(self) -> list[float]:
        return self.loss_points


# -- the watcher ---------------------------------------------------------------------------


class RunWatcher:
    def __init__(self, run_dir: Path, rank: int = 0):
        self.run_dir = Path(run_dir)
        self.run = RunDir(run_dir)
        self.store = Store(self.run)
        self.ranks: dict[int, _RankEvents] = {}
        self.probes: dict[int, _ProbeWaits] = {}
        self.loss = LossCurve(LOSS_POINTS)
        self.step_times: collections.deque[tuple[int, float]] = collections.deque(
            maxlen=RECENT_STEPS
        )
        self.last_step: dict[str, Any] | None = None
        self.checkpoints: collections.deque[str] = collections.deque(maxlen=20)
        self.nccl = NcclReader(self.run)
        self._history_next = 0.0
        self._history_done = False
        self._polled = False
        self.first_t: float | None = None  # the run's first event, when read
        self._findings_mark: Any = ()  # run.db's findings_mark when last read (None: none)
        self._findings: list[dict[str, Any]] = []
        self._log_lock = threading.Lock()
        self._log: RankLog | None = None
        self.log_rank = rank

    def close(self) -> None:
        self.store.close()

    # -- logs ------------------------------------------------------------------------
    @property
    def log(self) -> RankLog:
        """The selected rank's log (made on first use; `set_log_rank` switches)."""
        with self._log_lock:
            if self._log is None or self._log.rank != self.log_rank:
                self._log = RankLog(self.run, self.log_rank)
            return self._log

    def set_log_rank(self, rank: int) -> None:
        self.log_rank = rank

    # -- the poll --------------------------------------------------------------------
    def poll(self, history: bool | None = None) -> Snapshot:
        """Everything new since the last poll. `history`: True forces the whole-run
        telemetry query, False skips it; None runs it while the run is active every
        HISTORY_EVERY_S, or every quarter of a strip cell when that is longer (a week-long
        run's cell is 42 minutes), and once for an ended run."""
        run = read_run(self.run_dir)
        self._read_events()
        now = time.time()
        active = run is not None and run.active
        if history is None:
            history = not self._history_done if not active else now >= self._history_next
        hist = self._history(run, now) if history else None
        nccl_changed = self.nccl.poll()
        nccl = self.nccl.summaries() if nccl_changed or not self._polled else None
        self._polled = True
        ranks = sorted(
            set(self.ranks)
            | {s.rank for s in self.run.rank_logs(latest_only=True) if s.rank is not None}
        )
        findings = self._read_findings()
        return Snapshot(
            run=run,
            progress=self._progress(run, now),
            last_step=self.last_step,
            loss_points=self.loss.points(),
            loss_stats=self.loss.stats(),
            checkpoints=list(self.checkpoints),
            findings=findings,
            telemetry=self.store.telemetry_latest(),
            history=hist,
            nccl=nccl,
            ranks=ranks,
            phase=self.phase if active else None,
            fallback=self.fallback,
            nodes=self._nodes(findings, now),
        )

    def _nodes(self, findings: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
        """Every node of a multi-node run as the head sees it (one file read per node). The
        plan never changes after launch: read and judged once, on the first poll that finds
        it (a damaged or single-node plan means no node rows for good)."""
        if self._node_plan is None:
            plan = self.run.read_plan()
            if not plan and not self.run.plan.exists():
                return []  # not written yet: ask again next poll
            from tunedeck.core.views.doctor import plan_problem

            multi = not plan_problem(plan) and len(plan.get("nodes") or []) > 1
            self._node_plan = plan if multi else {}
        if not self._node_plan:
            return []
        from tunedeck.core.nodes.view import node_rows

        # node 0's sample is the snapshot's own `telemetry`; the others' come with their rows
        return node_rows(self.run_dir, findings, now, plan=self._node_plan, samples=True)

    _node_plan: dict[str, Any] | None = None  # {}: decided, no nodes to show

    def _read_findings(self) -> list[dict[str, Any]]:
        """Findings the agent stored, one per finding (a finding refined by later evidence
        is its newest version: `Store.findings`); the rows are read again only when run.db
        says something was stored or refined since the last poll (`findings_mark`)."""
        mark = self.store.findings_mark()
        if mark == self._findings_mark:
            return self._findings
        self._findings_mark = mark
        order = {"error": 0, "warning": 1, "info": 2}
        self._findings = sorted(
            self.store.findings(),
            key=lambda f: (
                not f.get("root_cause", True),
                order.get(f.get("severity"), 3),
                f.get("t") or 0,
            ),
        )
        return self._findings

    def _history(self, run: RunInfo | None, now: float) -> dict[str, Any]:
        self._history_done = True
        self._history_next = now + HISTORY_EVERY_S
        if run is None:
            return {"gpu": {}, "rank": {}, "t0": None, "t1": None}
        # from the first event when the watcher saw it: run.db picks its finest tier only
        # for a window its samples cover, and the first samples come a few seconds after
        # `started`, so a short run would get 10 s cells instead of 1 s ones
        t0 = max(run.started or run.created, self.first_t or 0)
        t1 = run.ended or now
        if not t0 or t1 <= t0:
            return {"gpu": {}, "rank": {}, "t0": t0, "t1": t1}
        gpu = self.store.telemetry_series(
            "gpu", t0, t1, HISTORY_POINTS, metrics=("util", "mem_used_mib", "power_w", "temp_c")
        )
        rank = self.store.telemetry_series(
            "rank", t0, t1, HISTORY_POINTS, metrics=("cpu_pct", "rss_mib")
        )
        cell = max(gpu.get("step_s") or 0, rank.get("step_s") or 0)
        self._history_next = now + max(HISTORY_EVERY_S, cell / 4)
        return {"gpu": gpu, "rank": rank, "t0": t0, "t1": t1}

    # -- events ----------------------------------------------------------------------
    def _read_events(self) -> None:
        for path in self.run.event_files():
            rank = event_rank(path)
            if rank is None:
                continue
            st = self.ranks.get(rank)
            if st is None:
                st = self.ranks[rank] = _RankEvents(path)
                if rank == min(self.ranks):
                    self._seed_loss(path, st)
            from_start = st.tail.offset == 0
            lead = rank == min(self.ranks)  # the run's progress: its lowest rank's
            for e in st.tail.records(max_bytes=16 << 20):  # the rest next poll
                if from_start and self.first_t is None and isinstance(e.get("t"), (int, float)):
                    self.first_t = float(e["t"])
                st.add(e)
                if lead:
                    self._rank0_event(e)
        for path in self.run.probe_files():
            rank = event_rank(path)
            if rank is not None:
                pw = self.probes.get(rank)
                if pw is None:
                    pw = self.probes[rank] = _ProbeWaits(path)
                pw.read()

    def _seed_loss(self, path: Path, st: "_RankEvents") -> None:
        """The loss curve before the watcher looked: a small file is read whole; a large one
        is sampled at LOSS_POINTS offsets (a week-long run's history costs a few hundred
        reads, not the file). The tail then continues from near the end."""
        try:
            size = path.stat().st_size
        except OSError:
            return
        if size <= SAMPLE_BELOW_BYTES:
            st.tail.offset = 0
            return
        for step, loss in sample_steps(path, LOSS_POINTS, end=st.tail.offset):
            self.loss.add(step, loss)
        self.loss.sampled = True

    def _rank0_event(self, e: dict[str, Any]) -> None:
        kind = e.get("kind")
        if kind == "step" and isinstance(e.get("step"), int):
            step = e["step"]
            if isinstance(e.get("loss"), (int, float)):
                self.loss.add(step, float(e["loss"]))
            while self.step_times and self.step_times[-1][0] >= step:  # a restart
                self.step_times.pop()
            self.last_step = e
            if isinstance(e.get("t"), (int, float)):
                self.step_times.append((step, float(e["t"])))
        elif kind == "checkpoint" and e.get("path"):
            self.checkpoints.append(str(e["path"]))
        elif kind == "start" and isinstance(e.get("max_steps"), int):
            self.max_steps = e["max_steps"]
        if kind == "phase":
            if e.get("phase") in ("compiling", "tokenizing"):
                # the data stage's timeout warning comes once: it stays for the stage
                held = (self.phase or {}).get("warning") if e.get("phase") == "tokenizing" else None
                self.phase = {**e, "warning": e.get("warning") or held} if held else e
            else:
                self.phase = None
                if e.get("phase") == "eager_fallback":
                    self.fallback = e
        elif kind in ("step", "end", "start"):
            self.phase = None

    phase: dict[str, Any] | None = None
    fallback: dict[str, Any] | None = None

    max_steps = 0

    def _progress(self, run: RunInfo | None, now: float) -> Progress:
        p = Progress(ranks=len(self.ranks))
        last = self.last_step or {}
        p.step = int(last.get("step") or (run.step if run else 0))
        p.max_steps = (run.max_steps if run and run.max_steps else 0) or self.max_steps
        p.loss = _num(last.get("loss"))
        p.lr = _num(last.get("lr"))
        p.epoch = _num(last.get("epoch"))
        tps = [st.tokens_per_s for st in self.ranks.values() if st.tokens_per_s is not None]
        p.tokens_per_s = sum(tps) if tps else (run.tokens_per_s if run else None)
        mfus = [st.mfu for st in self.ranks.values() if st.mfu is not None]
        p.mfu = sum(mfus) / len(mfus) if mfus else None
        shares = {r: s for r, st in self.ranks.items() if (s := st.wait_share()) is not None}
        if not shares:  # other backends: the DataLoader probe's records
            shares = {r: s for r, pw in self.probes.items() if (s := pw.share()) is not None}
        if shares:
            p.data_wait = sum(shares.values()) / len(shares)
            worst = max(shares, key=shares.__getitem__)
            p.worst_wait = (worst, shares[worst])
        if run is not None:
            start = run.started or run.created
            end = run.ended or (now if run.active else None)
            p.elapsed_s = end - start if start and end else None
        p.eta_s = self._eta(run, p.max_steps, now)
        return p

    def _eta(self, run: RunInfo | None, max_steps: int, now: float) -> float | None:
        if not run or run.status != "running" or len(self.step_times) < 2:
            return None
        (s0, t0), (s1, t1) = self.step_times[0], self.step_times[-1]
        if s1 <= s0:
            return None
        per_step = (t1 - t0) / (s1 - s0)
        remaining = max(max_steps - s1, 0)
        # the last step may be a while ago if the run stalled: count that time as spent
        return max(remaining * per_step - (now - t1), 0.0)


class _RankEvents:
    """One rank's event file from near its end: the recent steps' rates."""

    def __init__(self, path: Path):
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        start = max(0, size - EVENT_TAIL_BYTES)
        if start:  # begin on a line boundary (a cut first line would not parse anyway)
            with open(path, "rb") as f:
                f.seek(start)
                start += len(f.readline())
        self.tail = Tail(path, start)
        self.recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=RECENT_STEPS)
        self.tokens_per_s: float | None = None
        self.mfu: float | None = None
        self.step = 0

    def add(self, e: dict[str, Any]) -> None:
        if e.get("kind") != "step":
            return
        self.step = e.get("step") or self.step
        self.tokens_per_s = _num(e.get("tokens_per_s"))
        self.mfu = _num(e.get("mfu"))
        step_s, wait = _num(e.get("step_s")), _num(e.get("data_wait_s"))
        if step_s is not None and wait is not None and step_s > 0:
            self.recent.append((step_s, wait))

    def wait_share(self) -> float | None:
        total = sum(s for s, _ in self.recent)
        return min(sum(w for _, w in self.recent) / total, 1.0) if total > 0 else None


class _ProbeWaits:
    """The DataLoader probe's per-second waits of one rank, the last PROBE_WINDOW_S."""

    def __init__(self, path: Path):
        self.tail = Tail.at_end(path)
        # the last minute is in the last few kB (a cut first line does not parse: skipped)
        self.tail.offset = max(0, self.tail.offset - (64 << 10))
        self.recent: collections.deque[tuple[float, float]] = collections.deque()

    def read(self) -> None:
        for e in self.tail.records(max_bytes=4 << 20):
            t, w = _num(e.get("t")), _num(e.get("wait_s"))
            if t is not None and w is not None:
                self.recent.append((t, w))
        while self.recent and self.recent[0][0] < self.recent[-1][0] - PROBE_WINDOW_S:
            self.recent.popleft()

    def share(self) -> float | None:
        if len(self.recent) < 2:
            return None
        span = self.recent[-1][0] - self.recent[0][0] + 1.0  # each record covers ~1 s
        return min(sum(w for _, w in self.recent) / span, 1.0)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and v == v else None


# -- the loss curve ------------------------------------------------------------------------


class LossCurve:
    """At most ~n points of a growing series, each the max of its bucket of steps (so a
    spike stays visible); buckets double in width when full. O(n) memory for any length."""

    def __init__(self, n: int = LOSS_POINTS):
        self.n = n
        self.width = 1
        self.buckets: list[list] = []  # [bucket index, max loss]
        self.first: float | None = None
        self.low: float | None = None
        self.last: float | None = None
        self.count = 0
        self.last_step = 0
        self.sampled = False

    def add(self, step: int, loss: float) -> None:
        if loss != loss:  # NaN: shown by the findings, not the curve
            return
        b = step // self.width
        if step <= self.last_step:  # a restart repeats steps: drop what it overwrites
            while self.buckets and self.buckets[-1][0] > b:
                self.buckets.pop()
            if self.buckets and self.buckets[-1][0] == b:
                self.buckets[-1][1] = loss
        if self.buckets and self.buckets[-1][0] == b:
            self.buckets[-1][1] = max(self.buckets[-1][1], loss)
        else:
            self.buckets.append([b, loss])
            if len(self.buckets) > 2 * self.n:
                self._halve()
        self.first = loss if self.first is None else self.first
        self.low = loss if self.low is None else min(self.low, loss)
        self.last, self.last_step = loss, step
        self.count += 1

    def _halve(self) -> None:
        self.width *= 2
        merged: list[list] = []
        for b, v in self.buckets:
            nb = b // 2
            if merged and merged[-1][0] == nb:
                merged[-1][1] = max(merged[-1][1], v)
            else:
                merged.append([nb, v])
        self.buckets = merged

    def points(self) -> list[float]:
        vals = [v for _, v in self.buckets]
        if len(vals) <= self.n:
            return vals
        size = len(vals) / self.n
        return [
            max(vals[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)])
            for i in range(self.n)
        ]

    def stats(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "min": self.low,
            "last": self.last,
            "steps": self.last_step,
            "sampled": self.sampled,
        }


def sample_steps(path: Path, n: int, end: int | None = None) -> list[tuple[int, float]]:
    """(step, loss) of the first step event after each of n evenly spaced offsets of an
    event file (before `end`): a curve of a long run from n small reads."""
    import json

    out: list[tuple[int, float]] = []
    try:
        f = open(path, "rb")
    except OSError:
        return out
    with f:
        size = end if end is not None else os.fstat(f.fileno()).st_size
        last = -1
        for i in range(n):
            f.seek(int(i * size / n))
            f.readline()  # the rest of a line cut by the seek
            for _ in range(16):  # a few lines: eval/checkpoint events sit between steps
                if f.tell() >= size:
                    break
                line = f.readline()
                if b'"step"' not in line:
                    continue
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if (
                    e.get("kind") == "step"
                    and isinstance(e.get("step"), int)
                    and isinstance(e.get("loss"), (int, float))
                    and e["step"] > last
                ):
                    out.append((e["step"], float(e["loss"])))
                    last = e["step"]
                    break
    return out


# -- a rank's log --------------------------------------------------------------------------

STRIDE_BYTES = 64 << 10  # one checkpoint (line number, byte offset) per 64 kB
READ_BYTES = 1 << 20
MAX_LINE_CHARS = 4000  # what a view shows of one line


class LogFileIndex:
    """A sparse line index of one growing file: every ~STRIDE_BYTES the number and byte
    offset of a line start. Line n is found by seeking to the checkpoint before it and
    reading forward (at most ~64 kB); the file is scanned once, in 1 MB reads, and never
    held in memory: a 1 GB log keeps ~16k checkpoints (256 kB)."""

    def __init__(self, path: Path, start: int = 0):
        self.path = Path(path)
        self.start = start  # a line start: an index of the file's tail (big logs)
        self.reset()

    def reset(self) -> None:
        self.scanned = self.start  # bytes counted so far
        self.lines = 0  # complete lines (newlines seen) after `start`
        self.complete_end = self.start  # offset just past the last newline
        self.cp_line = array("q", [0])
        self.cp_off = array("q", [self.start])
        self._next_cp = self.start + STRIDE_BYTES
        self.bytes_read = 0  # every byte this index read, scans and lookups

    @classmethod
    def tail_of(cls, path: Path, nbytes: int) -> "LogFileIndex":
        """An index of the last ~nbytes of a file, from the first line start in them."""
        size = os.path.getsize(path)
        start = max(0, size - nbytes)
        if start:
            with open(path, "rb") as f:
                f.seek(start - 1)
                start += len(f.readline()) - 1  # to just past the newline
        return cls(path, start)

    def size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except OSError:
            return 0

    def update(self, max_bytes: int | None = None) -> int:
        """Count what was appended; returns the number of new complete lines, or -1 when
        the file shrank (truncated or replaced: the index starts again)."""
        size = self.size()
        if size < self.scanned:
            self.start = 0
            self.reset()
            return -1
        if size == self.scanned:
            return 0
        before = self.lines
        budget = max_bytes if max_bytes is not None else size
        buf = bytearray(READ_BYTES)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self.scanned)
            while budget > 0:
                n = f.readinto(buf)
                if not n:
                    break
                self.bytes_read += n
                self._scan(buf, n)
                budget -= n
        return self.lines - before

    def _scan(self, chunk: bytearray, n: int) -> None:
        base = self.scanned
        pos, count = 0, self.lines
        while self._next_cp < base + n:
            rel = max(self._next_cp - base, 0)
            nl = chunk.find(b"\n", rel, n)
            if nl < 0:
                break  # no line starts in the rest of this chunk: look on in the next
            count += chunk.count(b"\n", pos, nl + 1)
            pos = nl + 1
            self.cp_line.append(count)
            self.cp_off.append(base + pos)
            self._next_cp = base + pos + STRIDE_BYTES
        count += chunk.count(b"\n", pos, n)
        last = chunk.rfind(b"\n", 0, n)
        if last >= 0:
            self.complete_end = base + last + 1
        self.lines = count
        self.scanned = base + n

    def line_at(self, offset: int) -> int:
        """The number of the line that starts at `offset` (a line start this index has
        scanned past): the checkpoint before it, plus the newlines from there."""
        i = bisect.bisect_right(self.cp_off, offset) - 1
        line, pos = self.cp_line[i], self.cp_off[i]
        with open(self.path, "rb") as f:
            f.seek(pos)
            while pos < offset:
                data = f.read(min(64 << 10, offset - pos))
                if not data:
                    break
                self.bytes_read += len(data)
                line += data.count(b"\n")
                pos += len(data)
        return line

    def read(self, start: int, count: int) -> list[str]:
        """Lines [start, start + count) of the complete lines, as shown: decoded, what a
        terminal would show of `\\r` redraws (the last one), cut at MAX_LINE_CHARS."""
        end = min(start + count, self.lines)
        if start >= end:
            return []
        i = bisect.bisect_right(self.cp_line, start) - 1
        line, off = self.cp_line[i], self.cp_off[i]
        out: list[str] = []
        rest = b""
        with open(self.path, "rb") as f:
            f.seek(off)
            while line < end:
                data = f.read(64 << 10)
                if not data:
                    break
                self.bytes_read += len(data)
                data = rest + data
                parts = data.split(b"\n")
                rest = parts.pop()
                for raw in parts:
                    if line >= start:
                        out.append(_show(raw))
                    line += 1
                    if line >= end:
                        break
        return out

    def find(
        self,
        what: "Matcher | re.Pattern[bytes]",
        limit: int,
        first_only: bool = False,
        stop: Callable[[], bool] | None = None,
    ) -> list[int]:
        """Numbers of the complete lines matching `what` (at most `limit`), in one streaming
        pass: 4 MB reads, each searched up to its last newline (the cut line is read again
        with the next one), without copying the chunk."""
        m = what if isinstance(what, Matcher) else Regex(what)
        end, hits = self.complete_end, []
        line, offset = 0, self.start
        with open(self.path, "rb") as f:
            f.seek(offset)
            while offset < end and len(hits) < limit:
                if stop is not None and stop():
                    break
                data = f.read(min(FIND_BYTES, end - offset))
                if not data:
                    break
                cut = data.rfind(b"\n") + 1
                while not cut:  # one line longer than a read: read on to its end
                    more = f.read(FIND_BYTES)
                    if not more:
                        cut = len(data)
                        break
                    data += more
                    cut = data.rfind(b"\n") + 1
                self.bytes_read += len(data)
                pos, counted = 0, line
                for s in m.starts(data, cut):
                    if s < pos:
                        continue  # a second match on a line already counted
                    counted += data.count(b"\n", pos, s)
                    hits.append(counted)
                    if first_only or len(hits) >= limit:
                        return hits
                    pos = data.find(b"\n", s, cut) + 1 or cut
                    counted += 1
                line += data.count(b"\n", 0, cut)
                offset += cut
                f.seek(offset)
        return hits


FIND_BYTES = 4 << 20


class Matcher:
    """Where a chunk of whole lines (data[:end]) matches, in order: byte searches first, so
    a search of a 1 GB log runs at memory speed, not at regex speed."""

    def starts(self, data: bytes, end: int):
        raise NotImplementedError


class Literal(Matcher):
    def __init__(self, needle: bytes, ignore_case: bool = False):
        self.ignore_case = ignore_case
        self.needle = needle.lower() if ignore_case else needle

    def starts(self, data: bytes, end: int):
        hay = data[:end].lower() if self.ignore_case else data
        i = hay.find(self.needle, 0, end)
        while i >= 0:
            yield i
            i = hay.find(self.needle, i + 1, end)


class Regex(Matcher):
    def __init__(self, rx: re.Pattern[bytes]):
        self.rx = rx

    def starts(self, data: bytes, end: int):
        return (m.start() for m in self.rx.finditer(data, 0, end))


def _show(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    if "\r" in text:
        text = text.rstrip("\r").rsplit("\r", 1)[-1]
    return text[:MAX_LINE_CHARS]


# A Python traceback, an exception name, error-level log lines (logging's ERROR, glog's
# "[E1130 13:05:52" as torch writes them in rank logs, "[rank0]:" before it). One regex:
# a pass of its first-byte set is ~3x faster than a byte search per word.
ERROR_PATTERN = re.compile(
    rb"Traceback \(most recent call last\)|Error\b|ERROR\b|"
    rb"CUDA error|NCCL WARN|\[E\d{4} \d"
)
ERRORS = Regex(ERROR_PATTERN)


BIG_BYTES = 64 << 20  # a log bigger than this opens at its tail while it is indexed
TAIL_BYTES = 4 << 20


@dataclass
class LogState:
    rank: int
    generation: int  # changes when the view must start over
    total: int  # lines in the view
    files: list[str]
    attempt: str | None  # torchrun's attempt folder of these files
    indexed: int  # bytes indexed so far
    size: int  # bytes in the files
    bytes_read: int  # everything the index read, scans and lookups
    # a view that grew at its top (a big log's head, once indexed): line n of generation
    # `moved_from` is line n + `moved_by` of this one
    moved_from: int | None = None
    moved_by: int = 0


class RankLog:
    """One rank's stdout and stderr (newest torchrun attempt) as one list of lines, in the
    order the watcher saw them arrive (see the module doc for what that can and cannot
    mean). Thread-safe: the monitor updates it from one worker and reads windows and
    searches from others."""

    STDOUT, STDERR = 0, 1

    def __init__(self, run: RunDir, rank: int):
        self.run, self.rank = run, rank
        self.lock = threading.RLock()
        self.generation = 0
        self.files: list[Path] = []
        self.index: list[LogFileIndex] = []  # whole files (built in slices)
        self.shown: list[LogFileIndex] = []  # what the view's lines come from
        self._moved: tuple[int, int] | None = None
        self._clear()

    def _clear(self) -> None:
        self.seg_file = array("b")  # which file a segment's lines come from
        self.seg_first = array("q")  # its first line in that file
        self.seg_view = array("q")  # its first line in the view
        self.placed = [0] * len(self.shown)
        self.total = 0
        self.generation += 1
        self._moved = None

    def update(self, max_bytes: int | None = None) -> LogState:
        """Index what the files gained and place the new lines at the end of the view.

        A file bigger than BIG_BYTES on first sight is shown from its last TAIL_BYTES at
        once, while `max_bytes` slices of successive calls index it whole; then its head is
        placed before the tail (`LogState.moved_by`), so the view opens in milliseconds
        whatever the size."""
        with self.lock:
            files = self.run.rank_log_files(self.rank) or self._launcher_log()
            if files != self.files:  # first look, or a new attempt
                self.files = files
                self.index = [LogFileIndex(p) for p in files]
                self.shown = [
                    LogFileIndex.tail_of(p, TAIL_BYTES) if ix.size() > BIG_BYTES else ix
                    for p, ix in zip(files, self.index)
                ]
                self._clear()
            for fi, ix in enumerate(self.index):
                shown = self.shown[fi]
                if shown is not ix and shown.update() < 0 or ix.update(max_bytes) < 0:
                    # a file shrank: start the view over, from the whole files
                    for other in self.index:
                        other.start = 0
                        other.reset()
                    self.shown = list(self.index)
                    self._clear()
                    break
            self._take_heads()
            for fi, ix in enumerate(self.shown):
                new = ix.lines - self.placed[fi]
                if new <= 0:
                    continue
                if not (self.seg_file and self.seg_file[-1] == fi):
                    self.seg_file.append(fi)
                    self.seg_first.append(self.placed[fi])
                    self.seg_view.append(self.total)
                self.placed[fi] += new
                self.total += new
            return self.state()

    def _take_heads(self) -> None:
        """Once every big file is indexed up to its shown tail: the view switches to the
        whole files, their heads first (a new generation, every old line moved down)."""
        tails = [fi for fi, sh in enumerate(self.shown) if sh is not self.index[fi]]
        if not tails or any(self.index[fi].scanned < self.shown[fi].scanned for fi in tails):
            return
        heads: list[tuple[int, int]] = []
        for fi in tails:
            full, tail = self.index[fi], self.shown[fi]
            heads.append((fi, full.line_at(tail.start)))  # lines before the tail
            self.shown[fi] = full
        moved = sum(h for _, h in heads)
        old_gen = self.generation
        # every segment keeps its place, moved down by the heads; tail lines renumber
        off = dict(heads)
        for i in range(len(self.seg_file)):
            self.seg_first[i] += off.get(self.seg_file[i], 0)
            self.seg_view[i] += moved
        lead_file = array("b", [fi for fi, _ in heads])
        lead_first = array("q", [0] * len(heads))
        lead_view = array("q", [sum(h for _, h in heads[:k]) for k in range(len(heads))])
        self.seg_file = lead_file + self.seg_file
        self.seg_first = lead_first + self.seg_first
        self.seg_view = lead_view + self.seg_view
        for fi, h in heads:
            self.placed[fi] += h
        self.total += moved
        self.generation += 1
        self._moved = (old_gen, moved)

    def _launcher_log(self) -> list[Path]:
        """No rank has started (a rendezvous that failed, torchrun refusing an argument):
        torchrun's own log of the rank's node says why, so the view and its first-error key
        have it instead of nothing. The rank's files replace it once they exist."""
        nproc = self.run.nproc_per_node
        path = self.run.torchrun_log(self.rank // nproc if nproc else 0)
        return [path] if path.is_file() else []

    def state(self) -> LogState:
        attempt = self.files[0].parent.parent.name if self.files else None
        if self.files and self.files[0].name.startswith("torchrun-node"):
            attempt = f"no output from rank {self.rank}: {self.files[0].name}"
        moved_from, moved_by = self._moved or (None, 0)
        tails = [sh for fi, sh in enumerate(self.shown) if sh is not self.index[fi]]
        return LogState(
            rank=self.rank,
            generation=self.generation,
            total=self.total,
            files=[str(p) for p in self.files],
            attempt=attempt,
            indexed=sum(ix.scanned for ix in self.index),
            size=sum(ix.size() for ix in self.index),
            bytes_read=sum(ix.bytes_read for ix in self.index + tails),
            moved_from=moved_from,
            moved_by=moved_by,
        )

    @property
    def caught_up(self) -> bool:
        return all(ix.scanned >= ix.size() for ix in self.index) and all(
            sh is ix for sh, ix in zip(self.shown, self.index)
        )

    def lines(self, start: int, count: int) -> list[tuple[str, int]]:
        """View lines [start, start + count): (text, 0 for stdout / 1 for stderr)."""
        with self.lock:
            end = min(start + count, self.total)
            out: list[tuple[str, int]] = []
            if start >= end:
                return out
            i = bisect.bisect_right(self.seg_view, start) - 1
            pos = start
            while pos < end and i < len(self.seg_view):
                seg_end = self.seg_view[i + 1] if i + 1 < len(self.seg_view) else self.total
                take = min(end, seg_end) - pos
                fi = self.seg_file[i]
                first = self.seg_first[i] + (pos - self.seg_view[i])
                out.extend((t, fi) for t in self.shown[fi].read(first, take))
                pos += take
                i += 1
            return out

    def _view_of(self, fi: int) -> Callable[[int], int | None]:
        """Maps a line of file `fi` to its view line (None when not placed yet); built
        once per search, called per hit. Call with the lock held."""
        segs = [i for i in range(len(self.seg_file)) if self.seg_file[i] == fi]
        firsts = [self.seg_first[i] for i in segs]

        def view(file_line: int) -> int | None:
            j = bisect.bisect_right(firsts, file_line) - 1
            if j < 0:
                return None
            i = segs[j]
            seg_end = self.seg_view[i + 1] if i + 1 < len(self.seg_view) else self.total
            line = self.seg_view[i] + file_line - firsts[j]
            return line if line < seg_end else None

        return view

    def search(
        self,
        what: "Matcher | re.Pattern[bytes]",
        limit: int = 10000,
        stop: Callable[[], bool] | None = None,
    ) -> list[int]:
        """View lines matching `what` (at most `limit` per file), in view order. Reads the
        files once, streaming."""
        with self.lock:
            index, gen = list(self.shown), self.generation
        found: list[tuple[int, list[int]]] = [
            (fi, ix.find(what, limit, stop=stop)) for fi, ix in enumerate(index)
        ]
        with self.lock:
            if gen != self.generation:
                return []
            hits = set()
            for fi, lines in found:
                view = self._view_of(fi)
                hits.update(v for ln in lines if (v := view(ln)) is not None)
        return sorted(hits)[:limit]

    def first_error(self) -> int | None:
        """The first view line that looks like an error (a Python traceback, an
        `...Error`, `ERROR`, a CUDA error, an NCCL warning)."""
        with self.lock:
            index, gen = list(self.shown), self.generation
        firsts = [(fi, ix.find(ERRORS, 1, first_only=True)) for fi, ix in enumerate(index)]
        with self.lock:
            if gen != self.generation:
                return None
            views = [
                v
                for fi, lines in firsts
                for ln in lines
                if (v := self._view_of(fi)(ln)) is not None
            ]
        return min(views) if views else None
