"""Auto-height panes follow their content even when another widget's layout runs between two
of their updates (tui/widgets/fit.py). The order is forced through Textual's own refresh steps:
on a loaded machine it happens by itself, and a pane then kept its first content's height."""

from __future__ import annotations

from textual.app import App
from textual.widgets import Static

from tunedeck.core.views.nccl import RankNccl
from tunedeck.tui.widgets.fit import FitStatic
from tunedeck.tui.widgets.nccl import NcclView, nccl_text


class Pane(App):
    CSS = "#pane { height: auto; } #other { height: auto; }"

    def __init__(self, pane):
        super().__init__()
        self.pane = pane

    def compose(self):
        yield self.pane
        yield Static("another pane", id="other")


async def two_changes_around_another_layout(app, pilot, first, second) -> None:
    """`first`, then another widget's layout before the pane's idle, then `second`."""
    first()
    other = app.query_one("#other", Static)
    other.update("another pane, changed")
    other._check_refresh()  # its idle before the pane's: the shared parent is re-arranged
    app.screen._refresh_layout()  # the layout the pane's first change is measured in
    second()
    for _ in range(5):
        await pilot.pause(0.05)


async def test_a_static_pane_takes_the_height_of_its_last_text():
    pane = FitStatic("one line", id="pane")
    app = Pane(pane)
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.pause()
        await two_changes_around_another_layout(
            app,
            pilot,
            lambda: pane.update("a new line"),
            lambda: pane.update("three\nlines\nnow"),
        )
        assert pane.size.height == 3
        await two_changes_around_another_layout(
            app, pilot, lambda: pane.update("a\nb\nc\nd"), lambda: pane.update("back to one")
        )
        assert pane.size.height == 1


async def test_the_nccl_pane_takes_the_height_of_its_last_summaries():
    pane = NcclView(id="pane")
    app = Pane(pane)
    many = [RankNccl(rank=r, version="2.28.9", network="Socket", nccl_lines=9) for r in range(12)]
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.pause()
        await two_changes_around_another_layout(
            app, pilot, lambda: pane.show([RankNccl(rank=0)]), lambda: pane.show(many)
        )
        want = len(nccl_text(many, pane.size.width).plain.splitlines())
        assert want >= 12 and pane.size.height == want
