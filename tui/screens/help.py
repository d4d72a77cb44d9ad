"""`?`: the keys of the screen underneath, from its bindings, so the help never goes stale."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def __init__(self, under: Screen):
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        rows = []
        seen = set()
        for source in (self.under, self.app):
            for b in getattr(source, "BINDINGS", []):
                if not isinstance(b, Binding) or not b.description:
                    continue
                check = getattr(source, "check_action", None)
                if check is not None and check(b.action, ()) is False:
                    continue   # hidden here (e.g. a stop under --readonly)
                keys = b.key_display or b.key
                if keys in seen:
                    continue
                seen.add(keys)
                rows.append(f"  [b]{keys:<12}[/b] {b.description}")
        text = "\n".join(rows)
        doc = getattr(self.under, "HELP", "") or ""
        with Vertical(id="help-box"):
            yield Static(f"[b]Keys[/b]\n{text}\n\n{doc}".rstrip(), id="help-text")
            yield Static("[dim]esc or ? to close[/dim]")
