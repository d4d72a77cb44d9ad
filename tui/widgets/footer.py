"""Textual's Footer, rebuilt only when the keys it shows change.

Textual's Footer recomposes on every bindings change, which is every focus move, and the
remount lays out the whole screen, though moving between fields leaves the shown keys as they
were: on the compose form (~700 widgets, 2 cores) a Tab's own work was 116 ms with it and is
53 ms with this one (bench/tui_focus.py)."""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer as TextualFooter


class Footer(TextualFooter):
    _shown: tuple | None = None

    def bindings_changed(self, screen: Screen) -> None:
        shown = tuple(
            (binding.key, binding.action, binding.description, enabled, tooltip)
            for _node, binding, enabled, tooltip in screen.active_bindings.values()
            if binding.show
        )
        if shown == self._shown:
            return
        if screen.app.app_focus and self.is_attached and screen is self.screen:
            self._shown = shown  # what the recompose Textual schedules below will show
        super().bindings_changed(screen)
