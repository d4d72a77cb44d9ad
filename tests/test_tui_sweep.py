"""The sweep screen (tui/screens/sweep.py) driven by Pilot: on a real 2-point CPU sweep its
table says what `tunedeck sweep show` prints and `--json` holds; reached by `w` from the runs
list (a point under the cursor) and by ctrl+p; Enter opens a point's monitor, C compares the
points, `?` lists the keys. An SVG snapshot on fixed run directories and a fixed clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from textual.widgets import DataTable

from tests.conftest import DEMO, cli, until
from tests.test_manage import T0, make_run
from tunedeck.core.rundir import write_json_atomic
from tunedeck.tui.app import TunedeckApp
from tunedeck.tui.screens.compare import CompareScreen
from tunedeck.tui.screens.help import HelpScreen, help_rows
from tunedeck.tui.screens.monitor import MonitorScreen
from tunedeck.tui.screens.runs import RunsScreen
from tunedeck.tui.screens.sweep import SweepScreen


def _table_text(table: DataTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def _open_sweep(pilot) -> tuple[SweepScreen, DataTable]:
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.selected_run_id())
    await pilot.press("w")
    await until(pilot, lambda: isinstance(app.screen, SweepScreen) and app.screen.rows)
    await pilot.pause()
    return app.screen, app.screen.query_one("#sweep-table", DataTable)


@pytest.mark.slow
async def test_the_sweep_table_agrees_with_sweep_show_on_a_real_sweep(td_home):
    out = cli(
        "sweep", str(DEMO), "--grid", "train.learning_rate=1e-3,2e-3", "--parallel", "2",
        "--set", "train.max_steps=4", "--set", "train.save_steps=0", "--set", "cluster.cpu_procs=1",
        "--set", "data.val_split=0.2", "--set", "train.eval_steps=2", "--wait", "--json",
        home=td_home,
    )  # fmt: skip
    shown = json.loads(out.stdout)
    rows = shown["points"]
    assert [r["status"] for r in rows] == ["succeeded", "succeeded"]
    assert all(r["best_eval_loss"] is not None and r["tokens_per_s"] for r in rows), rows
    text = cli("sweep", "show", shown["sweep"], home=td_home).stdout.splitlines()

    app = TunedeckApp(refresh_s=0.1)
    async with app.run_test(size=(140, 30)) as pilot:
        screen, table = await _open_sweep(pilot)
        assert screen.sweep_id == shown["sweep"]
        cells = _table_text(table)
        # the TUI's rows are the CLI's table, word for word, in the same order
        assert cells == [line.split() for line in text[1:]]
        for got, row in zip(cells, rows):  # and what --json holds
            assert got[0] == str(row["point"]) and got[-1] == row["run_id"]
            assert got[1] == str(row["settings"]["train.learning_rate"])
            assert got[2:4] == [row["status"], str(row["step"])]
            assert float(got[4]) == pytest.approx(row["best_eval_loss"], abs=1e-3)
            assert float(got[6]) == pytest.approx(row["tokens_per_s"], abs=0.5)
        assert [str(c.label) for c in table.columns.values()][:2] == ["#", "train.learning_rate"]

        await pilot.press("question_mark")  # the keys, from the live bindings
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        helped = dict((d, k) for k, d in help_rows(screen, app))
        assert helped["Monitor"] == "enter" and helped["Compare points"] == "C", helped
        assert helped["Sweep"] == "w"  # the app's key, from every screen
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen)

        table.move_cursor(row=1)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen))
        assert app.screen.run_ref == rows[1]["run_id"]
        app.pop_screen()
        await until(pilot, lambda: app.screen is screen)
        await pilot.press("C")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen))
        assert app.screen.run_ids == [r["run_id"] for r in rows]

        # ctrl+p offers it from any screen: the sweep of the run shown, else the newest
        app.pop_screen()
        app.pop_screen()
        await until(pilot, lambda: isinstance(app.screen, RunsScreen))
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert "Sweep" in titles


SWEEP = "sw-20251124-090000-a1b2"
POINTS = [
    ("20251124-090001-demo-a1b2-0-aa01", 1e-4, "succeeded", 100, 1.2345),
    ("20251124-090002-demo-a1b2-1-aa02", 3e-4, "stopped", 40, 2.5),
    ("20251124-090003-demo-a1b2-2-aa03", 1e-3, "failed", 7, None),
]


@pytest.fixture
def sweep_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    points = []
    for i, (run_id, lr, status, step, loss) in enumerate(POINTS):
        run_dir = make_run(home / "runs", run_id, name=f"demo-a1b2-{i}", status=status,
                           created=T0 + i, step=step, loss=loss)  # fmt: skip
        points.append({"point": i, "settings": {"train.learning_rate": lr, "train.seed": 1},
                       "run_id": run_id, "run_dir": str(run_dir)})  # fmt: skip
    write_json_atomic(
        home / "sweeps" / f"{SWEEP}.json",
        {"id": SWEEP, "grid": {}, "parallel": 2, "created": T0, "points": points},
    )
    return home


def test_snapshot_sweep(sweep_home, snap_compare):
    async def run_before(pilot) -> None:
        await until(pilot, lambda: isinstance(pilot.app.screen, RunsScreen))
        pilot.app.push_screen(SweepScreen(SWEEP))
        # the columns measured and the rows redrawn: whole statuses and run ids on screen
        await until(pilot, lambda: POINTS[2][0] in pilot.app.export_screenshot())
        await until(pilot, lambda: "succeeded" in pilot.app.export_screenshot())
        await pilot.pause()

    app = TunedeckApp(refresh_s=3600, clock=lambda: T0 + 86400)
    assert snap_compare(app, terminal_size=(120, 16), run_before=run_before)
