"""Read what was appended to a file since the last look, by byte offset.

Files are never re-read from the start: callers keep the offset. Only complete lines are
returned, so a line that is still being written is picked up whole on the next call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

CHUNK = 1 << 20


def read_new_lines(path: Path, offset: int, max_bytes: int = 16 * CHUNK) -> tuple[list[str], int]:
    """Complete lines after `offset`, and the offset just past the last one returned.

    A file that shrank (rotated or truncated) is read again from its start.
    """
    try:
        size = os.path.getsize(path)
    except OSError:
        return [], offset
    if size < offset:
        offset = 0
    if size == offset:
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(min(size - offset, max_bytes))
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    chunk = data[: end + 1]
    # split on \n only: a tqdm bar's \r updates belong to the line they end up on
    lines = [ln.removesuffix("\r") for ln in
             chunk.decode("utf-8", errors="replace").split("\n")[:-1]]
    return lines, offset + len(chunk)


def read_new_json(path: Path, offset: int) -> tuple[list[dict], int]:
    """Like read_new_lines for JSON-lines files; lines that do not parse are skipped."""
    lines, new_offset = read_new_lines(path, offset)
    out = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out, new_offset


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


def follow(paths: list[Path], poll_s: float = 0.5, stop=None) -> Iterator[str]:
    """Yield lines appended to any of `paths` until `stop()` is true (used by `logs --follow`)."""
    import time

    offsets = {p: (os.path.getsize(p) if p.exists() else 0) for p in paths}
    while True:
        got = False
        for p in paths:
            lines, offsets[p] = read_new_lines(p, offsets[p])
            for line in lines:
                got = True
                yield line
        if stop is not None and stop():
            # one last read so nothing written before the stop is lost
            for p in paths:
                lines, offsets[p] = read_new_lines(p, offsets[p])
                yield from lines
            return
        if not got:
            time.sleep(poll_s)
