"""The runs screen's `c` and `R` go through the same refusals as `tunedeck clone` and
`tunedeck resume` (tests/test_output_writer.py, tests/test_output_writer_cli.py): a live run
is not cloned, and a resume whose output folder a live run writes is refused at the launch
with the error shown as other launch errors are."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import until
from tests.test_manage import T0, make_run
from tests.test_tui_runs import app_for, loaded, record_notices, recorder, select
from tunedeck.core.telemetry.gpus import GpuFacts

SRC, LIVE = "20251125-080000-src-e5f6", "20251126-080000-resumed-a1a1"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A stopped run with a checkpoint, and a live run (this test process is its "agent")
    writing the same output folder, as a resume of it would."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    record_notices(monkeypatch)
    src = make_run(
        home / "runs",
        SRC,
        name="src",
        status="stopped",
        created=T0,
        step=50,
        max_steps=300,
        checkpoints=(50,),
    )
    make_run(
        home / "runs",
        LIVE,
        name="resumed",
        status="running",
        created=T0 + 86400,
        step=60,
        max_steps=300,
        output_dir=str(src / "output"),
    )
    return home


async def test_c_on_a_live_run_says_why_and_opens_nothing(home, monkeypatch):
    calls = recorder(monkeypatch, "compose", "ComposeScreen")
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, _ = await loaded(app, pilot, 2)
        select(screen, LIVE)
        await pilot.press("c")
        await until(pilot, lambda: screen.notices, what="a notice")
        text, severity = screen.notices[-1]
        assert severity == "error" and text.startswith(f"cannot clone: {LIVE} is running"), text
        assert not calls


async def test_r_into_a_folder_a_live_run_writes_is_refused_at_the_launch(home, monkeypatch):
    from tunedeck.tui.screens.preflight import PreflightScreen

    monkeypatch.setattr(
        PreflightScreen, "gpu_probe", staticmethod(lambda: GpuFacts(error="no GPU (recorded)"))
    )
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, _ = await loaded(app, pilot, 2)
        select(screen, SRC)
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, PreflightScreen), what="the gate")
        gate = app.screen
        await until(pilot, lambda: gate.finished, what="the checks")
        await pilot.press("O", "l")  # past any check this machine fails: the launch
        await until(
            pilot,
            lambda: any("launch failed" in n.message for n in app._notifications),
            what="the error",
        )
        said = next(n.message for n in app._notifications if "launch failed" in n.message)
        assert f"live run {LIVE} (resumed, running)" in said and "--share-output" in said
        assert isinstance(app.screen, PreflightScreen)
    assert sorted(p.name for p in (home / "runs").iterdir()) == [SRC, LIVE]
