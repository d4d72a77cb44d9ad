"""The runs list: every run in the registry, refreshed from disk once a second."""

from __future__ import annotations

import threading
import time

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tunedeck.core.runs.registry import RunInfo, list_runs
from tunedeck.tui.format import fmt_age, fmt_loss
from tunedeck.tui.widgets.titlebar import TitleBar

STATUS_STYLE = {"running": "bold green", "pending": "yellow", "succeeded": "cyan",
                "failed": "bold red", "stopped": "magenta"}


class RunsLoaded(Message):
    def __init__(self, runs: list[RunInfo]):
        super().__init__()
        self.runs = runs


class RunsScreen(Screen):
    HELP = ("The runs under the registry root ($TUNEDECK_HOME/runs). Runs keep going when "
            "the TUI closes; open one to watch it live.")
    BINDINGS = [
        Binding("enter", "open", "Monitor"),
        Binding("n", "new_run", "New run"),
        Binding("r", "reload", "Refresh"),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g", "top", "Top", show=False),
        Binding("G", "bottom", "Bottom", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._loading = threading.Lock()

    def compose(self) -> ComposeResult:
        yield TitleBar("runs")
        table: DataTable = DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        table.add_columns("RUN", "NAME", "STATUS", "STEP", "LOSS", "AGE")
        yield table
        yield Static("No runs yet. Press n to pick a preset, or run "
                     "`tunedeck launch presets/demo.toml`.", id="runs-empty")
        yield Footer()

    def on_mount(self) -> None:
        self.load_runs()
        self.set_interval(self.app.refresh_s, self.load_runs)

    @work(thread=True, exclusive=True, group="runs-list", exit_on_error=False)
    def load_runs(self) -> None:
        if not self._loading.acquire(blocking=False):   # a slow listing is still running
            return
        try:
            self.post_message(RunsLoaded(list_runs()))
        finally:
            self._loading.release()

    @on(RunsLoaded)
    def show_runs(self, msg: RunsLoaded) -> None:
        table = self.query_one("#runs-table", DataTable)
        self.query_one("#runs-empty").display = not msg.runs
        table.display = bool(msg.runs)
        now = time.time()
        keep = table.cursor_row
        selected = self.selected_run_id()
        table.clear()
        for r in msg.runs:
            style = STATUS_STYLE.get(r.status, "")
            table.add_row(r.run_id, r.name, f"[{style}]{r.status}[/]" if style else r.status,
                          f"{r.step}/{r.max_steps}", fmt_loss(r.loss), fmt_age(r.age_s(now)),
                          key=r.run_id)
        ids = [r.run_id for r in msg.runs]
        if selected in ids:
            table.move_cursor(row=ids.index(selected))
        elif msg.runs:
            table.move_cursor(row=min(keep, len(msg.runs) - 1))

    def selected_run_id(self) -> str | None:
        """The run under the cursor, read from the table itself (what the user sees)."""
        table = self.query_one("#runs-table", DataTable)
        if table.row_count == 0:
            return None
        return str(table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value)

    def action_open(self) -> None:
        run_id = self.selected_run_id()
        if run_id:
            from tunedeck.tui.screens.monitor import MonitorScreen

            self.app.push_screen(MonitorScreen(run_id))

    @on(DataTable.RowSelected)
    def row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_new_run(self) -> None:
        from tunedeck.tui.screens.presets import PresetsScreen

        self.app.push_screen(PresetsScreen())

    def action_reload(self) -> None:
        self.load_runs()

    def action_cursor_down(self) -> None:
        self.query_one("#runs-table", DataTable).action_cursor_down()

    def action_cursor_up(self) -> None:
        self.query_one("#runs-table", DataTable).action_cursor_up()

    def action_top(self) -> None:
        self.query_one("#runs-table", DataTable).move_cursor(row=0)

    def action_bottom(self) -> None:
        t = self.query_one("#runs-table", DataTable)
        t.move_cursor(row=max(t.row_count - 1, 0))
