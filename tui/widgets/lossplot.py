"""LossPlot: a run's loss over the whole run, in braille, with axes, zoom and pan.

API (what a screen uses)::

    plot = LossPlot(run_dir)            # a run directory (str, Path or RunDir): its own Store
    plot = LossPlot(fetch)              # or a callable: fetch(start, end, buckets, metrics)
    plot = LossPlot(traces=[Trace("run-a", dir_a), Trace("run-b", dir_b)])   # overlay (Compare)
    plot.refresh_data()                 # re-query the visible window (a live run: every second)

Keywords: `rank=0` (whose step events; the loss is all-reduced, so rank 0 is the run's),
`title="loss"`, and Textual's `id`/`classes`/`name`. State a screen or a test may read:
`view` ((first, last) step or None for the whole run), `extent` (the run's step range),
`following`, `log_y`, `show_eval`, `show_lr`, `show_grad`, `smoothing`, `cursor`, `loaded`, `up_to_date` (the newest
request's answer is drawn), `rendered_text()` (the chart as plain text).

`fetch(start, end, buckets, metrics) -> Window` returns `Store.step_series` and
`Store.eval_series` results for steps [start, end] (None: the run's first / last step);
`buckets=0` asks only for the range. It runs in a thread worker, never on the event loop.
`RunSource(run_dir, rank)` is the fetch a run directory gets (one read-only Store, closed when
the widget unmounts); `RunSource.for_run_id(run_id)` resolves the run in the worker.

The view is a window of steps; "home" is the whole run. A view that reaches the run's last step
follows it: each `refresh_data()` slides the window (or grows the whole-run view) to the newest
step. Each column of braille dots is one bucket's min..max (so a single spike survives any
zoom), joined to its neighbours; the smoothed line is an EMA of the bucket means with a weight
per step (`smoothing`, as W&B's), so it reads the same at any zoom. Eval loss is drawn as ◆ per
character cell (its mean there); learning rate and grad norm, on demand, each get a strip of
their own under the loss, on the same steps, with their own labelled axis (max, name, min over
the window). NaN losses put a red × on the top row.

Keys (when the plot has focus; `action_*` methods a screen can bind as well):
    + / -        zoom in / out (at the end while following, else about the centre)
    h l          pan a quarter of the window        0 / home   whole run
    ← →          cursor: step, loss, EMA, eval, lr, grad norm there (a click too); c hides it
    , .          less / more smoothing (EMA weight per step, 0 … 0.99, shown in the legend)
    end          jump to the newest steps (follow)  y          log y axis
    t            eval loss on/off                   r / g      learning rate / grad norm on/off
(not e and n: the monitor, which holds this plot, binds those to first error and next match)
The mouse wheel zooms too.
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

from rich.segment import Segment
from rich.style import Style
from textual import events, work
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from tunedeck.core.rundir import RunDir

# -- data ---------------------------------------------------------------------------------


@dataclass
class Window:
    """One trace's data for one window: `Store.step_series` and `Store.eval_series` results."""

    steps: dict[str, Any]
    evals: dict[str, Any]

    def extent(self) -> tuple[int, int] | None:
        ends = [
            (d["first"], d["last"]) for d in (self.steps, self.evals) if d.get("first") is not None
        ]
        if not ends:
            return None
        return min(a for a, _ in ends), max(b for _, b in ends)


Fetch = Callable[[int | None, int | None, int, Sequence[str]], Window]


class RunSource:
    """The fetch of one run directory: a read-only Store of its own, used by one worker at a
    time. `run_ref` (for_run_id) is resolved through the registry on first use, in the
    worker."""

    def __init__(
        self, run_dir: str | Path | RunDir | None = None, rank: int = 0, run_ref: str | None = None
    ):
        self.run_dir = run_dir
        self.run_ref = run_ref
        self.rank = rank
        self._store = None
        self._closed = False  # closed with its widget: for good
        self._lock = threading.Lock()

    @classmethod
    def for_run_id(cls, run_ref: str, rank: int = 0) -> "RunSource":
        return cls(None, rank, run_ref)

    def _open(self):
        if self._closed:  # a fetch that outlived its screen: no new connection to leak
            raise RuntimeError("the chart was closed")
        if self._store is None:
            from tunedeck.core.api import Store

            if self.run_dir is None:
                from tunedeck.core.api import find_run

                self.run_dir = find_run(self.run_ref).run_dir
            self._store = Store(self.run_dir)
        return self._store

    def __call__(
        self, start: int | None, end: int | None, buckets: int, metrics: Sequence[str]
    ) -> Window:
        with self._lock:
            store = self._open()
            return Window(
                store.step_series(self.rank, start, end, buckets, metrics),
                store.eval_series(self.rank, start, end, buckets),
            )

    def tokens_per_step(self) -> float | None:
        """Tokens the whole run trains on per step: each rank's mean tokens per step, summed
        over the ranks (ranks are numbered from 0; the first without steps ends them)."""
        with self._lock:
            store = self._open()
            total, rank = 0.0, 0
            while (s := store.step_series(rank, None, None, 1, ("tokens",)))["first"] is not None:
                pairs = [(v, n) for v, n in zip(s["tokens"], s["n"]) if v is not None]
                total += sum(v * n for v, n in pairs) / max(sum(n for _, n in pairs), 1)
                rank += 1
            return total or None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._store is not None:
                self._store.close()
                self._store = None


