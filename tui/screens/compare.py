"""Compare: the loss (and eval loss) of two or more runs on one axis.

`CompareScreen(run_ids)`: one LossPlot with a trace per run (each its own colour, its own
read-only Store, opened in the plot's worker), the same zoom and pan keys as the monitor's
chart, each run's smoothed line only (the raw bands of several runs are clutter; smoothing 0
shows them), aligned by step or, with `a`, by tokens seen (`ByTokens`: runs of other batch
sizes or rank counts line up by data), and a legend line per run (colour, name, id, status, progress, last loss, best eval
loss) read from the registry in a thread worker. Live runs are followed: the plot and the
legend refresh every `app.refresh_s`.
"""

from __future__ import annotations

import threading

from rich.markup import escape
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

from tunedeck.tui.widgets.fit import FitStatic
from tunedeck.tui.widgets.footer import Footer
from tunedeck.tui.screens.base import TunedeckScreen
from tunedeck.tui.widgets.lossplot import PALETTE, ByTokens, LossPlot, RunSource, Trace
from tunedeck.tui.widgets.titlebar import TitleBar


class LegendReady(Message):
    def __init__(self, lines: list[str]):
        super().__init__()
        self.lines = lines


class CompareScreen(TunedeckScreen):
    HELP = (
        "The loss of several runs on one axis: the dim band is each run's raw loss "
        "(min..max per column, so a spike shows at any zoom), the bright line its "
        "smoothed loss (an EMA whose weight per step , and . change), ◆ its eval loss. "
        "Zoom and pan move every run together; `0` shows the longest run whole; ← → put a "
        "cursor that reads each run's loss at one step; `a` aligns the runs by tokens seen "
        "instead of steps (and back)."
    )
    DEFAULT_CSS = """
    CompareScreen #compare-plot { height: 1fr; }
    CompareScreen #compare-legend { height: auto; max-height: 9; padding: 0 1;
                                    border-top: solid $panel; text-wrap: nowrap;
                                    text-overflow: ellipsis; }
    """
    # the plot's keys, listed here too so `?` shows them (the plot handles them first)
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("a", "align", "Align by tokens/steps"),
        Binding("plus,equals_sign", "chart('zoom_in')", "Zoom in", key_display="+", show=False),
        Binding("minus", "chart('zoom_out')", "Zoom out", key_display="-", show=False),
        Binding("left", "chart('cursor', -1)", "Cursor", key_display="←/→", show=False),
        Binding("right", "chart('cursor', 1)", "Cursor right", key_display="→", show=False),
        Binding("c", "chart('cursor_off')", "Cursor off", show=False),
        Binding("full_stop", "chart('smooth', 1)", "More smoothing", key_display=".", show=False),
        Binding("comma", "chart('smooth', -1)", "Less smoothing", key_display=",", show=False),
        Binding("h", "chart('pan', -1)", "Pan left", show=False),
        Binding("l", "chart('pan', 1)", "Pan right", show=False),
        Binding("0,home", "chart('home')", "Whole run", key_display="0", show=False),
        Binding("end", "chart('end')", "Newest steps", show=False),
        Binding("y", "chart('log_y')", "Log y", show=False),
        Binding("t,e", "chart('toggle', 'show_eval')", "Eval loss", key_display="t", show=False),
    ]

    def __init__(self, run_ids: list[str]):
        super().__init__()
        self.run_ids = list(dict.fromkeys(run_ids))  # a run marked twice is one curve
        self.run_colors = [PALETTE[i % len(PALETTE)] for i in range(len(self.run_ids))]
        self._sources = [RunSource.for_run_id(r) for r in self.run_ids]
        self._by_tokens = [ByTokens(s) for s in self._sources]
        self._legend_busy = threading.Lock()
        self._stores: dict[str, object] = {}
        self._closed = False

    def compose(self) -> ComposeResult:
        yield TitleBar("compare")
        yield LossPlot(
            traces=[
                Trace(r, s, c) for r, s, c in zip(self.run_ids, self._sources, self.run_colors)
            ],
            id="compare-plot",
        )
        yield FitStatic("reading…", id="compare-legend")
        yield Footer()

    @property
    def plot(self) -> LossPlot:
        return self.query_one("#compare-plot", LossPlot)

    def on_mount(self) -> None:
        self.plot.focus()
        self.load_legend()
        self.set_interval(getattr(self.app, "refresh_s", 1.0), self._tick)

    def _tick(self) -> None:
        self.plot.refresh_data()
        self.load_legend()

    def on_unmount(self) -> None:
        # wait for a legend read in flight: its SQLite connection must not close under it
        # (seen: a segfault in eval_series as the screen went away)
        with self._legend_busy:
            self._closed = True
            for store in self._stores.values():
                store.close()
            self._stores.clear()

    # -- legend (thread) ----------------------------------------------------------------
    @work(thread=True, group="compare-legend", exit_on_error=False)
    def load_legend(self) -> None:
        if not self._legend_busy.acquire(blocking=False):
            return  # the previous read is still going (slow filesystem): skip this tick
        try:
            if self._closed:
                return
            self.post_message(
                LegendReady(
                    [self._legend_line(r, c) for r, c in zip(self.run_ids, self.run_colors)]
                )
            )
        finally:
            self._legend_busy.release()

    def _legend_line(self, run_id: str, color: str) -> str:
        from tunedeck.core.api import RunNotFound, Store, find_run

        swatch = f"[{color}]━━[/]"
        try:
            run = find_run(run_id)
        except RunNotFound:
            return f"{swatch} {escape(run_id)}  [red]not found[/]"
        store = self._stores.get(run.run_id)
        if store is None:
            store = self._stores[run.run_id] = Store(run.run_dir)
        evals = store.eval_series(0, buckets=1)
        best = evals["eval_loss_min"][0] if evals["eval_loss_min"] else None
        # the run id last: a narrow terminal cuts the line there, not the numbers
        parts = [
            f"{swatch} [b]{escape(run.name or run.run_id)}[/b]",
            run.status,
            f"step {run.step:,}" + (f"/{run.max_steps:,}" if run.max_steps else ""),
        ]
        if isinstance(run.loss, (int, float)):
            parts.append(f"loss {run.loss:.4f}")
        if best is not None:
            parts.append(f"best eval {best:.4f}")
        parts.append(f"[dim]{escape(run.run_id)}[/dim]")
        return "  ".join(parts)

    @on(LegendReady)
    def show_legend(self, msg: LegendReady) -> None:
        self.query_one("#compare-legend", Static).update("\n".join(msg.lines))

    # -- actions ------------------------------------------------------------------------
    def action_back(self) -> None:
        self.app.pop_screen()

    def action_align(self) -> None:
        if self.plot.x_unit == "steps":
            self.plot.set_fetchers(self._by_tokens, "tokens")
        else:
            self.plot.set_fetchers(self._sources, "steps")
        self.notify(f"aligned by {self.plot.x_unit}", timeout=3)

    def action_chart(self, name: str, *args) -> None:
        getattr(self.plot, f"action_{name}")(*args)
