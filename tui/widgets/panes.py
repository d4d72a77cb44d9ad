"""The monitor's panes: a titled, focusable, maximisable box, and the text helpers the panes
share (bars, history strips, sizes).

A `Pane` is what Tab moves between and what `m` maximises (Textual's screen maximize). Its
title sits in its top border, the only border it has: at 80×24 every row counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from textual.containers import Vertical, VerticalScroll

PANE_CSS = """
    border-top: solid $panel-lighten-2;
    border-title-color: $text-muted;
    border-title-style: bold;
    padding: 0 1;
    height: 1fr;
    &:focus, &:focus-within {
        border-top: solid $accent;
        border-title-color: $text;
    }
    &.-maximized { height: 1fr; width: 1fr; }
"""


class Pane(Vertical):
    """A box of the monitor that holds focusable content (a log view, a list)."""

    ALLOW_MAXIMIZE = True
    DEFAULT_CSS = "Pane {" + PANE_CSS + "}"

    def __init__(self, *children, title: str = "", **kw):
        super().__init__(*children, **kw)
        self.border_title = title


class ScrollPane(VerticalScroll):
    """A box whose content is text: the box itself takes focus and scrolls."""

    ALLOW_MAXIMIZE = True
    DEFAULT_CSS = "ScrollPane {" + PANE_CSS + " scrollbar-size-vertical: 1; }"

    def __init__(self, *children, title: str = "", **kw):
        super().__init__(*children, **kw)
        self.border_title = title


# -- text helpers -------------------------------------------------------------------------

SPARK = "▁▂▃▄▅▆▇█"


def bar(frac: float | None, width: int) -> str:
    """A bar of `width` cells filled to `frac` (0..1); blank cells where unknown."""
    if width <= 0:
        return ""
    if frac is None or frac != frac:
        return "·" * width
    filled = int(round(max(0.0, min(frac, 1.0)) * width))
    return "█" * filled + "░" * (width - filled)


def colour_bar(frac: float | None, width: int, colour: str) -> str:
    """`bar` as markup: the filled part in `colour`, the rest dim."""
    b = bar(frac, width)
    full = b.count("█")
    return f"[{colour}]{b[:full]}[/][dim]{b[full:]}[/dim]"


def resample(values: Sequence[float | None], width: int) -> list[float | None]:
    """`width` points from a series: each the max of its share of the values (spikes
    survive), None where a share holds no value."""
    n = len(values)
    if width <= 0 or n == 0:
        return []
    if n <= width:
        return list(values)
    out: list[float | None] = []
    for i in range(width):
        lo, hi = i * n // width, max((i + 1) * n // width, i * n // width + 1)
        vals = [v for v in values[lo:hi] if v is not None]
        out.append(max(vals) if vals else None)
    return out


def strip(values: Sequence[float | None], width: int, top: float | None = None) -> str:
    """A one-line history strip of `width` cells, 0 at the bottom and `top` (default: the
    max) at the top; a space where there is no value."""
    pts = resample(values, width)
    known = [v for v in pts if v is not None]
    if not known:
        return " " * width
    hi = top if top else max(known) or 1.0
    out = []
    for v in pts:
        if v is None:
            out.append(" ")
        else:
            out.append(SPARK[max(0, min(len(SPARK) - 1, int(v / hi * (len(SPARK) - 1) + 0.5)))])
    return "".join(out).ljust(width)


def fmt_mib(mib: float | None) -> str:
    if mib is None:
        return "-"
    if mib >= 1024:
        gib = mib / 1024
        return f"{gib:.0f}G" if gib >= 100 else f"{gib:.1f}G"
    return f"{mib:.0f}M"


def fmt_pct(frac: float | None, digits: int = 1) -> str:
    return (
        "-"
        if frac is None or (isinstance(frac, float) and math.isnan(frac))
        else f"{100 * frac:.{digits}f}%"
    )
