"""`?`: the keys of the screen underneath, from its bindings, so the help never goes stale.

A key the screen hides (its `check_action` says False: a stop under --readonly) is not listed,
exactly as the footer and the command palette leave it out.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from tunedeck.tui.screens.base import ReadonlyAware


def help_rows(under: Screen, app) -> list[tuple[str, str]]:
    """(keys, description) of every binding of `under` and the app that is allowed now."""
    rows = []
    seen = set()
    for source in (under, app):
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


class HelpScreen(ReadonlyAware, ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def __init__(self, under: Screen):
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        text = "\n".join(
            f"  [b]{keys:<12}[/b] {desc}" for keys, desc in help_rows(self.under, self.app)
        )
        doc = getattr(self.under, "HELP", "") or ""
        if getattr(self.app, "readonly", False):
            doc = (doc + "\n\nRead-only session: keys that change anything are hidden.").strip()
        with Vertical(id="help-box"):
            yield Static(f"[b]Keys[/b]\n{text}\n\n{doc}".rstrip(), id="help-text")
            yield Static("[dim]esc or ? to close[/dim]")
