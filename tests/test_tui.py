"""The TUI driven by Textual's Pilot over a real finished demo run, and in tmux."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from textual.widgets import DataTable, Static

from tests.conftest import REPO, wait_for
from tests.conftest import until as _until
from tunedeck.tui.app import TunedeckApp
from tunedeck.tui.screens.confirm import ConfirmScreen
from tunedeck.tui.screens.help import HelpScreen
from tunedeck.tui.screens.monitor import MonitorScreen
from tunedeck.tui.screens.stacks import StacksScreen
from tunedeck.tui.widgets.hardware import HardwareView
from tunedeck.tui.widgets.logview import LogView


def _last_step_event(run_dir):
    events = [json.loads(x) for x in (run_dir / "events" / "rank0.jsonl").open()]
    return [e for e in events if e["kind"] == "step"][-1]


async def test_runs_list_then_monitor_shows_last_loss(finished_demo, monkeypatch):
    home, run_id, _ = finished_demo
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    app = TunedeckApp(refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.screen.query_one("#runs-table", DataTable)
        await _until(pilot, lambda: table.row_count == 1)
        run, status = (table.get_cell_at((0, table.get_column_index(k))) for k in ("run", "status"))
        assert run == run_id and "succeeded" in str(status)
        await pilot.press("enter")
        await _until(
            pilot,
            lambda: isinstance(app.screen, MonitorScreen) and app.screen.loss_shown is not None,
        )
        screen = app.screen
        last = _last_step_event(home / "runs" / run_id)
        assert screen.loss_shown == last["loss"]
        stats = str(screen.query_one("#monitor-stats", Static).render())
        assert f"{last['loss']:.4f}" in stats
        assert f"step {last['step']}/{last['step']}" in stats
        # the agent sampled telemetry: GPU lines, or the reason there are none (no driver here)
        gpu = screen.query_one(HardwareView)
        await _until(pilot, lambda: "GPU" in gpu.text)
        log = screen.query_one(LogView)
        await _until(pilot, lambda: log.total > 0 and any(log.visible_lines()))
        log.goto(0)
        await _until(pilot, lambda: any("step" in line for line in log.visible_lines()))
        # ? shows the monitor's keys, s on a finished run does not offer a stop
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        help_text = str(app.screen.query_one("#help-text", Static).render())
        assert "Stop" in help_text and "Quit" in help_text
        await pilot.press("escape")
        await pilot.press("s")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, MonitorScreen)
        await pilot.press("q")
    assert app.return_code in (0, None)


async def test_monitor_stop_asks_for_confirmation(td_home, monkeypatch):
    """A live run: `s` asks first; `n` leaves the run running; `y` stops it."""
    from tests.conftest import DEMO, cli_json

    run_id = cli_json("launch", str(DEMO), "--set", "train.max_steps=100000", home=td_home)[
        "run_id"
    ]
    try:
        wait_for(lambda: cli_json("status", run_id, home=td_home)["step"] >= 2, 120, "steps")
        app = TunedeckApp(open_run=run_id, refresh_s=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            await _until(
                pilot, lambda: isinstance(app.screen, MonitorScreen) and app.screen.snap is not None
            )
            # `d`: every rank's stack, fetched off the event loop, in a modal
            await pilot.press("d")
            await _until(
                pilot,
                lambda: isinstance(app.screen, StacksScreen) and app.screen.query("#stacks-text"),
                timeout=30,
            )
            text = str(app.screen.query_one("#stacks-text", Static).content)
            assert "rank 0" in text and "rank 1" in text and "File " in text, text[:500]
            await pilot.press("escape")
            await _until(pilot, lambda: isinstance(app.screen, MonitorScreen))
            await pilot.press("s")
            await _until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("n")
            await pilot.pause(0.5)
            assert cli_json("status", run_id, home=td_home)["status"] == "running"
            await pilot.press("s")
            await _until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await _until(pilot, lambda: (td_home / "runs" / run_id / "stop.json").exists())
        st = wait_for(
            lambda: (s := cli_json("status", run_id, home=td_home))["status"] == "stopped" and s,
            60,
            "the stop",
        )
        assert st["stop_requested"] == "graceful"
    finally:
        cli_json("stop", run_id, "--hard", home=td_home)


async def test_readonly_hides_stop(finished_demo, monkeypatch):
    home, run_id, _ = finished_demo
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    app = TunedeckApp(open_run=run_id, readonly=True, refresh_s=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await _until(pilot, lambda: isinstance(app.screen, MonitorScreen))
        await pilot.press("s")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)


def test_tui_in_a_real_terminal(finished_demo, tmux):
    home, run_id, _ = finished_demo
    tmux.start(
        "tui",
        [sys.executable, "-m", "tunedeck.tui"],
        size=(110, 32),
        env={"TUNEDECK_HOME": str(home)},
    )
    wait_for(lambda: run_id in tmux.screen("tui"), 30, "the runs list")
    tmux.keys("tui", "Enter")
    last = _last_step_event(home / "runs" / run_id)
    wait_for(lambda: f"loss {last['loss']:.4f}" in tmux.screen("tui"), 30, "the monitor")
    tmux.keys("tui", "q")
    wait_for(lambda: not tmux.alive("tui"), 15, "quit")


@pytest.mark.slow
def test_demo_command_launches_and_monitors_live(td_home, tmux):
    """The README's main job: `tunedeck demo` starts the demo and shows it live to the end."""
    tmux.start(
        "demo",
        [sys.executable, "-m", "tunedeck.tui", "demo", "--set", "train.max_steps=60"],
        size=(120, 36),
        env={"TUNEDECK_HOME": str(td_home)},
    )
    screen = lambda: tmux.screen("demo")  # noqa: E731
    wait_for(lambda: "running" in screen() and "step " in screen(), 120, "a live monitor")
    wait_for(
        lambda: "succeeded" in screen() and "step 60/60" in screen(),
        180,
        "the end of the demo on screen",
    )
    assert "rank 0 log" in screen()
    tmux.keys("demo", "q")
    runs = list((td_home / "runs").iterdir())
    assert len(runs) == 1


