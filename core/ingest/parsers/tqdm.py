"""tqdm progress bars: `Train:  12%|█▏   | 12/100 [00:03<00:22, 3.9it/s, loss=1.2]`.
A `loss=` in the postfix (scripts that show it there and print nothing else) is read too."""

from __future__ import annotations

import re
from typing import Any

_BAR = re.compile(
    r"(?:(?P<desc>[^|\r]*?):?\s*)?(?P<pct>\d+)%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)"
    r"(?:\s*\[(?P<elapsed>[\d:]+)(?:<(?P<remaining>[\d:?]+))?"
    r"(?:,\s*(?P<rate>[\d.]+|\?)\s*(?P<unit>[A-Za-z]+/[A-Za-z]+))?)?"
)
# `loss=` in tqdm's postfix; Lightning's bar says `train_loss=` / `train_loss_step=`
_POSTFIX_LOSS = re.compile(
    r"(?:\b|train_)loss(?:_step)?=([-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))"
    r"[,\]\s]"
)
_EPOCH = re.compile(r"^Epoch (\d+):")
# the same bar where the terminal (or a notebook's capture) dropped the bar itself:
# `Epoch 0:  98% 1663/1702 [13:02<00:18,  2.12it/s, loss=0.158]` (the bracket is required)
_BARLESS = re.compile(
    r"(?:(?P<desc>[^|\r%]*?):?\s*)?(?P<pct>\d+)% +(?P<n>\d+)/(?P<total>\d+)"
    r"\s*\[(?P<elapsed>[\d:]+)(?:<(?P<remaining>[\d:?]+))?"
    r"(?:,\s*(?P<rate>[\d.]+|\?)\s*(?P<unit>[A-Za-z]+/[A-Za-z]+))?"
)


def parse_tqdm(line: str) -> dict[str, Any] | None:
    """n, total, elapsed_s, remaining_s, s_per_it / it_per_s; None when not a bar."""
    if "%|" in line:
        m = _BAR.search(line)
    elif "% " in line and "/" in line and "[" in line:
        m = _BARLESS.search(line)
    else:
        return None
    if not m:
        return None
    out: dict[str, Any] = {
        "n": int(m["n"]),
        "total": int(m["total"]),
        "desc": (m["desc"] or "").strip(),
    }
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
    ep = _EPOCH.match(out["desc"] + ":") if out["desc"].startswith("Epoch ") else None
    if ep and "v_num" in line:
        # Lightning counts each epoch's batches from 0: the run's step is epochs × batches + n
        out["n"] += int(ep.group(1)) * out["total"]
        out["total"] = max(out["total"], out["n"])
    return out


def clock_s(text: str) -> float:
    """`01:02:03` / `02:03` → seconds."""
    total = 0.0
    for part in text.split(":"):
        total = total * 60 + float(part or 0)
    return total
