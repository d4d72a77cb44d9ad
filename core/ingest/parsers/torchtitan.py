"""torchtitan-style step lines:
`step: 10  loss:  7.12  memory: 30.1GiB(31.7%)  tps: 4,120  tflops: 120.3  mfu: 38.2%`
(often wrapped in ANSI colour codes, which are stripped first)."""

from __future__ import annotations

import re
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HEAD = re.compile(r"\bstep:\s*(\d+)\s")
_FIELD = re.compile(r"([A-Za-z_]+):\s*([-+]?[\d.,]+(?:e[-+]?\d+)?)\s*(GiB|%|)")


def parse_torchtitan(line: str) -> dict[str, Any] | None:
    if "step:" not in line:
        return None
    s = ANSI.sub("", line) if "\x1b" in line else line
    m = _HEAD.search(s + " ")
    if not m:
        return None
    out: dict[str, Any] = {"step": int(m.group(1))}
    for key, num, unit in _FIELD.findall(s[m.end() - 1 :]):
        try:
            value = float(num.replace(",", ""))
        except ValueError:
            continue
        key = key.lower()
        if key == "memory" and unit == "GiB":
            out["memory_gib"] = value
        elif key == "memory":
            out["memory_pct"] = value
        else:
            out[key] = value
    return out if len(out) > 1 else None
