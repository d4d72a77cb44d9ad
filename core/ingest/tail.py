"""Read what was appended to a file since the last look, by byte offset: the one tail.

A `Tail` keeps its file's offset (and line count), so a file is never re-read from the start:
each read costs only what was appended. Only complete lines are handed out; a line still being
written is picked up whole next time. A file that shrank (rotated, truncated) is read again
from its start. `RankLogTail` follows one rank's stdout/stderr across restarts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator

from tunedeck.core.ingest.parsers.assemble import LineAssembler

if TYPE_CHECKING:
    from tunedeck.core.rundir import RunDir

# Reads of 1 MB stay in the CPU cache for the parse that follows (a 57 MB log polls ~20 %
# faster than with 8 MB reads); a line is cut only past MAX_LINE.
READ_BYTES = 1 << 20
MAX_LINE = 8 << 20


class Tail:
    """Complete lines appended to one file since the last call.

    Lines are split on `\\n` only: a tqdm bar's `\\r` redraws stay inside their line, where the
    assembler (`logical_lines`) can see them for what they are.
    """

    def __init__(self, path: str | Path, offset: int = 0) -> None:
        self.path = Path(path)
        self.offset = offset
        self.lineno = 0  # physical lines consumed so far (for file:line evidence)
        self.assembler = LineAssembler()

    @classmethod
    def at_end(cls, path: str | Path) -> "Tail":
        """A tail that hands out only what is written from now on."""
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        return cls(path, size)

    def _check_size(self) -> bool:
        """False when the file is gone; a file that shrank is read again from its start."""
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return False
        if size < self.offset:
            self.offset, self.lineno, self.assembler = 0, 0, LineAssembler()
        return True

    def chunks(self, count_lines: bool = True, max_bytes: int | None = None):
        """(line number before the chunk, bytes of complete lines) for what was appended;
        advances offset and lineno as each chunk is handed out (lineno only when
        `count_lines`: a reader that cites no line numbers skips the count). `max_bytes`
        bounds one call softly (a live view reads the rest on its next poll): a call stops
        once it has read that much, but always finishes the line it is in, so it may return
        up to one line (at most MAX_LINE) more."""
        if not self._check_size():
            return
        budget = max_bytes if max_bytes is not None else -1
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            while budget:
                data = f.read(READ_BYTES if budget < 0 else min(READ_BYTES, budget))
                if not data:
                    break
                end = data.rfind(b"\n")
                while end < 0 and len(data) < MAX_LINE:  # a long line: read on
                    more = f.read(READ_BYTES)
                    if not more:
                        break
                    data += more
                    end = data.rfind(b"\n")
                if end < 0:
                    if len(data) < MAX_LINE:
                        break  # a line still being written: next poll
                    end = len(data) - 1  # over-long: cut here
                chunk = data[: end + 1]
                self.offset += len(chunk)
                f.seek(self.offset)
                if budget > 0:
                    budget = max(budget - len(chunk), 0)
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
                    break  # a long line
                self.offset += end
                f.seek(self.offset)
                yield view, end
        for _, chunk in self.chunks(count_lines=False):
            yield chunk, len(chunk)

    def redraw(self, window: int = 4096) -> str:
        """The newest finished `\\r` redraw of the line still being written (a progress bar
        that has not ended its line yet), or "". Reads at most `window` bytes from the end and
        consumes nothing: `lines` hands out the whole line once it ends."""
        try:
            size = os.path.getsize(self.path)
            if size <= self.offset:
                return ""
            start = max(self.offset, size - window)
            with open(self.path, "rb") as f:
                f.seek(start)
                data = f.read(window)
        except OSError:
            return ""
        nl = data.rfind(b"\n")
        parts = data[nl + 1 :].split(b"\r")
        # the piece after the last \r may still be being drawn; a first piece the window cut
        # into is no redraw
        whole = parts[1:-1] if nl < 0 and start > self.offset else parts[:-1]
        return whole[-1].decode("utf-8", errors="replace") if whole else ""

    def lines(self, max_bytes: int | None = None) -> list[str]:
        """New complete physical lines (a trailing `\\r` dropped)."""
        out: list[str] = []
        for _, chunk in self.chunks(max_bytes=max_bytes):
            out.extend(
                ln.removesuffix("\r")
                for ln in chunk.decode("utf-8", errors="replace").split("\n")[:-1]
            )
        return out

    def records(self, max_bytes: int | None = None) -> list[dict]:
        """New JSON-object lines (a JSON-lines file); lines that do not parse are skipped."""
        out = []
        for line in self.lines(max_bytes):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def json_lines(self, max_bytes: int | None = None) -> list[tuple[str, dict]]:
        """New JSON-object lines as (the line as written, its object), parsed once: a store
        keeps the line itself, never a re-encoding of it."""
        lines = self.object_lines(max_bytes)
        return [(ln, o) for ln, o in zip(lines, decode_lines(lines)) if type(o) is dict]

    def object_lines(self, max_bytes: int | None = None) -> list[str]:
        """New lines that may hold a JSON object (stripped, starting with `{`), undecoded."""
        out: list[str] = []
        for _, chunk in self.chunks(count_lines=False, max_bytes=max_bytes):
            out.extend(
                ln
                for ln in map(str.strip, chunk.decode("utf-8", errors="replace").split("\n"))
                if ln[:1] == "{"
            )
        return out

    def logical_lines(self, final: bool = False) -> list[tuple[int, str]]:
        """(line number, logical line) pairs: `\\r`-glued bars split, wrapped dicts joined.
        `final` also returns what is held back (an unterminated last line)."""
        out: list[tuple[int, str]] = []
        for base, chunk in self.chunks():
            phys = chunk.decode("utf-8", errors="replace").split("\n")[:-1]
            for i, line in enumerate(phys):
                for logical in self.assembler.feed_lines((line,)):
                    out.append((base + i + 1, logical))
        if final:
            out.extend((self.lineno, s) for s in self.assembler.flush())
        return out


def decode_lines(lines: list[str]) -> list[Any]:
    """Each line's JSON value (None for a line that is not one)."""
    if not lines:
        return []
    try:  # one decoder call for them all: most of a line's cost is the call
        objs = json.loads("[" + ",".join(lines) + "]")
        if len(objs) == len(lines):
            return objs
    except ValueError:
        pass
    objs = []
    for ln in lines:  # a bad line among them (or one holding two values): one at a time
        try:
            objs.append(json.loads(ln))
        except ValueError:
            objs.append(None)
    return objs


