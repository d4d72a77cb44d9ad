"""A one-line title bar.

Textual's Header watches the app title through callbacks that can fire after its screen was
switched away (a NoMatches error seen when a launch replaced the presets screen); a plain Static
has no such callbacks and costs nothing over SSH.
"""

from __future__ import annotations

from textual.widgets import Static

from tunedeck.tui.format import clean


class TitleBar(Static):
    DEFAULT_CSS = """
    TitleBar { height: 1; background: $panel; color: $text; text-style: bold; padding: 0 1; }
    """

    def __init__(self, subtitle: str = ""):
        super().__init__(self._text(subtitle), markup=False)

    @staticmethod
    def _text(subtitle: str) -> str:
        """The bar's text; the subtitle (a run's name, a file's) through `clean`: no control
        or bidi character reaches the terminal."""
        return f"tunedeck · {clean(subtitle)}" if subtitle else "tunedeck"
