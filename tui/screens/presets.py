"""The presets as a "start from" list: the compose screen (tui/screens/compose.py) opens it
for a new run, and puts the chosen preset in its form. What a preset will run, its checks and
its launch are the compose screen's (one preview, one gate, for every way a spec arrives)."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from tunedeck.core.api import PRESETS_DIR
from tunedeck.core.spec import RunSpec, SpecError, load_spec
from tunedeck.tui.screens.base import TunedeckModal
from tunedeck.tui.widgets.fit import FitStatic


class PresetsLoaded(Message):
    def __init__(self, rows: list[tuple[Path, RunSpec | None, str, str]]):
        super().__init__()
        self.rows = rows  # (path, spec or None, one-line what, the file's header comment)


def describe(spec: RunSpec) -> str:
    c = spec.cluster
    return (
        f"{spec.backend} · {spec.method.type} · {spec.parallel.strategy} · "
        f"{c.nnodes}x{c.nproc_per_node or 'auto'}"
    )


def header_comment(text: str) -> str:
    """The comment lines a preset starts with: what it is for and what it corrects."""
    out = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        out.append(line.lstrip("#").strip())
    return "\n".join(out)


class PresetPicker(TunedeckModal):
    """Pick a preset to start from; Esc keeps the form as it is."""

    BINDINGS = [
        Binding("escape", "cancel", "Blank spec"),
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
    ]
    DEFAULT_CSS = """
    PresetPicker { align: center middle; }
    PresetPicker > Vertical {
        width: 90%; max-width: 120; height: 90%; padding: 0 1;
        border: thick $accent; background: $surface;
    }
    PresetPicker #picker-hint { height: 1; color: $text-muted; }
    PresetPicker #presets-table { height: 1fr; }
    PresetPicker #preset-about { height: auto; max-height: 8; border-top: solid $panel; }
    """

    def __init__(self, presets_dir: Path = PRESETS_DIR):
        super().__init__()
        self.presets_dir = presets_dir
        self.rows: dict[str, tuple[Path, RunSpec | None, str, str]] = {}

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Start from a preset (enter) · esc: a blank spec", id="picker-hint")
            table: DataTable = DataTable(id="presets-table", cursor_type="row")
            table.add_columns("PRESET", "WHAT")
            yield table
            yield FitStatic("", id="preset-about", markup=False)

    def on_mount(self) -> None:
        self.load_presets()

    @work(thread=True, exclusive=True, group="presets", exit_on_error=False)
    def load_presets(self) -> None:
        rows = []
        for path in sorted(self.presets_dir.glob("*.toml")):
            try:
                spec: RunSpec | None = load_spec(path)
                what = describe(spec)
            except SpecError as e:
                spec, what = None, f"invalid: {e.problems[0]}"
            try:
                about = header_comment(path.read_text(encoding="utf-8"))
            except OSError:
                about = ""
            rows.append((path, spec, what, about))
        self.post_message(PresetsLoaded(rows))

    @on(PresetsLoaded)
    def show_presets(self, msg: PresetsLoaded) -> None:
        table = self.query_one("#presets-table", DataTable)
        table.clear()
        self.rows = {str(r[0]): r for r in msg.rows}
        for path, spec, what, _ in msg.rows:
            table.add_row(path.stem, Text(what, style="" if spec else "red"), key=str(path))
        table.focus()

    @on(DataTable.RowHighlighted)
    def highlighted(self, event: DataTable.RowHighlighted) -> None:
        row = self.rows.get(str(event.row_key.value)) if event.row_key else None
        if row is not None:
            self.query_one("#preset-about", Static).update(row[3] or row[2])

    @on(DataTable.RowSelected)
    def selected(self, event: DataTable.RowSelected) -> None:
        row = self.rows.get(str(event.row_key.value)) if event.row_key else None
        if row is None:
            return
        path, spec, what, _ = row
        if spec is None:
            self.notify(f"{path.name}: {what}", severity="error")
            return
        self.dismiss((path, spec))

    def action_cursor_down(self) -> None:
        self.query_one("#presets-table", DataTable).action_cursor_down()

    def action_cursor_up(self) -> None:
        self.query_one("#presets-table", DataTable).action_cursor_up()

    def action_cancel(self) -> None:
        self.dismiss(None)
