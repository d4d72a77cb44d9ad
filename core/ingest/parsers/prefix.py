"""Line prefixes that carry who and when: torchrun's `[rank1]:` and the glog-style
`E1130 09:44:07.868464 1409 file.py:986]` header of torch's C++ and Python loggers."""

from __future__ import annotations

import re
import time
from datetime import datetime

_RANK = re.compile(r"^\[(?:default|rank) ?(\d+)\]:")
_GLOG = re.compile(r"^\[?([IWEF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?")
_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T_](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?")


def split_rank(line: str) -> tuple[int | None, str]:
    """(rank, rest) for `[rank3]: text` (or torchrun's `--tee`/`[default3]:`); (None, line)
    otherwise. Every other prefix is normalize.py's."""
    if line.startswith("[") and ("rank" in line[:12] or "default" in line[:12]):
        m = _RANK.match(line)
        if m:
            rest = line[m.end() :]
            # one separator space; the rest is the line's own indentation (traceback frames)
            return int(m.group(1)), rest[1:] if rest.startswith(" ") else rest
    return None, line


def line_time(text: str, year: int | None = None) -> float | None:
    """Unix time from a glog header (no year: `year`, default this year) or an ISO stamp."""
    c = text[:1]
    if c in "IWEF[":
        m = _GLOG.match(text)
        if m:
            return _ts(year or time.localtime().tm_year, *m.groups()[1:])
    if "-" in text[:40]:
        m = _ISO.search(text[:40])
        if m:
            return _ts(*m.groups())
    return None


def _ts(y, mo, d, h, mi, s, frac=None) -> float | None:
    try:
        t = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s)).timestamp()
    except ValueError:
        return None
    return t + (float("0." + frac[:6]) if frac else 0.0)
