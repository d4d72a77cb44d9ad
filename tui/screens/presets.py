"""Presets: pick a recipe, see exactly what it will run, check it, launch it."""

from __future__ import annotations

from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tunedeck.core.paths import PRESETS_DIR
from tunedeck.core.spec import SpecError, load_spec
from tunedeck.tui.screens.confirm import ConfirmScreen
from tunedeck.tui.widgets.titlebar import TitleBar


class PresetsLoaded(Message):
    def __init__(self, rows: list[tuple[Path, str, str]]):
        super().__init__()
        self.rows = rows  # (path, name, one-line description or error)


class PreviewReady(Message):
    def __init__(self, path: Path, text: str):
        super().__init__()
        self.path = path
        self.text = text


class Launched(Message):
    def __init__(self, run_id: str | None, error: str = ""):
        super().__init__()
        self.run_id = run_id
        self.error = error


class PresetsScreen(Screen):
    HELP = ("Presets from the presets/ folder. The right pane shows the exact command the "
            "highlighted preset runs on this machine and its effective batch.")
    BINDINGS = [
        Binding("escape", "back", "Runs"),
        Binding("l", "launch", "Launch"),
        Binding("p", "preflight", "Preflight"),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
    ]

    def __init__(self, presets_dir: Path = PRESETS_DIR):
        super().__init__()
        self.presets_dir = presets_dir
        self.paths: list[Path] = []

    def compose(self) -> ComposeResult:
        yield TitleBar("presets")
        with Horizontal():
            table: DataTable = DataTable(id="presets-table", cursor_type="row")
            table.add_columns("PRESET", "WHAT")
            yield table
            with VerticalScroll(id="preview-pane"):
                yield Static("", id="preset-preview", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.load_presets()

    @work(thread=True, exclusive=True, group="presets", exit_on_error=False)
    def load_presets(self) -> None:
        rows = []
        for path in sorted(self.presets_dir.glob("*.toml")):
            try:
                s = load_spec(path)
                what = (f"{s.backend} · {s.method.type} · {s.parallel.strategy} · "
                        f"{s.cluster.nnodes}x{s.cluster.nproc_per_node or 'auto'}")
            except SpecError as e:
                what = f"invalid: {e.problems[0]}"
            rows.append((path, path.stem, what))
        self.post_message(PresetsLoaded(rows))

    @on(PresetsLoaded)
    def show_presets(self, msg: PresetsLoaded) -> None:
        table = self.query_one("#presets-table", DataTable)
        table.clear()
        self.paths = [p for p, _, _ in msg.rows]
        for path, name, what in msg.rows:
            table.add_row(name, what, key=str(path))
        # the first row's RowHighlighted builds its preview

    @on(DataTable.RowHighlighted)
    def highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key and event.row_key.value:
            self.make_preview(Path(event.row_key.value))

    @work(thread=True, exclusive=True, group="preset-preview", exit_on_error=False)
    def make_preview(self, path: Path) -> None:
        from tunedeck.core.backends.preview import preview

        try:
            p = preview(load_spec(path))
            text = f"{p.summary}\n\n{p.script}"
        except SpecError as e:
            text = str(e)
        except Exception as e:  # a preset for another backend may not resolve here
            text = f"cannot preview {path.name}: {e}"
        self.post_message(PreviewReady(path, text))

    @on(PreviewReady)
    def show_preview(self, msg: PreviewReady) -> None:
        if self.selected() == msg.path:
            self.query_one("#preset-preview", Static).update(msg.text)

    def selected(self) -> Path | None:
        table = self.query_one("#presets-table", DataTable)
        if not self.paths or table.cursor_row is None:
            return None
        return self.paths[min(table.cursor_row, len(self.paths) - 1)]

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_cursor_down(self) -> None:
        self.query_one("#presets-table", DataTable).action_cursor_down()

    def action_cursor_up(self) -> None:
        self.query_one("#presets-table", DataTable).action_cursor_up()

    def action_preflight(self) -> None:
        path = self.selected()
        if path is None:
            return
        try:
            from tunedeck.tui.screens.preflight import PreflightScreen
        except ModuleNotFoundError:
            self.notify("preflight is not available in this build", severity="warning")
            return
        self.app.push_screen(PreflightScreen(path))

    def action_launch(self) -> None:
        path = self.selected()
        if path is None:
            return
        if getattr(self.app, "readonly", False):
            self.notify("read-only session: launching is disabled", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.launch(path)

        self.app.push_screen(ConfirmScreen(f"Launch {path.stem}?\nThe run keeps going when "
                                           f"you close tunedeck."), answered)

    @work(thread=True, exclusive=True, group="preset-launch", exit_on_error=False)
    def launch(self, path: Path) -> None:
        from tunedeck.core.runs.launch import launch

        try:
            run_dir = launch(load_spec(path))
        except Exception as e:
            self.post_message(Launched(None, str(e)))
            return
        self.post_message(Launched(run_dir.name))

    @on(Launched)
    def launched(self, msg: Launched) -> None:
        if msg.run_id is None:
            self.notify(f"launch failed: {msg.error}", severity="error", timeout=10)
            return
        from tunedeck.tui.screens.monitor import MonitorScreen

        self.notify(f"launched {msg.run_id}")
        # replace this screen in one step: a pop then a push lets the popped screen's header
        # react to the title change after it is gone
        self.app.switch_screen(MonitorScreen(msg.run_id))