class RankLogTail:
    """New lines of one rank's stdout and stderr, following the newest torchrun attempt.

    `backlog`: on first sight of an attempt's files, start with their last `backlog` lines
    instead of reading them from the start (a live view); None reads everything (an ingester).
    """

    def __init__(self, run: RunDir, rank: int, backlog: int | None = None):
        self.run, self.rank, self.backlog = run, rank, backlog
        self.files: list[Path] = []
        self.tails: list[Tail] = []

    def _follow(self) -> bool:
        """Take up the newest attempt's files; True when they changed (or on first look)."""
        files = self.run.rank_log_files(self.rank)
        if files == self.files:
            return False
        self.files = files
        self.tails = [Tail(p) if self.backlog is None else Tail.at_end(p) for p in files]
        return True

    def poll(self, max_bytes: int | None = None) -> tuple[list[str], bool]:
        """(new physical lines, whether the files changed: first look or a new attempt)."""
        changed = self._follow()
        if changed and self.backlog is not None:
            lines = [ln for p in self.files for ln in tail_lines(p, self.backlog)]
            return lines[-self.backlog :], True
        return [ln for t in self.tails for ln in t.lines(max_bytes)], changed

    def logical_lines(self) -> list[str]:
        """New logical lines (each file through its own assembler: `\r`-glued bars split,
        wrapped dicts joined), for parsers."""
        self._follow()
        return [lg for t in self.tails for lg in t.assembler.feed_lines(t.lines())]

    def redraws(self) -> list[str]:
        """Each file's newest redraw of a bar still running (`Tail.redraw`), where there is one."""
        return [r for t in self.tails if (r := t.redraw())]


def tail_lines(path: Path, n: int, block: int = 64 * 1024) -> list[str]:
    """The last `n` lines of a file, reading backwards only as far as needed."""
    try:
        f = open(path, "rb")
    except OSError:
        return []
    with f:
        f.seek(0, os.SEEK_END)
        pos = f.tell()
        data = b""
        while pos > 0 and data.count(b"\n") <= n:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:] if n > 0 else []


def follow(
    paths: list[Path], poll_s: float = 0.5, stop: Callable[[], bool] | None = None
) -> Iterator[str]:
    """Yield lines appended to any of `paths` until `stop()` is true (`logs --follow`)."""
    tails = [Tail.at_end(p) for p in paths]
    while True:
        got = False
        for t in tails:
            for line in t.lines():
                got = True
                yield line
        if stop is not None and stop():
            # one last read so nothing written before the stop is lost
            for t in tails:
                yield from t.lines()
            return
        if not got:
            time.sleep(poll_s)
