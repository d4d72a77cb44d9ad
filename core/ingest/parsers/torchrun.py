"""torchrun's failure report, printed when a worker fails:

    torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
    [1]:
      time      : 2026-11-30_09:43:33
      host      : node-a
      rank      : 0 (local_rank: 0)
      exitcode  : -15 (pid: 1333)
      error_file: <N/A>
      traceback : Signal 15 (SIGTERM) received by PID 1333
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      ...
    ============================================================

`ChildFailedParser.feed(line, lineno)` takes lines as they arrive and returns a finished report
when its closing rule has been read. The other torchrun lines worth knowing are matched by
`parse_torchrun_line`.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

_FIELD = re.compile(r"^\s{2}(\w+)\s*:\s?(.*)$")
_RANK = re.compile(r"(-?\d+)(?: \(local_rank: (\d+)\))?")
_EXIT = re.compile(r"(-?\d+)(?: \(pid: (\d+)\))?")
_FAILED_LINE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_SIGTERM_SENT = re.compile(r"Sending process (\d+) closing signal (SIG\w+)")
# DeepSpeed's launcher: `[launch.py:434:sigkill_handler] ['python', '-u', 'train.py',
# '--local_rank=3', ...] exits with return code = -9`
_DS_EXIT = re.compile(r"exits with return code = (-?\d+)")
_DS_LOCAL = re.compile(r"--local_rank=(\d+)")
_ENTRY = re.compile(r"^\[\d+\]:\s*$")
_FIELDS = ("time", "host", "rank", "exitcode", "error_file", "traceback")


@dataclass
class Failure:
    root_cause: bool
    time: float | None = None
    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    exitcode: int | None = None
    pid: int | None = None
    signal: str | None = None
    error_file: str | None = None
    traceback: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ChildFailedReport:
    script: str
    failures: list[Failure]
    first_line: int
    last_line: int
    lines: list[str]

    @property
    def root(self) -> Failure | None:
        return next((f for f in self.failures if f.root_cause), None)


class ChildFailedParser:
    """A whole report (from its `=== / script FAILED` head), or, when the paste cut the head
    off, the entries that are left (`[1]:` and its indented fields): a `partial` report,
    ended by a rule line or by the first line that is not part of a table. `consumed` says
    whether the line just fed belonged to the report."""

    def __init__(self) -> None:
        self._prev = ""
        self._in = False
        self._partial = False
        self.consumed = False
        self._reset()

    def _reset(self) -> None:
        self._failures: list[Failure] = []
        self._cur: Failure | None = None
        self._root_section = False
        self._script = ""
        self._start = 0
        self._lines: list[str] = []
        self._last_key = ""

    def plain_line(self) -> None:
        """A line that cannot start a report was read (the scanner skips such lines)."""
        self._prev = ""

    @property
    def in_report(self) -> bool:
        return self._in

    def flush(self, lineno: int = 0) -> ChildFailedReport | None:
        """The end of the input inside a report (a paste cut mid-table): what it held."""
        if not self._in:
            return None
        self._in = False
        if not any(f.rank is not None or f.exitcode is not None for f in self._failures):
            return None
        return ChildFailedReport(self._script, self._failures, self._start, lineno, self._lines)

    def feed(self, line: str, lineno: int = 0) -> ChildFailedReport | None:
        prev, self._prev = self._prev, line
        self.consumed = True
        if not self._in:
            if line.endswith(" FAILED") and _is_rule(prev, "="):
                self._in, self._partial = True, False
                self._reset()
                self._script = line[: -len(" FAILED")].strip()
                self._start = lineno - 1
                self._lines = [prev, line]
                return None
            # (only on lines the scanner's fast path stops at: rules.py's TOKENS)
            if line.startswith("Root Cause (first") or _is_field(line):
                self._in, self._partial = True, True
                self._reset()
                self._start = lineno
                self._lines = []
            else:
                self.consumed = False
                return None
        if self._partial and not (
            not line.strip()
            or _ENTRY.match(line)
            or _is_field(line)
            or line.startswith(("Root Cause", "Failures:", "  <NO_OTHER"))
            or (self._last_key == "traceback" and line[:1] == " ")
        ):
            # the table is over (or was never one): hand back what it held
            self._in = False
            self.consumed = _is_rule(line, "=") or _is_rule(line, "-")
            if not any(f.rank is not None or f.exitcode is not None for f in self._failures):
                return None
            return ChildFailedReport(self._script, self._failures, self._start, lineno, self._lines)
        self._lines.append(line)
        if _is_rule(line, "="):
            self._in = False
            return ChildFailedReport(self._script, self._failures, self._start, lineno, self._lines)
        if self._partial and self._cur is None and _is_field(line):
            self._cur = Failure(root_cause=False)  # the entry's `[N]:` was cut off too
            self._failures.append(self._cur)
        if line.startswith("Root Cause"):
            self._root_section = True
            return None
        if line.startswith("[") and line.rstrip().endswith("]:"):
            self._cur = Failure(root_cause=self._root_section)
            self._failures.append(self._cur)
            return None
        if self._cur is None:
            return None
        m = _FIELD.match(line)
        if m and m.group(1) in ("time", "host", "rank", "exitcode", "error_file", "traceback"):
            self._last_key = m.group(1)
            _set(self._cur, m.group(1), m.group(2).strip())
        elif self._last_key == "traceback" and line.strip():
            self._cur.traceback.append(line.strip())
        return None


def _is_field(line: str) -> bool:
    m = _FIELD.match(line)
    return bool(m) and m.group(1) in _FIELDS


def _is_rule(line: str, ch: str) -> bool:
    s = line.strip()
    return len(s) >= 20 and s == ch * len(s)


def _set(f: Failure, key: str, value: str) -> None:
    if key == "time":
        try:
            f.time = datetime.strptime(value, "%Y-%m-%d_%H:%M:%S").timestamp()
        except ValueError:
            pass
    elif key == "host":
        f.host = value
    elif key == "rank":
        m = _RANK.match(value)
        if m:
            f.rank = int(m.group(1))
            f.local_rank = int(m.group(2)) if m.group(2) else None
    elif key == "exitcode":
        m = _EXIT.match(value)
        if m:
            f.exitcode = int(m.group(1))
            f.pid = int(m.group(2)) if m.group(2) else None
            if f.exitcode < 0:
                f.signal = signal_name(-f.exitcode)
    elif key == "error_file":
        f.error_file = None if value.startswith("<N/A>") else value
    elif key == "traceback":
        if value and not value.startswith("To enable traceback"):
            f.traceback.append(value)


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def parse_torchrun_line(line: str) -> dict[str, Any] | None:
    """torchrun's `failed (exitcode: 1) local_rank: 1 (pid: 1391)` and
    `Sending process 1333 closing signal SIGTERM` lines, and DeepSpeed's launcher's
    `[...'--local_rank=3'...] exits with return code = -9`."""
    if "exitcode" in line:
        m = _FAILED_LINE.search(line)
        if m:
            return {
                "kind": "failed",
                "exitcode": int(m[1]),
                "local_rank": int(m[2]),
                "pid": int(m[3]),
            }
    if "closing signal" in line:
        m = _SIGTERM_SENT.search(line)
        if m:
            return {"kind": "closing", "pid": int(m[1]), "signal": m[2]}
    if "return code" in line:
        m = _DS_EXIT.search(line)
        if m:
            lr = _DS_LOCAL.search(line)
            return {
                "kind": "failed",
                "exitcode": int(m[1]),
                "local_rank": int(lr[1]) if lr else None,
                "pid": None,
                "launcher": "deepspeed",
            }
    return None
