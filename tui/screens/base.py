"""What every tunedeck screen shares: `--readonly` and the command palette.

A screen lists the actions that change anything (stop, kill, launch, delete, resume...) in
`MUTATING`. Under `--readonly` those actions are disabled *and hidden*: `check_action` returns
False, so they vanish from the footer, the help (`?`), the command palette and the keys alike.
The command palette (ctrl+p) offers the current screen's own bindings as commands
(`TunedeckApp.get_system_commands`), filtered the same way.
"""

from __future__ import annotations

from typing import Iterator

from textual.binding import Binding
from textual.screen import ModalScreen, Screen


class ReadonlyAware:
    """Mixin for screens: `MUTATING` actions are off under the app's readonly flag."""

    MUTATING: frozenset[str] = frozenset()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.MUTATING and getattr(self.app, "readonly", False):
            return False
        return True

    def commands(self) -> Iterator[tuple[str, str, str]]:
        """(title, help, action) of this screen's bindings that are enabled now."""
        seen: set[str] = set()
        for b in getattr(self, "BINDINGS", []):
            if not isinstance(b, Binding) or not b.description or b.action in seen:
                continue
            seen.add(b.action)
            if self.check_action(b.action, ()) is False:
                continue
            keys = b.key_display or b.key
            yield b.description, f"{keys}: {getattr(self, 'HELP', '')[:60]}".rstrip(": "), \
                b.action


class TunedeckScreen(ReadonlyAware, Screen):
    """A full screen of the app."""


class TunedeckModal(ReadonlyAware, ModalScreen):
    """A dialog of the app."""
