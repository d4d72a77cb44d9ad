"""Metric dicts, one per line: JSON (built-in events, ms-swift logging.jsonl) and Python dict
reprs (ms-swift and HF Trainer consoles). transformers ≥ 5 prints every float as a string
(`'loss': '6.914'`), older versions print raw numbers; both come back as floats here.
Strings that are not numbers (`'global_step/max_steps': '1/5'`, `'elapsed_time': '0s'`) stay
strings; the meaning of keys is metrics.py's business.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# 'key': value  — value is a quoted string, a list, or a bare token (number, nan, None, ...)
_PAIR = re.compile(r"""'([^'\\]+)'\s*:\s*('[^']*'|"[^"]*"|\[[^\]]*\]|[^,}]+)""")
_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)")
_BARE_TOKEN = re.compile(r":\s*(?:nan|-?inf|None|True|False)\b")
_BARE = {
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "None": None,
    "True": True,
    "False": False,
}


def parse_dict_line(line: str) -> dict[str, Any] | None:
    """The dict on this line, or None. Values that look like numbers become floats/ints."""
    s = line.strip()
    if len(s) < 2 or s[0] != "{" or s[-1] != "}":
        return None
    if s[1] == '"':
        try:
            d = json.loads(s)
        except ValueError:
            return None
        return d if isinstance(d, dict) else None
    if '"' not in s and "\\" not in s and not _BARE_TOKEN.search(s):
        # fast path: a repr without quotes inside values is JSON once quotes are swapped
        try:
            d = json.loads(s.replace("'", '"'))
        except ValueError:
            d = None
        if isinstance(d, dict):
            for k, v in d.items():
                if type(v) is str and _NUM.fullmatch(v):
                    d[k] = float(v) if not v.isdigit() else int(v)
            return d
    pairs = _PAIR.findall(s)
    if not pairs:
        return None
    return {k: _value(v) for k, v in pairs}


def _value(v: str) -> Any:
    v = v.strip()
    if v[0] in "'\"":
        v = v[1:-1]
        num = to_number(v)
        return v if num is None else num
    if v in _BARE:
        return _BARE[v]
    num = to_number(v)
    return v if num is None else num


def to_number(v: str) -> int | float | None:
    if not _NUM.fullmatch(v):
        return None
    return int(v) if v.isdigit() else float(v)
