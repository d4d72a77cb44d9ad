"""The preflight checklist, live: a thread worker runs the checks and posts each result as it
comes; the table fills in row by row. `r` runs them again, `Esc` goes back."""

from __future__ import annotations

from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tunedeck.tui.widgets.titlebar import TitleBar

STATUS_STYLE = {"pass": "green", "warn": "bold yellow", "fail": "bold red", "skip": "dim"}


class CheckDone(Message):
    def __init__(self, generation: int, result) -> None:
        super().__init__()
        self.generation = generation
        self.result = result


class ChecksFinished(Message):
    def __init__(self, generation: int, error: str = "") -> None:
        super().__init__()
        self.generation = generation
        self.error = error


class PreflightScreen(Screen):
    HELP = ("Every check that would make the run fail in its first minutes. Move to a row to "
            "see its detail and the fix. Nothing here starts a run.")
    BINDINGS = [
        Binding("r", "rerun", "Re-run"),
        Binding("escape", "back", "Back"),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
    ]

    def __init__(self, spec_path: str | Path, overrides: list[str] | None = None) -> None:
        super().__init__()
        self.spec_path = Path(spec_path)
        self.overrides = list(overrides or [])
        self.results: dict[str, object] = {}
        self.generation = 0

    def compose(self) -> ComposeResult:
        yield TitleBar("preflight")
        yield Static(f"Preflight: {self.spec_path}", id="preflight-title")
        yield DataTable(id="checks", cursor_type="row", zebra_stripes=True)
        yield Static("", id="check-detail")
        yield Footer()

    def on_mount(self) -> None:
        t = self.query_one("#checks", DataTable)
        t.add_column("status", key="status", width=6)
        t.add_column("check", key="title")
        t.add_column("detail", key="detail")
        self.action_rerun()

    def action_rerun(self) -> None:
        self.generation += 1
        self.results.clear()
        self.query_one("#checks", DataTable).clear()
        self.query_one("#check-detail", Static).update("[dim]running checks…[/dim]")
        self._run(self.generation)

    @work(thread=True, exclusive=True, group="preflight", exit_on_error=False)
    def _run(self, generation: int) -> None:
        from tunedeck.core.preflight import make_context, run_checks
        from tunedeck.core.spec import SpecError

        try:
            ctx = make_context(self.spec_path, self.overrides)
            for r in run_checks(ctx):
                self.post_message(CheckDone(generation, r))
        except SpecError as e:
            self.post_message(ChecksFinished(generation, str(e)))
            return
        self.post_message(ChecksFinished(generation))

    @on(CheckDone)
    def _add(self, msg: CheckDone) -> None:
        if msg.generation != self.generation:
            return  # a result from a run that `r` replaced
        r = msg.result
        self.results[r.id] = r
        first = r.detail.splitlines()[0] if r.detail else ""
        t = self.query_one("#checks", DataTable)
        t.add_row(f"[{STATUS_STYLE[r.status]}]{r.status}[/]", r.title, first[:100], key=r.id)
        if len(self.results) == 1:
            self._show(r.id)

    @on(ChecksFinished)
    def _done(self, msg: ChecksFinished) -> None:
        if msg.generation != self.generation:
            return
        if msg.error:
            self.query_one("#check-detail", Static).update(f"[bold red]{msg.error}[/]")
            return
        from tunedeck.core.preflight.runner import summary, summary_line

        self.sub_title = summary_line(summary(list(self.results.values())))
        # the title bar shows no sub_title (tui/widgets/titlebar.py): the summary goes here
        self.query_one("#preflight-title", Static).update(
            f"Preflight: {self.spec_path}  ·  {self.sub_title}")

    @on(DataTable.RowHighlighted)
    def _highlight(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value:
            self._show(event.row_key.value)

    def _show(self, cid: str) -> None:
        r = self.results.get(cid)
        if r is None:
            return
        fix = f"\n[b]fix:[/b] {r.fix}" if r.fix else ""
        self.query_one("#check-detail", Static).update(
            f"[b]{r.title}[/b] ({r.id}) [{STATUS_STYLE[r.status]}]{r.status}[/]\n{r.detail}{fix}")

    def action_cursor_down(self) -> None:
        self.query_one("#checks", DataTable).action_cursor_down()

    def action_cursor_up(self) -> None:
        self.query_one("#checks", DataTable).action_cursor_up()

    def action_back(self) -> None:
        self.app.pop_screen()
