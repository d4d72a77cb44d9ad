"""--readonly means it: on every screen class in tunedeck.tui.screens, a binding whose action is
in the class's MUTATING set is not visible in the footer, the help (?) or the ctrl+p palette,
and its key does nothing. Screens are found by walking the package, so a screen added later is
checked too; a module that does not import yet is skipped with the reason."""

from __future__ import annotations

import importlib
import json
import inspect
import pkgutil
from pathlib import Path

import pytest
from rich.text import Text
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

import tunedeck.tui.screens as screens_pkg
from tests.test_manage import T0, make_run
from tests.conftest import until as _until
from tunedeck.core.api import ModelSource
from tunedeck.core.spec import load_spec
from tunedeck.tui.app import TunedeckApp
from tunedeck.tui.screens.base import ReadonlyAware
from tunedeck.tui.screens.confirm import ConfirmScreen
from tunedeck.tui.screens.help import HelpScreen, help_rows
from tunedeck.tui.screens.runs import RunsScreen

RUN_A, RUN_B = "20251124-090000-demo-a1b2", "20251125-080000-demo-c3d4"

# Actions that change something a shared session must not touch. A screen binding one of these
# must list it in MUTATING (a screen that is not ReadonlyAware cannot hide it at all).
CHANGES_THINGS = {
    "stop",
    "kill",
    "launch",
    "delete",
    "resume",
    "override",
    "save",
    "new_run",
    "clone",
    "import_command",
    "open_spec",
}


def _screen_classes() -> list:
    params = []
    for info in sorted(pkgutil.iter_modules(screens_pkg.__path__), key=lambda i: i.name):
        if info.name == "base":  # the bases, not screens
            continue
        name = f"{screens_pkg.__name__}.{info.name}"
        try:
            mod = importlib.import_module(name)
        except ImportError as e:  # a screen another engineer has not landed yet
            params.append(
                pytest.param(None, id=info.name, marks=pytest.mark.skip(reason=f"{name}: {e}"))
            )
            continue
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if issubclass(cls, Screen) and cls.__module__ == name:
                params.append(pytest.param(cls, id=f"{info.name}.{cls.__name__}"))
    return params


SCREEN_CLASSES = _screen_classes()


def _action(binding: Binding) -> str:
    """`answer(False)` → answer, `app.quit` → quit."""
    return binding.action.split("(")[0].split(".")[-1]


def _bindings(cls) -> list[Binding]:
    return [b for b in getattr(cls, "BINDINGS", []) if isinstance(b, Binding)]


def _args_for(cls, home: Path) -> dict:
    """Required constructor arguments, by parameter name."""
    spec = load_spec(home / "runs" / RUN_A / "spec.toml")
    known = {
        "run_ids": [RUN_A, RUN_B],
        "run_ref": RUN_A,
        "run_id": RUN_A,
        "spec": spec,
        "question": "Sure?",
        "under": RunsScreen(),
        "dumps": [],
        "default": "x.toml",
        "text": Text("advice"),
        "can_apply": True,
        "path": home / "runs" / RUN_A / "spec.toml",
        "spec_path": home / "runs" / RUN_A / "spec.toml",
        # the chat screen loads it in a worker; a checkpoint that is not there is its error
        "source": ModelSource(
            run_dir=home / "runs" / RUN_A,
            spec=spec,
            checkpoint=home / "runs" / RUN_A / "output" / "checkpoint-1",
            step=1,
            adapter=True,
        ),
    }
    out = {}
    for name, p in inspect.signature(cls).parameters.items():
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name not in known:
            pytest.fail(
                f"tests/test_readonly.py cannot build {cls.__name__}({name}=...): "
                "add the argument to _args_for"
            )
        out[name] = known[name]
    return out


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    make_run(home / "runs", RUN_A, created=T0, checkpoints=(100,))
    make_run(home / "runs", RUN_B, status="stopped", created=T0 + 60, checkpoints=(50,))
    # a sweep of the two, for the sweep screen to show (with none it says so and closes)
    (home / "sweeps").mkdir()
    (home / "sweeps" / "sw-1.json").write_text(
        json.dumps(
            {
                "id": "sw-1",
                "points": [
                    {"point": i, "run_id": r, "run_dir": str(home / "runs" / r), "settings": {}}
                    for i, r in enumerate((RUN_A, RUN_B))
                ],
            }
        )
    )
    return home


def _visible(app, screen) -> tuple[set[str], set[str], set[str], set[str]]:
    """Actions in the footer (what it would show, and the keys it did draw), palette titles
    and help descriptions of `screen` now."""
    shown = {_action(ab.binding) for ab in screen.active_bindings.values() if ab.binding.show}
    drawn = {k.action.split("(")[0].split(".")[-1] for k in screen.query(FooterKey)}
    palette = {c.title for c in app.get_system_commands(screen)}
    helped = {desc for _, desc in help_rows(screen, app)}
    return shown, drawn, palette, helped


