"""`d` in the monitor: every rank's Python stack, to find the rank a stalled run waits for.

The dumps come from py-spy, or from the built-in trainer's faulthandler, which writes them
into the run's stacks/rank<r>.txt (core/supervisor/stacks.py), never into the rank logs: they are
shown here, not in the log pane nor in the diagnosis.
"""

from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class StacksScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,d", "dismiss", "Close")]
    DEFAULT_CSS = "#stacks-summary { margin-bottom: 1; }"

    def __init__(self, dumps: list):
        super().__init__()
        self.dumps = dumps

    def compose(self) -> ComposeResult:
        from tunedeck.core.api import STACK_SUSPECT, STACK_WAITING, stack_suspects, stack_where

        style = {STACK_WAITING: "yellow", STACK_SUSPECT: "bold red"}
        odd = stack_suspects(self.dumps)
        parts = []
        for d in self.dumps:
            label = stack_where(d, odd)
            parts.append(
                f"[b]rank {d.rank}[/b] (pid {d.pid}, {d.method})"
                + (f": [{style[label]}]{label}[/]" if label else "")
                + f"\n{escape(d.text)}"
            )
        waiting = [d.rank for d in self.dumps if stack_where(d, odd) == STACK_WAITING]
        if odd:
            summary = (
                f"[bold red]rank {', '.join(str(d.rank) for d in odd)}[/]: not in a "
                f"collective while rank {', '.join(map(str, waiting))} wait(s) in one: "
                f"the others wait for it"
            )
        elif waiting and len(waiting) == len(self.dumps):
            summary = "[yellow]every rank waits in a collective[/] (a peer on another node?)"
        else:
            summary = f"{len(self.dumps)} rank(s); none is stuck in a collective"
        with VerticalScroll(id="stacks-box"):
            yield Static(summary, id="stacks-summary")
            yield Static("\n\n".join(parts) or "no rank process", id="stacks-text")
            yield Static("[dim]esc to close; the same text: tunedeck stacks RUN[/dim]")
