"""A sweep's table: one row per point, its settings, status, step, best eval loss, final loss,
tokens/s and run: the rows of `tunedeck sweep show ID --json` (core's `sweep_rows`), read
in a thread worker every `app.refresh_s` while points are still running. Enter opens a
point's monitor, `C` overlays every point's loss in compare.

`SweepScreen(sweep_id)`, or `SweepScreen(run_id=...)`: the sweep of that run, else the
home's newest, found by the worker; with no sweep at all it says so and goes back.
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable, Static

from tunedeck.tui.widgets.fit import FitStatic
from tunedeck.tui.widgets.footer import Footer
from tunedeck.core.api import TERMINAL, newest_sweep, sweep_of, sweep_rows
from tunedeck.tui.format import RUN_STATUS_STYLE, clean, fmt_loss
from tunedeck.tui.screens.base import TunedeckScreen
from tunedeck.tui.widgets.titlebar import TitleBar

TAIL = ["STATUS", "STEP", "BEST EVAL", "FINAL LOSS", "TOK/S", "RUN"]


def cells(row: dict[str, Any], keys: list[str]) -> list[str]:
    """A point's cells as `tunedeck sweep show` prints them."""
    tps = row["tokens_per_s"]
    return [
        str(row["point"]),
        *(str(row["settings"].get(k, "")) for k in keys),
        row["status"],
        str(row["step"]),
        fmt_loss(row["best_eval_loss"]),
        fmt_loss(row["final_loss"]),
        f"{tps:.0f}" if tps is not None else "-",
        row["run_id"],
    ]


class SweepTable(DataTable):
    """The points; Enter (DataTable's select) opens one, and `?` says so."""

    BINDINGS = [Binding("enter", "select_cursor", "Monitor")]


class SweepRead(Message):
    def __init__(self, sweep_id: str | None, rows: list[dict[str, Any]], error: str = ""):
        super().__init__()
        self.sweep_id, self.rows, self.error = sweep_id, rows, error


class SweepScreen(TunedeckScreen):
    HELP = (
        "A sweep's points: the settings each one ran with, its status, the best eval loss, "
        "the final loss and tokens/s; the same rows as `tunedeck sweep show ID --json`. "
        "Enter opens the point's monitor, C puts every point's loss on one chart."
    )
    DEFAULT_CSS = """
    SweepScreen #sweep-table { height: 1fr; }
    SweepScreen #sweep-note { height: auto; padding: 0 1; color: $text-muted; }
    """
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("enter", "open", "Monitor"),
        Binding("C", "compare", "Compare points"),
        Binding("r", "reload", "Refresh", show=False),
    ]

    def __init__(self, sweep_id: str | None = None, run_id: str | None = None):
        super().__init__()
        self.sweep_id, self.run_id = sweep_id, run_id
        self.rows: list[dict[str, Any]] = []
        self._shown: tuple[list[str], list[list[str]]] | None = None

    def compose(self) -> ComposeResult:
        yield TitleBar(f"sweep · {self.sweep_id or '…'}")
        yield SweepTable(id="sweep-table", cursor_type="row", zebra_stripes=True)
        yield FitStatic("reading…", id="sweep-note", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.action_reload()
        self.set_interval(self.app.refresh_s, self._refresh_live)

    def _refresh_live(self) -> None:
        if not self.rows or any(r["status"] not in TERMINAL for r in self.rows):
            self.action_reload()

    def action_reload(self) -> None:
        self.read(self.sweep_id, self.run_id)

    @work(thread=True, exclusive=True, group="sweep-read")
    def read(self, sweep_id: str | None, run_id: str | None) -> None:
        if sweep_id is None:
            sweep_id = (sweep_of(run_id) if run_id else None) or newest_sweep()
        if sweep_id is None:
            self.post_message(SweepRead(None, [], "no sweeps yet: tunedeck sweep SPEC --grid ..."))
            return
        try:
            self.post_message(SweepRead(sweep_id, sweep_rows(sweep_id)))
        except LookupError as e:  # SweepNotFound: its file is gone
            self.post_message(SweepRead(sweep_id, [], str(e)))

    @on(SweepRead)
    def show(self, msg: SweepRead) -> None:
        if msg.sweep_id is None:
            self.app.notify(clean(msg.error), severity="warning")
            if self.is_current:
                self.app.pop_screen()
            return
        if msg.sweep_id != self.sweep_id:
            self.sweep_id = msg.sweep_id
            self.query_one(TitleBar).update(TitleBar._text(f"sweep · {msg.sweep_id}"))
        note = self.query_one("#sweep-note", Static)
        if msg.error:
            note.update(clean(msg.error))
            return
        self.rows = msg.rows
        keys = list(msg.rows[0]["settings"]) if msg.rows else []
        text = [[clean(c) for c in cells(row, keys)] for row in msg.rows]
        if (keys, text) != self._shown:
            self._shown = (keys, text)
            self._fill(keys, text)
        done = sum(r["status"] in TERMINAL for r in msg.rows)
        ended = [r for r in msg.rows if r["status"] != "succeeded" and r["message"]]
        note.update(
            "\n".join(
                [f"{done}/{len(msg.rows)} points ended"]
                + [f"#{r['point']}: {clean(r['message'])}" for r in ended]
            )
        )

    def _fill(self, keys: list[str], text: list[list[str]]) -> None:
        """The table anew, each column as wide as its widest cell: the sweep is small, and a
        DataTable keeps lines drawn before it measured new cells (textual#4470)."""
        table = self.query_one("#sweep-table", SweepTable)
        cursor = table.cursor_row
        table.clear(columns=True)
        heads = ["#", *keys, *TAIL]
        for i, h in enumerate(heads):
            table.add_column(h, key=h, width=max([cell_len(h), *(cell_len(r[i]) for r in text)]))
        at = 1 + len(keys)
        for row, values in zip(self.rows, text):
            styled: list[Any] = list(values)
            styled[at] = Text(values[at], style=RUN_STATUS_STYLE.get(row["status"], ""))
            table.add_row(*styled, key=row["run_id"])
        if text:
            table.move_cursor(row=min(cursor, len(text) - 1), animate=False)

    def selected(self) -> str | None:
        table = self.query_one("#sweep-table", SweepTable)
        if not table.row_count:
            return None
        return str(table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value)

    @on(SweepTable.RowSelected)
    def _row_selected(self) -> None:
        self.action_open()

    def action_open(self) -> None:
        from tunedeck.tui.screens.monitor import MonitorScreen

        run_id = self.selected()
        if run_id:
            self.app.push_screen(MonitorScreen(run_id))

    def action_compare(self) -> None:
        from tunedeck.tui.screens.compare import CompareScreen

        if self.rows:
            self.app.push_screen(CompareScreen([r["run_id"] for r in self.rows]))

    def action_back(self) -> None:
        self.app.pop_screen()
