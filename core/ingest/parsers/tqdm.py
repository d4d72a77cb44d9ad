"""tqdm progress bars: `Train:  12%|█▏   | 12/100 [00:03<00:22, 3.9it/s, loss=1.2]`.
A `loss=` in the postfix (scripts that show it there and print nothing else) is read too."""

from __future__ import annotations

import re
from typing import Any

_BAR = re.compile(
    r"(?:(?P<desc>[^|\r]*?):?\s*)?(?P<pct>\d+)%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)"
    r"(?:\s*\[(?P<elapsed>[\d:]+)(?:<(?P<remaining>[\d:?]+))?"
    r"(?:,\s*(?P<rate>[\d.]+|\?)\s*(?P<unit>[A-Za-z]+/[A-Za-z]+))?)?")
_POSTFIX_LOSS = re.compile(r"\bloss=([-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))[,\]\s]")


def parse_tqdm(line: str) -> dict[str, Any] | None:
    """n, total, elapsed_s, remaining_s, s_per_it / it_per_s; None when not a bar."""
    if "%|" not in line:
        return None
    m = _BAR.search(line)
    if not m:
        return None
    out: dict[str, Any] = {"n": int(m["n"]), "total": int(m["total"]),
                           "desc": (m["desc"] or "").strip()}
    if m["elapsed"]:
        out["elapsed_s"] = clock_s(m["elapsed"])
    if m["remaining"] and "?" not in m["remaining"]:
        out["remaining_s"] = clock_s(m["remaining"])
    if m["rate"] and m["rate"] != "?":
        rate, unit = float(m["rate"]), m["unit"] or ""
        if unit.startswith("s/"):
            out["s_per_it"] = rate
        elif unit.endswith("/s"):
            out["it_per_s"] = rate
    loss = _POSTFIX_LOSS.search(line, m.end())
    if loss:
        out["loss"] = float(loss.group(1))
    return out


def clock_s(text: str) -> float:
    """`01:02:03` / `02:03` → seconds."""
    total = 0.0
    for part in text.split(":"):
        total = total * 60 + float(part or 0)
    return total
