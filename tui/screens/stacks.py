"""`d` in the monitor: every rank's Python stack, to find the rank a stalled run waits for."""

from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class StacksScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,d", "dismiss", "Close")]

    def __init__(self, dumps: list):
        super().__init__()
        self.dumps = dumps

    def compose(self) -> ComposeResult:
        from tunedeck.core.runs.stacks import SUSPECT, WAITING, suspects, where

        style = {WAITING: "yellow", SUSPECT: "bold red"}
        odd = suspects(self.dumps)
        parts = []
        for d in self.dumps:
            label = where(d, odd)
            parts.append(f"[b]rank {d.rank}[/b] (pid {d.pid}, {d.method})"
                         + (f": [{style[label]}]{label}[/]" if label else "")
                         + f"\n{escape(d.text)}")
        with VerticalScroll(id="stacks-box"):
            yield Static("\n\n".join(parts) or "no rank process", id="stacks-text")
            yield Static("[dim]esc to close; the same text: tunedeck stacks RUN[/dim]")