def test_tui_refuses_without_a_terminal(td_home):
    proc = subprocess.run(
        [sys.executable, "-m", "tunedeck.tui"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, TUNEDECK_HOME=str(td_home)),
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2 and "needs a terminal" in proc.stderr


async def test_new_run_from_a_preset_previews_checks_and_launches(td_home):
    """n → compose with the presets as the start: the preview shows the exact command and
    the trainer's values; ctrl+l goes through the preflight gate, whose l launches and opens
    the monitor."""
    from tunedeck.tui.screens.compose import ComposeScreen
    from tunedeck.tui.screens.preflight import PreflightScreen
    from tunedeck.tui.screens.presets import PresetPicker

    app = TunedeckApp(refresh_s=0.2)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("n")
        await _until(pilot, lambda: isinstance(app.screen, PresetPicker))
        table = app.screen.query_one("#presets-table", DataTable)
        await _until(pilot, lambda: table.row_count > 0)
        names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        table.move_cursor(row=names.index("demo"))
        await pilot.press("enter")
        await _until(pilot, lambda: isinstance(app.screen, ComposeScreen))
        compose = app.screen
        await _until(
            pilot,
            lambda: (
                compose.spec.name == "demo"
                and compose.preview is not None
                and not compose.preview_pending
            ),
        )
        text = compose.preview_text()
        assert "effective batch" in text and "-m tunedeck.core.train" in text
        assert "train.max_steps = 200" in text
        compose.query_one("#w-train--max_steps").value = "3"
        await _until(pilot, lambda: compose.spec.train.max_steps == 3)
        await pilot.press("ctrl+l")
        await _until(pilot, lambda: isinstance(app.screen, PreflightScreen))
        gate = app.screen
        await _until(pilot, lambda: gate.finished, timeout=60)
        assert not gate.failed(), [(r.id, r.detail) for r in gate.failed()]
        assert gate.spec.train.max_steps == 3
        await pilot.press("l")
        await _until(pilot, lambda: isinstance(app.screen, MonitorScreen), timeout=60)
        # let the new screen finish mounting before the app shuts down
        await _until(pilot, lambda: app.screen.snap is not None, timeout=60)
        run_id = app.screen.run_ref
        # the monitor replaced the form: Esc goes back to the runs list
        assert not any(isinstance(s, (ComposeScreen, PreflightScreen)) for s in app.screen_stack)
    state = json.loads((td_home / "runs" / run_id / "state.json").read_text())
    assert state["preflight"]["status"] == "passed" and state["preflight"]["by"] == "tui"
