"""Text for a terminal, shared by the front ends (the CLI and the TUI screens).

`clean` is the one sanitiser for text a terminal shows that came from a file or a user (run
names, ids, statuses, messages, error text): every CLI verb and the TUI's runs list and titles
print names and messages through it.
"""

from __future__ import annotations

import json
import re
import sys

# escape sequences a terminal acts on, removed whole (not just their ESC): CSI (colours, cursor
# moves, clear screen), OSC (window title, hyperlinks) ended by BEL or ST, DCS/PM/APC/SOS, the
# two-byte escapes (ESC c resets the terminal), and the 8-bit CSI/OSC forms
_ESCAPES = re.compile(
    r"""
      \x1b\[[0-?]*[ -/]*[@-~]
    | \x1b\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?
    | \x1b[P^_X][^\x1b\x9c]*(?:\x1b\\|\x9c)?
    | \x1b[ -/]*[0-~]
    | \x9b[0-?]*[ -/]*[@-~]
    | [\x90\x9d\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?
""",
    re.X,
)
_BREAKS = re.compile("\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")
# kept although invisible: they join emoji and ligatures and move nothing
_KEEP_FORMAT = {"\u200c", "\u200d"}


def clean(text: object, multiline: bool = False) -> str:
    """`text` safe to print to a terminal: escape sequences removed whole; every control
    character (C0, C1, DEL, NUL), bidi control (U+202A-202E, U+2066-2069, LRM/RLM/ALM), other
    invisible format character and lone surrogate removed; a line break of any kind becomes a
    space (a newline with `multiline`), a tab a space. Printable text, any script or emoji,
    stays as it is."""
    if text is None:
        return ""
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():
        return text
    text = _BREAKS.sub("\n" if multiline else " ", _ESCAPES.sub("", text).replace("\t", " "))
    return "".join(
        c for c in text if c.isprintable() or c in _KEEP_FORMAT or (multiline and c == "\n")
    )


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