@pytest.mark.parametrize("cls", SCREEN_CLASSES)
async def test_readonly_hides_mutating_actions_everywhere(cls, home):
    mutating = set(getattr(cls, "MUTATING", ()))
    titles = {b.description for b in _bindings(cls) if _action(b) in mutating and b.description}
    app = TunedeckApp(readonly=True, refresh_s=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(pilot, lambda: isinstance(app.screen, RunsScreen))
        screen = cls(**_args_for(cls, home))
        await app.push_screen(screen)
        await _until(pilot, lambda: app.screen is screen and screen.is_mounted)
        # the footer draws its keys a moment after the screen mounts (on a loaded machine
        # later than any fixed pause): wait for them, else `drawn` would check nothing
        if screen.query(Footer):
            await _until(pilot, lambda: bool(screen.query(FooterKey)), 30, "the footer's keys")
        shown, drawn, palette, helped = _visible(app, screen)
        assert not shown & mutating, f"footer shows {shown & mutating}"
        assert not drawn & mutating, f"footer draws {drawn & mutating}"
        assert not palette & titles, f"ctrl+p offers {palette & titles}"
        assert not helped & titles, f"? lists {helped & titles}"
        for action in mutating:  # the keys are off too (Textual asks check_action)
            assert screen.check_action(action, ()) is False


@pytest.mark.parametrize("cls", SCREEN_CLASSES)
def test_actions_that_change_things_are_declared_mutating(cls):
    risky = {_action(b) for b in _bindings(cls)} & CHANGES_THINGS
    if not risky:
        return
    assert issubclass(cls, ReadonlyAware), f"{cls.__name__} cannot hide {risky}"
    assert risky <= set(cls.MUTATING), (
        f"{cls.__name__}: {risky - set(cls.MUTATING)} not in MUTATING"
    )


async def test_runs_screen_shows_its_mutating_keys_unless_readonly(home):
    """The control for the walk above: the same check sees them without --readonly."""
    app = TunedeckApp(refresh_s=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(pilot, lambda: isinstance(app.screen, RunsScreen))
        # the footer draws its keys a moment after the screen mounts (a loaded machine took
        # longer than a fixed 0.2 s): wait for it to draw any
        await _until(pilot, lambda: bool(app.screen.query(FooterKey)), 30, "the footer's keys")
        shown, drawn, palette, helped = _visible(app, app.screen)
        assert {"new_run", "clone", "resume", "delete"} <= shown & drawn
        assert {
            "New",
            "Clone",
            "Resume",
            "Delete",
            "Import command",
            "Open spec file",
        } <= palette & helped


async def test_readonly_runs_screen_keys_do_nothing(home, monkeypatch):
    from tunedeck.tui.screens import runs as runs_mod

    pushed = []
    for which in ("compose", "preflight"):
        monkeypatch.setitem(
            runs_mod.SCREENS, which, lambda w=which: lambda *a, **k: pushed.append(w)
        )
    app = TunedeckApp(readonly=True, refresh_s=0.2)
    async with app.run_test(size=(120, 30)) as pilot:
        await _until(
            pilot,
            lambda: (
                isinstance(app.screen, RunsScreen)
                and app.screen.query_one("#runs-table").row_count == 2
            ),
        )
        screen = app.screen
        for key in ("d", "n", "c", "R", "o", "i"):
            await pilot.press(key)
        await pilot.pause(0.3)
        assert app.screen is screen and not pushed
        assert (home / "runs" / RUN_A / "state.json").exists()
        # what is left works: filter, sort, marks, the monitor
        await pilot.press("s")
        assert screen.sort_column == "run"
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = str(app.screen.query_one("#help-text").render())
        assert "Filter" in text and "Read-only session" in text
        assert "Delete" not in text and "Clone" not in text
        await pilot.press("escape")


async def test_palette_offers_the_current_screens_commands(home):
    app = TunedeckApp(refresh_s=0.2)
    async with app.run_test(size=(120, 30)) as pilot:
        await _until(
            pilot,
            lambda: (
                isinstance(app.screen, RunsScreen)
                and app.screen.query_one("#runs-table").row_count == 2
            ),
        )
        screen = app.screen
        titles = [c.title for c in app.get_system_commands(screen)]
        assert titles[:3] == ["Monitor", "Filter", "Sort"]  # the screen's own first
        assert "Quit" in titles and "Theme" in titles  # then Textual's
        # through the real palette: ctrl+p, type, enter runs the screen's action
        await pilot.press("ctrl+p")
        await _until(pilot, lambda: app.screen is not screen)
        await pilot.press(*"Reverse sort")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await _until(pilot, lambda: app.screen is screen and screen.sort_descending)
        # on another screen the palette follows it
        await app.push_screen(ConfirmScreen("Sure?"))
        assert [c.title for c in app.get_system_commands(app.screen)][0] == "No"


async def test_readonly_palette_has_no_mutating_command(home):
    app = TunedeckApp(readonly=True, refresh_s=0.2)
    async with app.run_test(size=(120, 30)) as pilot:
        await _until(pilot, lambda: isinstance(app.screen, RunsScreen))
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert "Filter" in titles
        assert not titles & {"New", "Clone", "Resume", "Delete", "Import command", "Open spec file"}
