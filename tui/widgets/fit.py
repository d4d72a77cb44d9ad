"""Panes of `height: auto` whose height follows every change of their content.

Textual 8.2 caches a widget's box model under a counter that a layout request advances only
when no earlier request of the widget is pending. If another widget's layout runs between two
updates of this one (both before this widget's idle), the box model of the first content is
cached under the counter the second content keeps, and the pane stays at the first content's
height until its next change: a detail cut to one line, a note left too tall. A second request
once the pending refresh is done advances the counter, so the next layout measures again
(tests/test_tui_fit.py forces that order)."""

from __future__ import annotations

from textual.widget import Widget
from textual.widgets import Static


def relayout(widget: Widget) -> None:
    """Lay `widget` out now and, with a fresh box model, once more after the coming refresh."""
    widget.refresh(layout=True)
    widget.call_after_refresh(widget.refresh, layout=True)


class FitStatic(Static):
    """A Static whose height follows each update (see the module's note)."""

    def update(self, content="", *, layout: bool = True) -> None:
        super().update(content, layout=False)
        if layout:
            relayout(self)
