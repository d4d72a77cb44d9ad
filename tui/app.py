"""The tunedeck TUI: a viewer of run directories. It never owns a run.

All file and process I/O happens in thread workers that post messages; handlers on the UI thread
only update widgets.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from tunedeck.tui.screens.base import bound_commands
from tunedeck.tui.screens.help import HelpScreen
from tunedeck.tui.screens.runs import RunsScreen
from tunedeck.tui.terminal_alerts import TerminalAlerts


def screen_commands(screen: Screen) -> Iterator[tuple[str, str, str]]:
    """The current screen's commands for ctrl+p (tunedeck.tui.screens.base.bound_commands)."""
    return bound_commands(screen)


class TunedeckApp(App):
    TITLE = "tunedeck"
    CSS_PATH = "app.tcss"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Keys", key_display="?"),
        Binding("w", "sweep", "Sweep", show=False),  # in ? and ctrl+p; footers stay as they are
    ]

    def __init__(
        self,
        open_run: str | None = None,
        readonly: bool = False,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ):
        super().__init__()
        self.open_run = open_run
        self.readonly = readonly
        self.refresh_s = refresh_s
        self.clock = clock  # "now" for ages on screen; tests pin it for stable snapshots

    def on_mount(self) -> None:
        self.terminal_alerts = TerminalAlerts(self)  # the bell and OSC 9/777 for alerts
        self.push_screen(RunsScreen())
        if self.open_run:
            from tunedeck.tui.screens.monitor import MonitorScreen

            self.push_screen(MonitorScreen(self.open_run))

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    def action_sweep(self) -> None:
        """The sweep of the run under the cursor (runs list) or shown (monitor); else the
        newest sweep."""
        from tunedeck.tui.screens.sweep import SweepScreen

        pick = getattr(self.screen, "selected_run_id", None)
        run = pick() if pick else getattr(self.screen, "run_ref", None)
        if not isinstance(self.screen, SweepScreen):
            self.push_screen(SweepScreen(run_id=run))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """ctrl+p: the current screen's own commands first (only those allowed now: none that
        change anything under --readonly), then Textual's."""
        for title, help_, action in screen_commands(screen):
            yield SystemCommand(title, help_, lambda a=action: screen.run_action(a))
        yield SystemCommand("Sweep", "a sweep's points and results (key w)", self.action_sweep)
        yield from super().get_system_commands(screen)
