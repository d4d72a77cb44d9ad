"""What every tunedeck screen shares: `--readonly` and the command palette.

A screen lists the actions that change anything (stop, kill, launch, delete, resume...) in
`MUTATING`. Under `--readonly` those actions are disabled *and hidden*: `check_action` returns
False, so they vanish from the footer, the help (`?`), the command palette and the keys alike.
The command palette (ctrl+p) offers the current screen's own bindings as commands
(`TunedeckApp.get_system_commands`), filtered the same way.
"""

from __future__ import annotations

from collections.abc import Iterator

from textual.actions import parse
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
        return bound_commands(self)


def bound_commands(screen) -> Iterator[tuple[str, str, str]]:
    """(title, help, action) for each described binding of `screen` that its `check_action`
    allows now, so the palette hides what the footer hides (a stop under --readonly)."""
    seen: set[str] = set()
    for b in getattr(screen, "BINDINGS", []):
        if not isinstance(b, Binding) or not b.description or b.action in seen:
            continue
        seen.add(b.action)
        _, name, params = parse(b.action)
        if screen.check_action(name, params) is False:
            continue
        yield b.description, f"key {b.key_display or b.key}", b.action


class TunedeckScreen(ReadonlyAware, Screen):
    """A full screen of the app."""


class TunedeckModal(ReadonlyAware, ModalScreen):
    """A dialog of the app."""