class ByTokens:
    """A run's fetch on an x axis of tokens seen instead of steps (compare runs of different
    batch sizes or ranks by data seen): step s sits at s × the run's tokens per step (the
    mean over the run: exact for packed batches, close for padded ones)."""

    def __init__(self, source: RunSource):
        self.source = source
        self.per_step: float | None = None

    def __call__(
        self, start: int | None, end: int | None, buckets: int, metrics: Sequence[str]
    ) -> Window:
        if self.per_step is None:
            self.per_step = self.source.tokens_per_step()
            if self.per_step is None:
                raise ValueError("the run records no tokens per step")
        k = self.per_step
        w = self.source(
            None if start is None else int(start // k),
            None if end is None else math.ceil(end / k),
            buckets,
            metrics,
        )
        return Window(_x_times(w.steps, k), _x_times(w.evals, k))

    def close(self) -> None:
        self.source.close()


def _x_times(series: dict[str, Any], k: float) -> dict[str, Any]:
    """A series with its step numbers (x) multiplied by k."""
    out = dict(series)
    for key in ("first", "last", "start", "end"):
        if out.get(key) is not None:
            out[key] = round(out[key] * k)
    for key in ("step", "step_max"):
        if out.get(key) is not None:
            out[key] = [round(x * k) for x in out[key]]
    return out


@dataclass
class Trace:
    """One curve of the plot: a label for the legend, where its data comes from, a colour
    (None: the palette's next)."""

    label: str
    source: str | Path | RunDir | Fetch
    color: str | None = None
    parent: bool = False  # the run this one resumed: drawn dim, behind, joined at the resume


PALETTE = ("#5fafff", "#ff8700", "#87d75f", "#d787ff", "#ffd75f", "#5fd7d7", "#ff5f87", "#bcbcbc")
RAW = "#4e7396"  # single run: the raw min..max band
EMA = "#5fd7ff"  # single run: the smoothed line
EVAL = "#ffaf00"
LR = "#87d787"
GRAD = "#d787d7"
NAN = "#ff5f5f"
AXIS = "#8a8a8a"
SMOOTHING = (0.0, 0.3, 0.6, 0.8, 0.9, 0.95, 0.99)  # the EMA weights , and . step through
CURSOR = "#e4e4e4"
MIN_SPAN = 10  # the narrowest window, in steps


def _dim(color: str, keep: float = 0.55) -> str:
    """A darker shade of a #rrggbb colour (the raw band under its run's smoothed line)."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return "#{:02x}{:02x}{:02x}".format(*(int(c * keep) for c in (r, g, b)))


# -- drawing (pure: decimated buckets in, lines of segments out) ----------------------------


@dataclass
class TraceView:
    label: str
    color: str
    window: Window | None
    parent: bool = False


@dataclass
class Frame:
    """Everything one drawing needs."""

    start: int  # the x window, steps
    end: int
    last: int | None  # the run's newest step (the header says "of N")
    traces: list[TraceView]
    log_y: bool = False
    show_eval: bool = True
    show_lr: bool = False
    show_grad: bool = False
    whole: bool = True  # the view is the whole run
    following: bool = False
    title: str = "loss"
    message: str | None = None  # shown instead of a chart (no data, an error)
    smoothing: float = 0.6  # the EMA's weight per step (0: none), as W&B's slider
    cursor: int | None = None  # the step the readout reads (None: no cursor)
    x_unit: str = "steps"  # or "tokens" (traces fetched through ByTokens)


# braille dots: bit of (dx, dy) in a 2 x 4 cell
_DOT = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
# bits of dots dy = a..b in one half of a cell
_RUN = [[[0] * 4 for _ in range(4)] for _ in range(2)]
for _side in range(2):
    for _a in range(4):
        for _b in range(_a, 4):
            _RUN[_side][_a][_b] = sum(_DOT[_side][k] for k in range(_a, _b + 1))


class _Layer:
    __slots__ = ("bits", "style", "w", "h")

    def __init__(self, w: int, h: int, style: Style):
        self.bits = bytearray(w * h)
        self.style = style
        self.w, self.h = w, h

    def vline(self, x: int, y0: int, y1: int) -> None:
        """Dots y0..y1 (either order, clipped) of dot column x."""
        if y0 > y1:
            y0, y1 = y1, y0
        top = self.h * 4 - 1
        if y1 < 0 or y0 > top or x < 0 or x >= self.w * 2:
            return
        y0, y1 = max(y0, 0), min(y1, top)
        side, cx = x & 1, x >> 1
        r0, r1 = y0 >> 2, y1 >> 2
        bits, w, run = self.bits, self.w, _RUN[side]
        if r0 == r1:
            bits[r0 * w + cx] |= run[y0 & 3][y1 & 3]
            return
        bits[r0 * w + cx] |= run[y0 & 3][3]
        full = run[0][3]
        for r in range(r0 + 1, r1):
            bits[r * w + cx] |= full
        bits[r1 * w + cx] |= run[0][y1 & 3]

    def polyline(self, pts: list[tuple[int, float]]) -> None:
        """Join points (dot column, dot row) in column order: each column covers the rows
        between its neighbours' interpolated heights."""
        prev = None
        for x, y in pts:
            if prev is None:
                self.vline(x, round(y), round(y))
            else:
                px, py = prev
                if x == px:
                    self.vline(x, round(py), round(y))
                else:
                    dy = (y - py) / (x - px)
                    for k in range(px + 1, x + 1):
                        self.vline(k, round(py + dy * (k - 1 - px)), round(py + dy * (k - px)))
            prev = (x, y)


def _columns(
    series: dict[str, Any], metric: str, start: int, end: int, ncols: int
) -> tuple[list, list, list, list]:
    """Buckets merged into ncols columns of the window: (lo, mean, hi, nan) per column, None
    where a column has no value."""
    lo: list = [None] * ncols
    hi: list = [None] * ncols
    wsum = [0.0] * ncols
    wcnt = [0] * ncols
    nan = [0] * ncols
    if metric not in series:  # not fetched yet (lr just switched on): nothing to draw
        return lo, [None] * ncols, hi, nan
    span = end - start + 1
    steps, smax = series.get("step") or [], series.get("step_max") or []
    mins, means, maxs = (
        series.get(metric + "_min") or [],
        series.get(metric) or [],
        series.get(metric + "_max") or [],
    )
    ns, nans = series.get("n") or [], series.get("nan") or []
    for i, a in enumerate(steps):
        b = smax[i]
        if b < start or a > end:
            continue
        c0 = (max(a, start) - start) * ncols // span
        c1 = (min(b, end) - start) * ncols // span
        if c1 > c0 and (min(b, end) - max(a, start) + 1) * ncols <= 1.5 * span:
            # a bucket about one column wide that straddles columns: the column of its
            # middle (a one-step spike is one column wide, not two)
            c0 = c1 = (((max(a, start) + min(b, end)) // 2) - start) * ncols // span
        m_lo, m_mean, m_hi = mins[i], means[i], maxs[i]
        n = ns[i] if i < len(ns) else 1
        for c in range(c0, c1 + 1):
            if i < len(nans) and nans[i]:
                nan[c] += nans[i]
            if m_mean is None:
                continue
            if lo[c] is None or m_lo < lo[c]:
                lo[c] = m_lo
            if hi[c] is None or m_hi > hi[c]:
                hi[c] = m_hi
            wsum[c] += m_mean * n
            wcnt[c] += n
    mean = [wsum[c] / wcnt[c] if wcnt[c] else None for c in range(ncols)]
    return lo, mean, hi, nan


def _ema(mean: list, weight: float, steps_per_col: float) -> list:
    """The column means smoothed as an EMA of weight `weight` per step (a column of k steps
    decays by weight**k), so a smoothing reads the same at any zoom, as in W&B."""
    out: list = [None] * len(mean)
    acc, last = None, None
    for c, v in enumerate(mean):
        if v is None:
            continue
        if acc is None:
            acc = v
        else:
            acc += (1 - weight ** ((c - last) * steps_per_col)) * (v - acc)
        out[c] = acc
        last = c
    return out


def _at(series: dict[str, Any], metric: str, step: int) -> tuple[float | None, int, int] | None:
    """(mean, first step, last step) of the bucket holding `step`, else of the nearest one."""
    steps, smax, vals = series.get("step") or [], series.get("step_max") or [], series.get(metric)
    if not steps or not vals:
        return None
    i = bisect.bisect_right(steps, step) - 1
    best = None
    for j in (i, i + 1):
        if 0 <= j < len(steps) and vals[j] is not None:
            d = 0 if steps[j] <= step <= smax[j] else min(abs(steps[j] - step), abs(smax[j] - step))
            if best is None or d < best[0]:
                best = (d, j)
    if best is None:
        return None
    j = best[1]
    return vals[j], steps[j], smax[j]


def _nearest(values: list, x: int) -> float | None:
    """The value at index x, else the closest one within 2 (a cursor between dot columns)."""
    for d in (0, -1, 1, -2, 2):
        if 0 <= x + d < len(values) and values[x + d] is not None:
            return values[x + d]
    return None


def _nice(x: float) -> float:
    """1, 2 or 5 times a power of ten, at least x."""
    if x <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * p >= x * (1 - 1e-9):
            return m * p
    return 10 * p


def fmt_step(n: float) -> str:
    n = int(round(n))
    for size, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1000, "k")):
        if abs(n) >= size * (10 if unit == "k" else 1):
            v = n / size
            s = (
                f"{v:.2f}".rstrip("0").rstrip(".")
                if v < 10
                else (f"{v:.1f}".rstrip("0").rstrip(".") if v < 100 else f"{v:.0f}")
            )
            return s + unit
    return str(n)


def fmt_value(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e4 or a < 1e-3:
        return f"{v:.1e}".replace("e-0", "e-").replace("e+0", "e")
    return f"{v:.3g}"


def _y_ticks(lo: float, hi: float, rows: int, log: bool) -> list[float]:
    """Tick values (in value space) for a range; `log`: lo/hi are log10 of the values."""
    want = max(2, rows // 3)
    if log:
        ticks = [
            m * 10.0**k for k in range(math.floor(lo) - 1, math.ceil(hi) + 1) for m in (1, 2, 5)
        ]
        ticks = [t for t in ticks if lo - 1e-9 <= math.log10(t) <= hi + 1e-9]
        while len(ticks) > want and len(ticks) > 2:
            ticks = ticks[::2]
        if len(ticks) >= 2:
            return ticks
        lo, hi = 10**lo, 10**hi
    step = _nice((hi - lo) / want)
    first = math.ceil(lo / step - 1e-9) * step
    out, t = [], first
    while t <= hi + step * 1e-9:
        out.append(round(t, 12))
        t += step
    return out


def render_chart(f: Frame, width: int, height: int) -> list[list[Segment]]:
    """The chart as `height` lines of segments, `width` cells each."""
    if f.message is not None or height < 5 or width < 24:
        header = _header(f, width)
        body = [[Segment(" " * width)] for _ in range(max(height - 1, 0))]
        if f.message is not None and body:
            body[len(body) // 2] = _pad(
                [Segment(f.message.center(width)[:width], Style(color=AXIS))], width
            )
        return ([header] + body)[:height]
    ph = height - 3  # header, x axis, x labels
    multi = sum(not tv.parent for tv in f.traces) > 1
    strips = _strips(f, multi, ph)
    ph -= sum(rows for _, rows, _ in strips)
    # per trace: columns at dot resolution of a provisional width; the y range needs values
    # first, the y labels' width needs the range, the plot width needs the labels: two passes
    yw = 6
    for _ in range(2):
        pw = max(width - yw - 1, 4)
        ncols = pw * 2
        cols = []
        values: list[float] = []
        for tv in f.traces:
            if tv.window is None:
                cols.append(None)
                continue
            lo, mean, hi, nan = _columns(tv.window.steps, "loss", f.start, f.end, ncols)
            ev = (
                _columns(tv.window.evals, "eval_loss", f.start, f.end, pw)[1]
                if f.show_eval
                else [None] * pw
            )
            cols.append((lo, mean, hi, nan, ev))
            values += [v for v in lo if v is not None] + [v for v in hi if v is not None]
            values += [v for v in ev if v is not None]
        if f.log_y:
            values = [math.log10(v) for v in values if v > 0]
        if not values:
            ymin, ymax = (0.0, 1.0)
        else:
            ymin, ymax = min(values), max(values)
        if ymax - ymin < 1e-12:
            pad = abs(ymax) * 0.05 or (0.05 if f.log_y else 0.5)
            ymin, ymax = ymin - pad, ymax + pad
        ticks = _y_ticks(ymin, ymax, ph, f.log_y)
        labels = [fmt_value(t) for t in ticks]
        strip_labels = [x for _, _, rng in strips for x in (*map(fmt_value, rng), "grad")]
        need = max((len(s) for s in labels + strip_labels), default=1) + 1
        if need == yw:
            break
        yw = max(need, 4)
    dots_h = ph * 4

    def ydot(v: float) -> float | None:
        if f.log_y:
            if v <= 0:
                return None
            v = math.log10(v)
        return (ymax - v) / (ymax - ymin) * (dots_h - 1)

    markers: dict[int, tuple[str, Style]] = {}
    legend: list[tuple[str, Style]] = []
    # lowest priority first: raw bands, lr/grad, smoothed lines; markers over everything
    raws, lines, extras = [], [], []
    emas: list[list | None] = []
    nan_steps = 0
    for tv, c in zip(f.traces, cols):
        if c is None:
            emas.append(None)
            continue
        lo, mean, hi, nan, ev = c
        raw = _Layer(pw, ph, Style(color=_dim(tv.color) if multi or tv.parent else RAW))
        pts = []
        for x in range(ncols):
            if mean[x] is None:
                continue
            a, b, m = ydot(lo[x]), ydot(hi[x]), ydot(mean[x])
            if m is None:
                continue
            pts.append((x, m))
            raw.vline(x, round(a if a is not None else m), round(b if b is not None else m))
        raw.polyline(pts)
        # overlaid runs: the raw bands of several runs are braille clutter; each run's
        # smoothed line alone, unless the smoothing is off (0 shows the raw curves)
        if not multi or f.smoothing == 0:
            raws.append(raw)
        smooth = _Layer(
            pw,
            ph,
            Style(color=_dim(EMA, 0.6), dim=True)
            if tv.parent
            else Style(color=tv.color if multi else EMA, bold=True),
        )
        ema = _ema(mean, f.smoothing, (f.end - f.start + 1) / ncols)
        emas.append(ema)
        smooth.polyline(
            [(x, y) for x, v in enumerate(ema) if v is not None and (y := ydot(v)) is not None]
        )
        lines.append(smooth)
        eval_style = Style(color=tv.color if multi else EVAL, bold=True)
        for cx, v in enumerate(ev):
            y = ydot(v) if v is not None else None
            if y is not None:
                markers[int(y) // 4 * pw + cx] = ("◆", eval_style)
        for x, k in enumerate(nan):
            if k:
                markers[x // 2] = ("×", Style(color=NAN, bold=True))
        nan_steps += sum(nan)
    if nan_steps:
        legend.append(("× NaN loss", Style(color=NAN, bold=True)))
    cursor_cx = None
    if f.cursor is not None and f.start <= f.cursor <= f.end:
        cursor_cx = (f.cursor - f.start) * pw // (f.end - f.start + 1)
    rows = _compose(raws + extras + lines, markers, pw, ph, cursor_cx)
    # axes
    tick_rows: dict[int, str] = {}
    for t, s in zip(ticks, labels):
        y = ydot(t)
        if y is None:
            continue
        r = int(round(y)) // 4
        if 0 <= r < ph and r not in tick_rows:
            tick_rows[r] = s
    axis = Style(color=AXIS)
    if f.cursor is not None:
        x = (f.cursor - f.start) * ncols // (f.end - f.start + 1)
        out = [_readout(f, emas, x, width)]
    else:
        out = [_header(f, width, legend)]
    for r in range(ph):
        lab = tick_rows.get(r)
        left = [Segment((lab or "").rjust(yw), axis), Segment("┤" if lab else "│", axis)]
        out.append(_pad(left + rows[r], width))
    xt = _x_ticks(f.start, f.end, pw)
    line = ["─"] * pw
    labels_row = [" "] * (pw + yw + 1)
    for step, cx in xt:
        line[cx] = "┬"
        text = fmt_step(step)
        at = yw + 1 + cx - len(text) // 2
        at = min(max(at, 0), len(labels_row) - len(text))
        if all(ch == " " for ch in labels_row[max(at - 1, 0) : at + len(text) + 1]):
            labels_row[at : at + len(text)] = list(text)
    for metric, rows_n, (lo, hi) in strips:
        out += _strip_rows(f, metric, rows_n, lo, hi, ncols, pw, yw, width, cursor_cx)
    out.append(_pad([Segment(" " * yw + "└" + "".join(line), axis)], width))
    out.append(_pad([Segment("".join(labels_row), axis)], width))
    return out[:height]


STRIPS = (("lr", "show_lr", "lr", LR), ("grad_norm", "show_grad", "grad", GRAD))


def _strips(f: Frame, multi: bool, ph: int) -> list[tuple[str, int, tuple[float, float]]]:
    """(metric, rows, (min, max) over the window) of each lr/grad-norm strip that is on and
    has values; a strip takes a fifth of the plot (3 rows at least) while the loss keeps 4."""
    tv = next((t for t in f.traces if not t.parent), None)
    if multi or tv is None or tv.window is None:
        return []
    rows = max(3, ph // 5)
    out = []
    for metric, attr, _, _ in STRIPS:
        if not getattr(f, attr) or ph - (len(out) + 1) * rows < 4:
            continue
        lows, _, highs, _ = _columns(tv.window.steps, metric, f.start, f.end, 64)
        vals = [v for v in lows + highs if v is not None]
        if vals:
            out.append((metric, rows, (min(vals), max(vals))))
    return out


def _strip_rows(
    f: Frame, metric, rows, lo, hi, ncols, pw, yw, width, cursor_cx
) -> list[list[Segment]]:
    """One metric under the loss on the same steps: its column means over its own axis,
    labelled with the window's max (top), its name (middle) and min (bottom)."""
    tv = next(t for t in f.traces if not t.parent)
    _, mean, _, _ = _columns(tv.window.steps, metric, f.start, f.end, ncols)
    name, color = next((n, c) for m, _, n, c in STRIPS if m == metric)
    layer = _Layer(pw, rows, Style(color=color))
    dots = rows * 4 - 1
    layer.polyline(
        [
            (x, (hi - v) / (hi - lo) * dots if hi > lo else dots / 2)
            for x, v in enumerate(mean)
            if v is not None
        ]
    )
    body = _compose([layer], {}, pw, rows, cursor_cx)
    labels = {0: fmt_value(hi), rows // 2: name, rows - 1: fmt_value(lo)}
    out = []
    for r in range(rows):
        lab = labels.get(r, "")
        edge = "├" if r == 0 else ("┤" if lab and lab != name else "│")
        out.append(
            _pad(
                [Segment(lab.rjust(yw), Style(color=color)), Segment(edge, Style(color=AXIS))]
                + body[r],
                width,
            )
        )
    return out


def _compose(
    layers: list[_Layer],
    markers: dict[int, tuple[str, Style]],
    pw: int,
    ph: int,
    cursor_cx: int | None = None,
) -> list[list[Segment]]:
    """Cells from the layers (dots OR-ed, the colour of the top layer with a dot there) and
    the markers, as segments of equal style per row; the cursor's column is a thin line
    where it is empty and highlighted where a curve crosses it."""
    cursor_line = Style(color=CURSOR, dim=True)
    n = pw * ph
    bits = bytearray(n)
    owner: list[Style | None] = [None] * n
    for layer in layers:
        lb, st = layer.bits, layer.style
        for i in range(n):
            v = lb[i]
            if v:
                bits[i] |= v
                owner[i] = st
    rows = []
    for r in range(ph):
        segs: list[Segment] = []
        run: list[str] = []
        run_style: Style | None = None
        base = r * pw
        for c in range(pw):
            i = base + c
            m = markers.get(i)
            if m is not None:
                ch, st = m
            elif bits[i]:
                ch, st = chr(0x2800 + bits[i]), owner[i]
                if c == cursor_cx:
                    st = (st or Style()) + Style(bgcolor="#444444")
            elif c == cursor_cx:
                ch, st = "│", cursor_line
            else:
                ch, st = " ", None
            if st is not run_style and run:
                segs.append(Segment("".join(run), run_style))
                run = []
            run_style = st
            run.append(ch)
        if run:
            segs.append(Segment("".join(run), run_style))
        rows.append(segs)
    return rows


def _x_ticks(start: int, end: int, pw: int) -> list[tuple[int, int]]:
    """(step, cell column) of round step numbers at least ~10 cells apart."""
    span = end - start + 1
    per_cell = span / pw
    step = max(1, int(_nice(per_cell * 10)))
    out = []
    t = -(-start // step) * step
    while t <= end:
        cx = int((t - start) * pw // span)
        if 0 <= cx < pw:
            out.append((t, cx))
        t += step
    return out


def _header(f: Frame, width: int, legend: list | None = None) -> list[Segment]:
    multi = sum(not tv.parent for tv in f.traces) > 1
    if f.x_unit == "tokens":
        if f.last is None:
            where = "no steps yet"
        elif f.whole:
            where = f"all {fmt_step(f.last)} tokens"
        else:
            where = f"tokens {fmt_step(f.start)}–{fmt_step(f.end)} of {fmt_step(f.last)}"
    elif f.whole:
        where = f"all {f.last:,} steps" if f.last is not None else "no steps yet"
    else:
        where = f"steps {f.start:,}–{f.end:,} of {f.last:,}" if f.last is not None else ""
    flags = [x for x, on in (("log y", f.log_y), ("following", f.following and not f.whole)) if on]
    segs = [Segment(f.title, Style(bold=True)), Segment("  " + where, Style(color=AXIS))]
    if flags:
        segs.append(Segment("  · " + " · ".join(flags), Style(color=AXIS)))
    items: list[tuple[str, Style]] = []
    if multi:
        items += [
            (f"━ {tv.label}", Style(color=tv.color, bold=True)) for tv in f.traces if not tv.parent
        ]
        items.append((f"EMA {f.smoothing:g}", Style(color=AXIS)))
    elif f.traces:
        items += [
            ("┃ loss", Style(color=RAW)),
            (f"━ EMA {f.smoothing:g}", Style(color=EMA, bold=True)),
        ]
        if f.show_eval and any(tv.window and tv.window.evals.get("step") for tv in f.traces):
            items.append(("◆ eval", Style(color=EVAL, bold=True)))
    # the parent's id is in the cursor's readout; the legend has no room for it
    items += [("━ before the resume", Style(color=AXIS)) for tv in f.traces if tv.parent]
    items += legend or []
    used = sum(len(x.text) for x in segs)
    for text, st in items:
        if used + 2 + len(text) > width:
            break  # a legend item is shown whole or not at all
        segs += [Segment("  "), Segment(text, st)]
        used += 2 + len(text)
    return _pad(segs, width)


def _readout(f: Frame, emas: list, x: int, width: int) -> list[Segment]:
    """The cursor's line: the step, then each trace's loss, smoothed loss and eval loss there
    (one run: its lr and grad norm too), as much as fits, most useful first."""
    step = f.cursor
    one = sum(not tv.parent for tv in f.traces) == 1
    where = f"step {step:,}" if f.x_unit == "steps" else f"{fmt_step(step)} tokens"
    items: list[tuple[str, Style]] = []
    pairs = list(zip(f.traces, emas))
    if one:  # the run, or where the cursor is before the resume, the run it resumed
        pairs = [
            p
            for p in pairs
            if p[0].window is not None
            and ((a := _at(p[0].window.steps, "loss", step)) and a[1] <= step <= a[2])
        ][:1] or [p for p in pairs if not p[0].parent]
    for tv, ema in pairs:
        w = tv.window
        if w is None:
            continue

        if not one:
            items.append((tv.label, Style(color=tv.color, bold=True)))
        got = _at(w.steps, "loss", step)
        if got is not None:
            v, a, b = got
            if one and a != b:
                where = f"steps {a:,}–{b:,}"  # a bucket of the window, not one step
            elif one:
                where = f"step {a:,}"
            items.append((f"loss {fmt_value(v)}", Style(color=RAW if one else tv.color)))
        s = _nearest(ema, x) if ema is not None else None
        if s is not None:
            items.append(
                (f"EMA({f.smoothing:g}) {fmt_value(s)}", Style(color=EMA if one else tv.color))
            )
        ev = _at(w.evals, "eval_loss", step)
        if ev is not None and abs(ev[1] - step) <= max(1, (f.end - f.start) // 20):
            items.append((f"eval {fmt_value(ev[0])} @{ev[1]:,}", Style(color=EVAL)))
        if one:
            for metric, name, color in (("lr", "lr", LR), ("grad_norm", "grad", GRAD)):
                m = _at(w.steps, metric, step)
                if m is not None:
                    items.append((f"{name} {fmt_value(m[0])}", Style(color=color)))
    if any(tv.parent for tv, _ in pairs):  # the cursor is before the resume
        items.append((f"in {pairs[0][0].label}, the run this one resumed", Style(color=AXIS)))
    segs = [Segment("▏", Style(color=CURSOR, bold=True)), Segment(where, Style(bold=True))]
    used = 1 + len(where)
    for text, st in items:
        if used + len(text) + 2 > width:
            break
        segs += [Segment("  "), Segment(text, st)]
        used += 2 + len(text)
    return _pad(segs, width)


def _pad(segs: list[Segment], width: int) -> list[Segment]:
    return list(Segment.adjust_line_length(segs, width))


# -- the widget ---------------------------------------------------------------------------


class LossPlot(Widget, can_focus=True):
    DEFAULT_CSS = """
    LossPlot { height: 1fr; min-height: 6; }
    LossPlot:focus { background-tint: $foreground 4%; }
    """
    BINDINGS = [
        # the footer shows the first four; `?` lists them all
        Binding("plus,equals_sign", "zoom_in", "Zoom", key_display="+"),
        Binding("minus", "zoom_out", "Zoom out", key_display="-", show=False),
        Binding("left", "cursor(-1)", "Cursor", key_display="←/→"),
        Binding("right", "cursor(1)", "Cursor right", key_display="→", show=False),
        Binding("c", "cursor_off", "Cursor off", show=False),
        Binding("full_stop", "smooth(1)", "Smoothing", key_display=". ,"),
        Binding("comma", "smooth(-1)", "Less smoothing", key_display=",", show=False),
        Binding("h", "pan(-1)", "Pan left", show=False),
        Binding("l", "pan(1)", "Pan right", show=False),
        Binding("0,home", "home", "Whole run", key_display="0", show=False),
        Binding("end", "end", "Newest", show=False),
        Binding("y", "log_y", "Log y", show=False),
        Binding("t", "toggle('show_eval')", "Eval", show=False),
        Binding("r", "toggle('show_lr')", "LR"),
        Binding("g", "toggle('show_grad')", "Grad norm", show=False),
    ]

    class DataReady(Message):
        """A fetch finished (posted by the worker to the widget itself)."""

        bubble = False

        def __init__(self, request: tuple, result: Any):
            super().__init__()
            self.request = request
            self.result = result

    def __init__(
        self,
        source: str | Path | RunDir | Fetch | None = None,
        *,
        traces: Sequence[Trace] | None = None,
        rank: int = 0,
        title: str = "loss",
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ):
        super().__init__(name=name, id=id, classes=classes)
        if traces is None:
            if source is None:
                raise ValueError("LossPlot needs a source or traces")
            traces = [Trace(title, source)]
        self.traces = [
            Trace(t.label, t.source, t.color or PALETTE[i % len(PALETTE)])
            for i, t in enumerate(traces)
        ]
        self._fetchers: list[Fetch] = [
            RunSource(t.source, rank) if isinstance(t.source, (str, Path, RunDir)) else t.source
            for t in self.traces
        ]
        self.title = title
        self._rank = rank
        self.view: tuple[int, int] | None = None  # None: the whole run
        self.log_y = False
        self.show_eval = True
        self.show_lr = False
        self.show_grad = False
        self.smoothing = SMOOTHING[2]
        self.cursor: int | None = None  # the step the readout reads
        self.x_unit = "steps"
        self.extent: tuple[int, int] | None = None
        self.windows: list[Window | None] = [None] * len(self.traces)
        self.loaded = False  # a first answer arrived
        self.error: str | None = None
        self._request: tuple | None = None
        self._served: tuple | None = None
        self._shown: tuple | None = None
        self._busy = threading.Lock()
        self._seq = 0
        self._lines: list[Strip] | None = None
        self._lines_size: Size | None = None

    # -- public -----------------------------------------------------------------------
    @property
    def runs(self) -> int:
        """The runs drawn, not counting the run a resumed one continues."""
        return sum(not t.parent for t in self.traces)

    def set_parent(self, label: str, source: str | Path | RunDir | Fetch) -> None:
        """Draw the run this one resumed from behind it, dim, so the curve reads as one run
        (a resumed run's own steps start at its checkpoint)."""
        if any(t.parent for t in self.traces):
            return
        self.traces.insert(0, Trace(label, source, AXIS, parent=True))
        self._fetchers.insert(
            0, RunSource(source, self._rank) if isinstance(source, (str, Path, RunDir)) else source
        )
        self.windows.insert(0, None)
        self.refresh_data()

    def set_fetchers(self, fetchers: list[Fetch], x_unit: str) -> None:
        """Draw the same traces from other fetches on another x axis (compare by tokens):
        the view goes back to the whole run, the cursor off. The old fetches are not closed:
        a worker may be reading through them (ByTokens shares its RunSource)."""
        self._fetchers = list(fetchers)
        self.x_unit = x_unit
        self.view = self.cursor = self.extent = None
        self.windows = [None] * len(self._fetchers)
        self.refresh_data()

    def refresh_data(self) -> None:
        """Re-query the visible window (the whole run, or the newest steps when the view is
        at the run's end) in a thread worker; the answer redraws the plot."""
        self._seq += 1
        # the cursor reads lr and grad norm at its step, drawn or not
        reads = self.cursor is not None and self.runs == 1
        metrics = (
            ("loss",)
            + (("lr",) if self.show_lr or reads else ())
            + (("grad_norm",) if self.show_grad or reads else ())
        )
        # a bucket per dot column (two per cell; the y labels take ~7 cells)
        buckets = max(self.size.width - 7, 8) * 2
        self._request = (self._seq, self.view, self.following, buckets, metrics)
        self._fetch()

    @property
    def up_to_date(self) -> bool:
        """The answer to the newest request is drawn (tests wait for it)."""
        return self._request is not None and self._shown is self._request

    @property
    def following(self) -> bool:
        """The view shows the run's newest step, so new steps move it along."""
        return self.view is None or self.extent is None or self.view[1] >= self.extent[1]

    @property
    def window(self) -> tuple[int, int] | None:
        """The steps drawn now: the view, or the whole run."""
        return self.view if self.view is not None else self.extent

    def frame(self) -> Frame:
        """What the next drawing shows (tests and the benchmark draw it directly)."""
        win = self.window
        views = [
            TraceView(t.label, t.color or PALETTE[0], w, t.parent)
            for t, w in zip(self.traces, self.windows)
        ]
        message = None
        if self.error:
            message = self.error
        elif not self.loaded:
            message = "reading…"
        elif win is None:
            message = "no steps yet"
        start, end = win if win is not None else (0, 0)
        return Frame(
            start,
            end,
            self.extent[1] if self.extent else None,
            views,
            log_y=self.log_y,
            show_eval=self.show_eval,
            show_lr=self.show_lr,
            show_grad=self.show_grad,
            whole=self.view is None,
            following=self.following,
            title=self.title,
            message=message,
            smoothing=self.smoothing,
            cursor=None
            if win is None or self.cursor is None
            else min(max(self.cursor, start), end),
            x_unit=self.x_unit,
        )

    # -- data (thread) ------------------------------------------------------------------
    @work(thread=True, group="lossplot", exit_on_error=False)
    def _fetch(self) -> None:
        # one fetch at a time; the one running serves the newest request when it finishes,
        # so a burst of key presses costs one query per answer, not one per key
        while self._request is not self._served:
            if not self._busy.acquire(blocking=False):
                return
            try:
                while (req := self._request) is not self._served:
                    self._served = req
                    self.post_message(self.DataReady(req, self._query(req)))
            finally:
                self._busy.release()

    def _query(self, req: tuple) -> Any:
        """(extent, the view it moved to or None, a Window per trace) or, when no trace could
        be read, the first error. A trace that fails (a run deleted meanwhile) is left out."""
        _, view, following, buckets, metrics = req
        errors: list[Exception] = []

        def ask(fetch: Fetch, *args) -> Window | None:
            try:
                return fetch(*args)
            except Exception as e:  # shown in the plot, never raised into the UI
                errors.append(e)
                return None

        ranges = [ask(fetch, None, None, 0, ()) for fetch in self._fetchers]
        if errors and len(errors) == len(self._fetchers):
            return errors[0]
        known = [r for w in ranges if w is not None and (r := w.extent()) is not None]
        if not known:
            return (None, None, [None] * len(self._fetchers))
        extent = (min(a for a, _ in known), max(b for _, b in known))
        if view is None:
            start, end = extent
        elif following:  # the same width, ending at the newest step
            span = view[1] - view[0]
            start, end = max(extent[1] - span, extent[0]), extent[1]
        else:
            start, end = view
        windows = [
            ask(fetch, start, end, buckets, metrics) if w is not None else None
            for fetch, w in zip(self._fetchers, ranges)
        ]
        return (extent, (start, end) if view is not None else None, windows)

    # -- view (UI thread) ---------------------------------------------------------------
    def on_loss_plot_data_ready(self, msg: DataReady) -> None:
        if msg.request is not self._request:
            return  # an older window than the one asked for last
        self._shown = msg.request
        if isinstance(msg.result, Exception):
            self.error = f"cannot read the run: {msg.result}"
        else:
            extent, view, windows = msg.result
            self.error = None
            self.extent = extent
            if self.view is not None and view is not None:
                self.view = view  # following moved it; otherwise the same
            self.windows = windows
        self.loaded = True
        self._redraw()

    def _redraw(self) -> None:
        self._lines = None
        self.refresh()

    def on_mount(self) -> None:
        self.refresh_data()

    def on_resize(self, event: events.Resize) -> None:
        self._redraw()
        self.refresh_data()  # buckets for the new width

    def on_unmount(self) -> None:
        for fetch in self._fetchers:
            close = getattr(fetch, "close", None)
            if close is not None:
                close()

    def render_line(self, y: int) -> Strip:
        if self._lines is None or self._lines_size != self.size:
            width, height = self.size
            base = self.rich_style
            self._lines = [
                Strip(segs, width).apply_style(base)
                for segs in render_chart(self.frame(), width, height)
            ]
            self._lines_size = self.size
        if y < len(self._lines):
            return self._lines[y]
        return Strip.blank(self.size.width, self.rich_style)

    def rendered_text(self) -> str:
        """The chart as plain text, one line per row (tests assert on it)."""
        width, height = self.size
        return "\n".join(
            "".join(s.text for s in segs) for segs in render_chart(self.frame(), width, height)
        )

    # -- actions ------------------------------------------------------------------------
    def _set_view(self, start: int, end: int) -> None:
        if self.extent is None:
            return
        first, last = self.extent
        span = end - start
        if span >= last - first:
            self.view = None
        else:
            if start < first:
                start, end = first, first + span
            if end > last:
                start, end = last - span, last
            self.view = (start, end)
        self._redraw()
        self.refresh_data()

    def _zoom(self, factor: float) -> None:
        win = self.window
        if win is None:
            return
        start, end = win
        count = end - start + 1
        new = max(MIN_SPAN, int(round(count * factor)))
        if new == count or (self.view is None and factor > 1):
            return
        if self.following:
            self._set_view(end - new + 1, end)
        else:
            s = int(round((start + end) / 2 - new / 2))
            self._set_view(s, s + new - 1)

    def action_zoom_in(self) -> None:
        self._zoom(0.5)

    def action_zoom_out(self) -> None:
        self._zoom(2.0)

    def action_pan(self, direction: int) -> None:
        win = self.window
        if win is None or self.view is None:
            return  # the whole run: nowhere to pan
        start, end = win
        shift = max(1, (end - start + 1) // 4) * direction
        self._set_view(start + shift, end + shift)

    def action_home(self) -> None:
        if self.view is not None:
            self.view = None
            self._redraw()
            self.refresh_data()

    def action_end(self) -> None:
        if self.view is not None and self.extent is not None:
            span = self.view[1] - self.view[0]
            self._set_view(self.extent[1] - span, self.extent[1])

    def action_log_y(self) -> None:
        self.log_y = not self.log_y
        self._redraw()

    def action_toggle(self, attr: str) -> None:
        setattr(self, attr, not getattr(self, attr))
        self._redraw()
        if attr in ("show_lr", "show_grad"):
            self.refresh_data()

    def action_cursor(self, direction: int) -> None:
        """Move the cursor a character cell (it starts at the window's newest step)."""
        win = self.window
        if win is None:
            return
        start, end = win
        first = self.cursor is None
        if first:
            self.cursor = end
            self.refresh_data()  # lr and grad norm for the readout
        else:
            cell = max(1, round((end - start + 1) / max(self.size.width - 8, 1)))
            self.cursor = min(max(self.cursor + direction * cell, start), end)
        self._redraw()

    def action_cursor_off(self) -> None:
        if self.cursor is not None:
            self.cursor = None
            self._redraw()

    def action_smooth(self, direction: int) -> None:
        i = min(range(len(SMOOTHING)), key=lambda k: abs(SMOOTHING[k] - self.smoothing))
        self.smoothing = SMOOTHING[min(max(i + direction, 0), len(SMOOTHING) - 1)]
        self._redraw()

    def on_click(self, event: events.Click) -> None:
        """A click puts the cursor on the step under the pointer (the plot starts after the
        y labels: the x axis's corner marks where)."""
        win = self.window
        if win is None or not self._lines:
            return
        axis = "".join(s.text for s in self._lines[-2]) if len(self._lines) >= 2 else ""
        left = axis.find("└") + 1
        pw = self.size.width - left
        if left <= 0 or pw <= 0 or event.x < left:
            return
        start, end = win
        first = self.cursor is None
        self.cursor = start + (event.x - left) * (end - start + 1) // pw
        if first:
            self.refresh_data()
        self._redraw()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # lr and grad norm are one run's; an overlay of runs offers neither
        if action == "toggle" and parameters and parameters[0] in ("show_lr", "show_grad"):
            return self.runs == 1
        return True

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self.action_zoom_in()

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self.action_zoom_out()


__all__ = [
    "Fetch",
    "Frame",
    "LossPlot",
    "RunSource",
    "Trace",
    "TraceView",
    "Window",
    "render_chart",
]
