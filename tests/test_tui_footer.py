"""The footer is rebuilt only when the keys it shows change: Textual's rebuilds it on every
focus move, and the remount lays out the whole screen (most of a second a Tab on the compose
form, 2 cores)."""

from __future__ import annotations

from textual.app import App
from textual.binding import Binding
from textual.widgets import Input

from tunedeck.tui.widgets.footer import Footer


class _Keyed(Input):
    BINDINGS = [Binding("ctrl+y", "yank", "Yank")]  # shown in the footer while focused

    def action_yank(self) -> None:
        pass


class _Form(App):
    BINDINGS = [Binding("ctrl+q", "quit", "Quit")]

    def compose(self):
        yield Input(id="a")
        yield Input(id="b")
        yield _Keyed(id="c")
        yield Footer()


def _keys(footer: Footer) -> list[str]:
    return [k.description for k in footer.query("FooterKey")]


async def test_the_footer_rebuilds_only_when_its_keys_change():
    app = _Form()
    async with app.run_test() as pilot:
        footer = app.query_one(Footer)
        rebuilt = []
        recompose = footer.recompose

        async def counted():
            rebuilt.append(app.focused.id if app.focused else None)
            await recompose()

        footer.recompose = counted
        for wid in ("a", "b", "a", "b"):  # the same keys shown: nothing to rebuild
            app.query_one(f"#{wid}").focus()
            await pilot.pause()
        assert rebuilt == [] and "Quit" in _keys(footer) and "Yank" not in _keys(footer)
        app.query_one("#c").focus()  # a key of its own: shown
        await pilot.pause()
        assert rebuilt == ["c"] and "Yank" in _keys(footer)
        app.query_one("#a").focus()  # and gone again
        await pilot.pause()
        assert rebuilt == ["c", "a"] and "Yank" not in _keys(footer)
