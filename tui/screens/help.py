"""`?`: the keys of the screen underneath, from its bindings, so the help never goes stale:
the focused pane's keys first (the chart's zoom and cursor, the log's search), then the
screen's.

A key the screen hides (its `check_action` says False: a stop under --readonly) is not listed,
exactly as the footer and the command palette leave it out.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from tunedeck.tui.screens.base import ReadonlyAware


def _rows(source, seen: set[str]) -> list[tuple[str, str]]:
    rows = []
    for b in getattr(source, "BINDINGS", []):
        if not isinstance(b, Binding) or not b.description:
            continue
        check = getattr(source, "check_action", None)
        if check is not None and check(b.action, ()) is False:
            continue
        keys = b.key_display or b.key
        if keys in seen:
            continue
        seen.add(keys)
        rows.append((keys, b.description))
    return rows


def help_sections(under: Screen, app) -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, rows) of the focused widget and the panes holding it (their keys win while
    it has focus, so they come first), then the screen's and the app's keys."""
    seen: set[str] = set()
    out = []
    w = under.focused
    while w is not None and w is not under:
        rows = _rows(w, seen)
        if rows:
            # named as the user sees it: the title of the pane it sits in
            name = next(
                (
                    str(a.border_title)
                    for a in (w, *w.ancestors)
                    if getattr(a, "border_title", None)
                ),
                w.id or type(w).__name__,
            )
            out.append((f"{name} (focused)", rows))
        w = w.parent
    rows = _rows(under, seen) + _rows(app, seen)
    if rows:
        out.append(("this screen", rows))
    return out


def help_rows(under: Screen, app) -> list[tuple[str, str]]:
    """(keys, description) of every binding allowed now, the focused widget's first."""
    return [row for _, rows in help_sections(under, app) for row in rows]


class HelpScreen(ReadonlyAware, ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def __init__(self, under: Screen):
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        # built as Text, not markup: keys such as `[` are text
        text = Text()
        for title, rows in help_sections(self.under, self.app):
            text.append(title + "\n", style="bold")
            for keys, desc in rows:
                text.append(f"  {keys:<12}", style="bold")
                text.append(f" {desc}\n")
            text.append("\n")
        doc = getattr(self.under, "HELP", "") or ""
        if getattr(self.app, "readonly", False):
            doc = (doc + "\n\nRead-only session: keys that change anything are hidden.").strip()
        text.append(doc)
        text.rstrip()
        with VerticalScroll(id="help-box"):  # at 80x24 the keys can outgrow the screen
            yield Static(text, id="help-text")
            yield Static("[dim]esc or ? to close[/dim]")
