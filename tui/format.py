"""Small formatting helpers shared by the CLI and the TUI screens."""

from __future__ import annotations

import json
import sys


def fmt_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_loss(loss: float | None) -> str:
    return "-" if loss is None else f"{loss:.4f}"


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1000:.1f}k" if x >= 10_000 else f"{x:.0f}"


def print_json(data) -> None:
    """The --json output of every command: indented, one trailing newline."""
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")
