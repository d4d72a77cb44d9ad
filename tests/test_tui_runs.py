"""The runs list (tui/screens/runs.py) driven by Pilot over run directories written by the real
launch code: filter, sort, marks + compare, delete (two confirmations), clone, new, open,
import, resume; rows redrawn only when they change; SVG snapshots on fixed data and a fixed
clock.

Screens other modules own (compose, preflight, compare) are swapped for recorders through
`runs.SCREENS`, so these tests see the class name and the arguments a key would push; the
`real_*` tests push the real ones and skip while a module has not landed.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from textual import events
from textual.screen import Screen
from textual.widgets import DataTable, Input, Static

from tests.test_manage import T0, make_run, write_checkpoint
from tests.conftest import until
from tunedeck.core.spec import RunSpec, load_spec
from tunedeck.tui.app import TunedeckApp
from tunedeck.tui.screens import runs as runs_mod
from tunedeck.tui.screens.confirm import ConfirmScreen
from tunedeck.tui.screens.prompt import PromptScreen, join_pasted_lines
from tunedeck.tui.screens.runs import RunsScreen

NOW = T0 + 3 * 86400  # the pinned clock: ages on screen never move

# fixed ids and created times; every status and a run without a loss
RUNS = [
    (
        "20251124-090000-demo-a1b2",
        dict(name="demo", status="succeeded", created=T0, loss=1.2345, checkpoints=(100,)),
    ),
    (
        "20251124-100000-lora-7b-c3d4",
        dict(name="lora-7b", status="failed", created=T0 + 3600, step=40, max_steps=500, loss=2.5),
    ),
    (
        "20251125-080000-qlora-e5f6",
        dict(
            name="qlora",
            status="stopped",
            created=T0 + 86400,
            step=150,
            max_steps=300,
            loss=0.9,
            checkpoints=(50, 100),
        ),
    ),
    (
        "20251126-120000-sweep-0a0b",
        dict(
            name="sweep", status="failed", created=T0 + 2 * 86400, step=0, max_steps=100, loss=None
        ),
    ),
    (
        "20251126-230000-fsdp-1c1d",
        dict(
            name="fsdp", status="succeeded", created=NOW - 300, step=200, max_steps=200, loss=0.45
        ),
    ),
]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    for run_id, kw in RUNS:
        make_run(home / "runs", run_id, **kw)
    record_notices(monkeypatch)
    return home


def record_notices(monkeypatch) -> None:
    """What the runs screen told the user, as (text, severity), in `screen.notices`: its
    notify, wrapped (the screen keeps no list of its own)."""
    real = RunsScreen.notify

    def notify(self, message, *, severity="information", **kw):
        self.__dict__.setdefault("notices", []).append((message, severity))
        return real(self, message, severity=severity, **kw)

    monkeypatch.setattr(RunsScreen, "notify", notify)
    monkeypatch.setattr(RunsScreen, "notices", (), raising=False)  # none yet


def recorder(monkeypatch, which: str, name: str) -> list[tuple[tuple, dict]]:
    """Swap the screen `which` for one named `name` that records its arguments."""
    calls: list[tuple[tuple, dict]] = []

    class Recorded(Screen):
        def __init__(self, *args, **kwargs):
            super().__init__()
            calls.append((args, kwargs))

        def compose(self):
            yield Static(name)

    Recorded.__name__ = Recorded.__qualname__ = name
    monkeypatch.setitem(runs_mod.SCREENS, which, lambda: Recorded)
    return calls


def app_for(**kw) -> TunedeckApp:
    return TunedeckApp(refresh_s=0.1, clock=lambda: NOW, **kw)


async def loaded(app, pilot, n: int = len(RUNS)) -> tuple[RunsScreen, DataTable]:
    await until(
        pilot,
        lambda: (
            isinstance(app.screen, RunsScreen)
            and app.screen.query_one("#runs-table", DataTable).row_count == n
        ),
    )
    return app.screen, app.screen.query_one("#runs-table", DataTable)


def column(table: DataTable, key: str) -> list[str]:
    return [str(table.get_cell(r.key, key)) for r in table.ordered_rows]


def select(screen: RunsScreen, run_id: str) -> None:
    table = screen.query_one("#runs-table", DataTable)
    table.move_cursor(row=table.get_row_index(run_id))


# -- view keys ---------------------------------------------------------------------------


async def test_rows_newest_first_with_ages_from_the_clock(home):
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot)
        assert column(table, "run") == [r for r, _ in reversed(RUNS)]
        assert column(table, "age") == ["5m", "1d", "2d", "2d", "3d"]
        assert column(table, "loss")[1] == "-" and column(table, "step")[0] == "200/200"
        assert "5 runs" in str(screen.query_one("#runs-header", Static).render())


async def test_columns_fit_the_width_by_priority_and_the_detail_shows_the_selected_run(home):
    app = app_for()
    async with app.run_test(size=(240, 40)) as pilot:
        screen, table = await loaded(app, pilot)
        await until(pilot, lambda: len(screen.facts) == len(RUNS), what="the runs' settings")
        await until(pilot, lambda: column(table, "model")[0] == "tiny-qwen2", what="facts")
        # every column at 240: the settings read from each run's frozen spec and plan
        assert column(table, "backend") == ["builtin"] * len(RUNS)
        assert column(table, "ranks") == ["2×1"] * len(RUNS)  # the demo: 2 CPU ranks, 1 node
        assert column(table, "time") == ["9:55"] * len(RUNS)  # started (+5 s) to ended
        select(screen, RUNS[1][0])
        await pilot.pause()
        detail = str(screen.query_one("#runs-detail", Static).render())
        assert detail.startswith("lora-7b · tiny-qwen2 lora · 2 ranks × 1 node · batch 8"), detail
        assert "lr 0.005 · ddp" in detail and "output output/ in the run's folder" in detail
        # narrower: the least telling columns go, whole; what stays is never cut
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: "backend" not in screen.shown_columns, what="fewer columns")
        assert screen.shown_columns == ["mark", "run", "name", "status", "step", "loss", "age"]
        await until(pilot, lambda: table.row_count == len(RUNS), what="the rows back")
        assert column(table, "run") == [r for r, _ in reversed(RUNS)]
        assert screen.selected_run_id() == RUNS[1][0]  # the selection survives


async def test_filter_narrows_rows_and_escape_clears(home):
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot)
        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await pilot.press(*"failed")
        await until(pilot, lambda: table.row_count == 2)
        assert set(column(table, "name")) == {"lora-7b", "sweep"}
        header = str(screen.query_one("#runs-header", Static).render())
        assert "2 of 5 runs" in header and "failed" in header
        # every word must match: status and name
        await pilot.press("space", *"sw")
        await until(pilot, lambda: table.row_count == 1)
        assert column(table, "name") == ["sweep"]
        await pilot.press("enter")  # back to the table, the filter stays
        assert app.focused is table and table.row_count == 1
        await pilot.press("slash", "ctrl+a", "ctrl+k", *"e5f6")  # by id
        await until(pilot, lambda: column(table, "name") == ["qlora"])
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == 5)
        assert screen.filter_text == "" and app.focused is table
        assert not screen.query_one("#runs-filter").display


async def test_sort_cycles_columns_and_the_header_shows_it(home):
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot)
        labels = lambda: [str(c.label).strip() for c in table.columns.values()]  # noqa: E731
        # 160 columns: all but BACKEND (from 170), the least telling
        assert labels() == ["", "RUN", "NAME", "MODEL", "RANKS", "STATUS", "STEP", "LOSS"] + [
            "TOK/S",
            "TIME",
            "AGE ▲",
        ]
        await pilot.press("s")  # RUN ascending
        assert labels()[1] == "RUN ▲" and "AGE" in labels()
        assert column(table, "run") == sorted(r for r, _ in RUNS)
        await pilot.press("S")  # RUN descending
        assert labels()[1] == "RUN ▼"
        assert column(table, "run") == sorted((r for r, _ in RUNS), reverse=True)
        await pilot.press("s", "s", "s", "s")  # NAME, STATUS, STEP, LOSS
        assert screen.sort_column == "loss" and not screen.sort_descending
        assert column(table, "loss") == ["0.4500", "0.9000", "1.2345", "2.5000", "-"]
        await pilot.press("S")  # no loss yet: last either way
        assert column(table, "loss") == ["2.5000", "1.2345", "0.9000", "0.4500", "-"]
        assert "sort LOSS ▼" in str(screen.query_one("#runs-header", Static).render())
        await pilot.press("s")  # back to AGE
        assert column(table, "run") == [r for r, _ in reversed(RUNS)]


async def test_cursor_stays_on_its_run_when_rows_move(home):
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot)
        select(screen, RUNS[2][0])
        await pilot.press("s")
        assert screen.selected_run_id() == RUNS[2][0]
        make_run(home / "runs", "20251127-000000-new-9999", created=NOW - 10)
        await until(pilot, lambda: table.row_count == 6)
        assert screen.selected_run_id() == RUNS[2][0]


async def test_marks_then_compare_pushes_the_compare_screen(home, monkeypatch):
    calls = recorder(monkeypatch, "compare", "CompareScreen")
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot)
        select(screen, RUNS[0][0])
        await pilot.press("space")
        await pilot.press("C")
        assert not calls and "mark two or more" in screen.notices[-1][0]
        select(screen, RUNS[2][0])
        await pilot.press("space")
        assert column(table, "mark").count("●") == 2
        assert "2 marked" in str(screen.query_one("#runs-header", Static).render())
        await pilot.press("C")
        await until(pilot, lambda: type(app.screen).__name__ == "CompareScreen")
        # in list order, newest first
        assert calls == [(([RUNS[2][0], RUNS[0][0]],), {})]
        await pilot.press("escape")  # the recorder has no keys: leave through the app
        await app.pop_screen()
        await pilot.press("space")  # unmark the one under the cursor
        assert screen.marked == {RUNS[0][0]}
        await pilot.press("escape")  # no filter: esc clears the marks
        assert not screen.marked and "●" not in column(table, "mark")


async def test_only_changed_rows_are_redrawn(home):
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)  # the first draw has settled
        screen, table = await loaded(app, pilot)
        calls: list[tuple] = []
        for name in ("update_cell", "add_row", "remove_row", "sort", "clear"):
            real = getattr(table, name)
            setattr(
                table,
                name,
                lambda *a, _n=name, _r=real, **k: (calls.append((_n, a)), _r(*a, **k))[1],
            )
        generation = screen.generation
        await pilot.pause(0.5)  # several refreshes of an unchanged registry
        assert calls == [] and screen.generation == generation
        from tunedeck.core.rundir import RunDir

        rd = RunDir(home / "runs" / RUNS[1][0])
        st = rd.read_state()
        st["progress"]["loss"] = 2.25
        rd.write_state(st)
        await until(pilot, lambda: calls)
        await pilot.pause(0.3)
        assert {(n, a[0], str(a[1])) for n, a in calls} == {("update_cell", RUNS[1][0], "loss")}


async def test_ages_move_with_the_clock_and_nothing_else_is_redrawn(home):
    now = [NOW]
    app = TunedeckApp(refresh_s=0.1, clock=lambda: now[0])
    async with app.run_test(size=(160, 40)) as pilot:
        await _ready(pilot)
        screen, table = await loaded(app, pilot)
        calls: list[tuple] = []
        real = table.update_cell
        table.update_cell = lambda *a, **k: (calls.append(a), real(*a, **k))[1]
        now[0] += 30  # fsdp is 5m30s old: no age text moves
        await pilot.pause(0.4)
        assert calls == []
        now[0] += 40  # 6m10s: only that cell changes
        await until(pilot, lambda: calls)
        await pilot.pause(0.3)
        assert [(a[0], str(a[1]), a[2]) for a in calls] == [(RUNS[4][0], "age", "6m")]


@pytest.mark.parametrize("age", [0.5, 59.2, 60, 61.5, 3599.5, 3600, 86399.9, 90000.3, 1e6])
def test_age_text_is_stable_until_the_predicted_time(age):
    from tunedeck.tui.format import fmt_age

    d = RunsScreen._age_stable_for(age)
    assert d > 0
    assert fmt_age(age + d - 1e-6) == fmt_age(age) != fmt_age(age + d + 1e-6)


# -- keys that open other screens ---------------------------------------------------------


async def test_new_clone_open_push_compose(home, monkeypatch, tmp_path):
    calls = recorder(monkeypatch, "compose", "ComposeScreen")
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot)
        await pilot.press("n")
        await until(pilot, lambda: type(app.screen).__name__ == "ComposeScreen")
        assert calls[-1] == ((), {})
        await app.pop_screen()

        src = RUNS[2][0]
        select(screen, src)
        await pilot.press("c")
        await until(pilot, lambda: len(calls) == 2)
        args, kw = calls[-1]
        frozen = load_spec(home / "runs" / src / "spec.toml")
        assert args == () and kw["title"] == f"clone of {src}"
        spec = kw["spec"]
        assert isinstance(spec, RunSpec) and spec.name == "qlora"
        assert spec.train.max_steps == frozen.train.max_steps == 300
        assert spec.run.output_dir == "" and spec.train.resume_from == ""
        await app.pop_screen()

        spec_file = tmp_path / "mine.toml"
        spec_file.write_text((home / "runs" / src / "spec.toml").read_text())
        await pilot.press("o")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press(*str(spec_file), "enter")
        await until(pilot, lambda: len(calls) == 3)
        assert calls[-1] == ((), {"path": spec_file})
        await app.pop_screen()

        await pilot.press("o")
        await pilot.press(*"/no/such.toml", "enter")
        await until(pilot, lambda: "no such file" in screen.notices[-1][0])
        assert len(calls) == 3


async def test_import_pushes_compose_with_the_imported_spec(home, monkeypatch):
    calls = recorder(monkeypatch, "compose", "ComposeScreen")
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, _ = await loaded(app, pilot)
        await pilot.press("i")
        assert isinstance(app.screen, PromptScreen)
        box = app.screen.query_one(Input)
        # a command pasted from a script: lines continued with a backslash
        box.post_message(
            events.Paste(
                "torchrun --nnodes=2 --nproc_per_node=4 \\\n"
                "  --rdzv_endpoint=10.0.0.1:29400 \\\n"
                "  train.py --lr 3e-4\n"
            )
        )
        await pilot.pause()
        await pilot.press("enter")
        await until(pilot, lambda: calls or screen.notices, timeout=60)
        assert calls, screen.notices
        args, kw = calls[-1]
        spec = kw["spec"]
        assert kw["title"] == "imported command"
        assert spec.backend == "script" and spec.script.path == "train.py"
        assert spec.script.args == ["--lr", "3e-4"] and spec.cluster.nnodes == 2
        await app.pop_screen()

        # warnings are shown, errors too (and nothing is pushed)
        await pilot.press("i")
        pasted = "CUDA_VISIBLE_DEVICES=0,1 swift sft --model m --dataset d.jsonl"
        app.screen.query_one(Input).value = pasted
        await pilot.press("enter")
        await until(
            pilot,
            lambda: len(calls) == 2 or any(s == "error" for _, s in screen.notices),
            timeout=60,
        )
        if len(calls) == 2:  # ms-swift installed: its flags were checked, with a note
            assert any(
                "NPROC_PER_NODE is unset" in t for t, s in screen.notices if s == "information"
            )
            await app.pop_screen()
        await pilot.press("i")
        app.screen.query_one(Input).value = "mpirun -np 2 python train.py"
        await pilot.press("enter")
        await until(pilot, lambda: "launcher" in screen.notices[-1][0], timeout=60)
        assert screen.notices[-1][1] == "error" and type(app.screen) is RunsScreen


def test_pasted_continued_lines_become_one_command():
    assert (
        join_pasted_lines("swift sft \\\n  --model m \\\n\n  --lr 1\n")
        == "swift sft --model m --lr 1"
    )


async def test_resume_builds_the_resume_spec_and_pushes_preflight(home, monkeypatch):
    calls = recorder(monkeypatch, "preflight", "PreflightScreen")
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, _ = await loaded(app, pilot)
        src = home / "runs" / RUNS[2][0]  # stopped, checkpoints 50 and 100
        write_checkpoint(src / "output", 150, complete=False)
        select(screen, RUNS[2][0])
        await pilot.press("R")
        await until(pilot, lambda: calls)
        (spec,), kw = calls[-1]
        assert kw == {"gate": True}
        assert spec.train.resume_from == str(src / "output" / "checkpoint-100")
        assert spec.run.output_dir == str(src / "output")
        assert type(app.screen).__name__ == "PreflightScreen"
        await app.pop_screen()

        select(screen, RUNS[1][0])  # failed, no checkpoint
        await pilot.press("R")
        await until(pilot, lambda: "no complete checkpoint" in screen.notices[-1][0])
        assert screen.notices[-1][1] == "error" and len(calls) == 1
        select(screen, RUNS[0][0])  # succeeded
        await pilot.press("R")
        await until(pilot, lambda: "finished all its steps" in screen.notices[-1][0])
        assert len(calls) == 1


async def test_resume_of_a_run_stopped_since_the_list_read_it(home, monkeypatch):
    """The list read the run while it ran; its stop is recorded since (the monitor said so),
    and R comes before the list's next look: R resumes it as it is on disk, and a return to
    the list from another screen shows it stopped at once, not a refresh later."""
    from tests.test_manage import _agent, _record_end

    calls = recorder(monkeypatch, "preflight", "PreflightScreen")
    run_id = "20251127-020000-live-7f7f"
    run_dir = make_run(home / "runs", run_id, status="running", step=5, checkpoints=(5,))
    app = TunedeckApp(refresh_s=3600, clock=lambda: NOW)  # no look but the first, unless asked
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot, 6)
        agent = _agent(0)
        agent.wait()
        _record_end(run_dir, agent)
        select(screen, run_id)
        assert str(table.get_cell(run_id, "status")) == "running"  # what the list last read
        await pilot.press("R")
        errors = lambda: [text for text, sev in screen.notices if sev == "error"]  # noqa: E731
        await until(pilot, lambda: calls or errors(), what="the resume's preflight or an error")
        assert not errors() and calls[-1][0][0].train.resume_from == str(
            run_dir / "output" / "checkpoint-5"
        )
        await app.pop_screen()  # back to the list: it looks again now
        await until(pilot, lambda: str(table.get_cell(run_id, "status")) == "stopped", 10)


# -- delete ------------------------------------------------------------------------------


async def test_delete_asks_and_removes_only_the_records(home):
    run_id = RUNS[2][0]
    run_dir = home / "runs" / run_id
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot)
        select(screen, run_id)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "kept unless you confirm" in app.screen.question
        await pilot.press("n")
        await until(pilot, lambda: screen.notices and screen.notices[-1][0] == "nothing deleted")
        assert (run_dir / "state.json").exists()

        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("enter")  # the default answer is No
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert (run_dir / "state.json").exists()

        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(
            pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen.yes_key == "D"
        )
        second = app.screen.question
        assert str((run_dir / "output").resolve()) in second and "2 complete checkpoint" in second
        await pilot.press("y")  # y does not answer the second question
        await pilot.pause(0.2)
        assert isinstance(app.screen, ConfirmScreen) and run_dir.joinpath("state.json").exists()
        await pilot.press("n")
        await until(pilot, lambda: table.row_count == 4)
        assert run_id not in column(table, "run")
        assert sorted(p.name for p in run_dir.iterdir()) == ["output"]
        assert (run_dir / "output" / "checkpoint-100" / "trainer_state.json").exists()
        assert "its outputs stay in" in screen.notices[-1][0]


async def test_delete_outputs_after_the_second_confirmation(home):
    run_id = RUNS[0][0]
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot)
        select(screen, run_id)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(
            pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen.yes_key == "D"
        )
        await pilot.press("D")
        await until(pilot, lambda: table.row_count == 4)
    assert not (home / "runs" / run_id).exists()


async def test_delete_refuses_a_running_run(home):
    run_id = "20251127-010000-live-5e5e"
    make_run(home / "runs", run_id, status="running", created=NOW - 60)
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot, 6)
        select(screen, run_id)
        await pilot.press("d")
        await until(pilot, lambda: screen.notices and "before deleting" in screen.notices[-1][0])
        assert "is running: stop it before deleting it" in screen.notices[-1][0]
        assert not isinstance(app.screen, ConfirmScreen)
        assert (home / "runs" / run_id / "state.json").exists()


async def test_delete_judges_the_run_by_its_state_now_not_by_the_lists_last_scan(home):
    """The list still shows the run running (its next scan is far off) but its end has been
    recorded since: d asks to delete it instead of refusing."""
    from tunedeck.core.rundir import RunDir

    run_id = "20251127-010000-ends-5e5e"
    run_dir = make_run(home / "runs", run_id, status="running", created=NOW - 60)
    app = TunedeckApp(refresh_s=3600, clock=lambda: NOW)  # one scan, at the start
    async with app.run_test(size=(160, 40)) as pilot:
        screen, table = await loaded(app, pilot, 6)
        rd = RunDir(run_dir)
        st = rd.read_state()
        st.update(status="stopped", ended=NOW - 1, agent_pid=None, agent_create_time=None)
        rd.write_state(st)
        select(screen, run_id)
        assert screen.selected_run().active  # what the list last saw
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen) or screen.notices)
        assert isinstance(app.screen, ConfirmScreen), screen.notices
        assert "(demo, stopped)?" in app.screen.question  # asked on the state it has now


# -- the real screens, once their modules have landed -----------------------------------


def _real(module: str, cls: str, needs: str = ""):
    mod = pytest.importorskip(module, reason=f"{module} has not landed yet")
    screen = getattr(mod, cls, None)
    if screen is None:
        pytest.skip(f"{module}.{cls} has not landed yet")
    if needs and needs not in inspect.signature(screen).parameters:
        pytest.skip(f"{cls} does not take {needs}= yet")
    return screen


def _opened(app, cls) -> bool:
    # the new screen may have opened a dialog of its own on top (compose's preset picker)
    return any(isinstance(s, cls) for s in app.screen_stack)


async def test_real_compose_screen_opens_for_new_and_clone(home):
    compose = _real("tunedeck.tui.screens.compose", "ComposeScreen", "spec")
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, _ = await loaded(app, pilot)
        await pilot.press("n")
        await until(pilot, lambda: _opened(app, compose) or screen.notices)
        assert _opened(app, compose), screen.notices
        while app.screen is not screen:
            await app.pop_screen()
        await pilot.pause()
        select(screen, RUNS[2][0])
        await pilot.press("c")
        await until(pilot, lambda: _opened(app, compose) or screen.notices)
        assert _opened(app, compose), screen.notices
        assert not [n for n in screen.notices if n[1] == "error"]


async def test_real_preflight_screen_opens_for_resume(home):
    preflight = _real("tunedeck.tui.screens.preflight", "PreflightScreen", "gate")
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, _ = await loaded(app, pilot)
        select(screen, RUNS[2][0])
        await pilot.press("R")
        await until(pilot, lambda: _opened(app, preflight))


async def test_real_compare_screen_opens(home):
    compare = _real("tunedeck.tui.screens.compare", "CompareScreen")
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, _ = await loaded(app, pilot)
        for run_id in (RUNS[0][0], RUNS[2][0]):
            select(screen, run_id)
            await pilot.press("space")
        await pilot.press("C")
        await until(pilot, lambda: _opened(app, compare))


# -- snapshots ---------------------------------------------------------------------------


async def _detail_laid_out(pilot, screen) -> None:
    """Until the selected run's detail shows its settings in a laid-out box (its height is fixed,
    so no later layout moves the list under a screenshot taken now)."""
    detail = screen.query_one("#runs-detail", Static)

    def laid_out() -> bool:
        text = str(detail.render())
        return "tiny-qwen2" in text and detail.size.height >= len(text.splitlines())

    await until(pilot, laid_out, what="the detail")


async def _ready(pilot) -> None:
    screen, table = await loaded(pilot.app, pilot)
    # what is on screen: whole ids (the columns were measured and the rows redrawn)
    await until(pilot, lambda: RUNS[1][0] in pilot.app.export_screenshot())
    # and each run's settings (read after the list shows, in the same worker)
    await until(pilot, lambda: len(screen.facts) == len(RUNS), what="the runs' settings")
    await pilot.pause()
    await _detail_laid_out(pilot, screen)

    def measured() -> bool:  # the table drew its rows at the widths of the cells it holds
        table = screen.query_one("#runs-table", DataTable)
        widths = tuple(c.get_render_width(table) for c in table.columns.values())
        return all(w > 2 for w in widths[1:]) and screen._painted_widths == widths

    await until(pilot, measured, what="the columns measured")
    await pilot.pause(0.1)


@pytest.mark.parametrize(
    "size", [(80, 24), (120, 40), (160, 48), (240, 67)], ids=["80x24", "120x40", "160x48", "240x67"]
)
def test_snapshot_runs_list(home, snap_compare, size):
    assert snap_compare(app_for(), terminal_size=size, run_before=_ready)


def test_snapshot_runs_list_filtered_marked_sorted(home, snap_compare):
    async def setup(pilot) -> None:
        await _ready(pilot)
        screen = pilot.app.screen
        select(screen, RUNS[2][0])
        # a blinking cursor is drawn or not by when the picture is taken (a loaded machine
        # took it after the first blink): keep it drawn
        screen.query_one("#runs-filter", Input).cursor_blink = False
        await pilot.press("space", "s", "s", "s", "s", "s", "S", "slash", *"lora")
        await pilot.pause()
        await _detail_laid_out(pilot, screen)  # the filter may have moved the selection

    assert snap_compare(app_for(), terminal_size=(80, 24), run_before=setup)


def test_snapshot_readonly(home, snap_compare):
    assert snap_compare(app_for(readonly=True), terminal_size=(80, 24), run_before=_ready)


def test_the_monitor_colours_lost_and_damaged_runs_as_the_runs_list_does(tmp_path):
    """A run whose agent is gone (`lost`) and one whose state.json cannot be read (`damaged`)
    look the same in the monitor's progress pane as in the runs list (each status does)."""
    import dataclasses

    from rich.style import Style
    from rich.text import Text
    from tunedeck.core.views.registry import list_runs
    from tunedeck.core.views.watch import RunWatcher
    from tunedeck.tui.widgets.progress import progress_text

    root = tmp_path / "runs"
    make_run(root, "20251127-010000-live-1a1a", status="running")
    damaged = make_run(root, "20251127-020000-bad-2b2b")
    (damaged / "state.json").write_text("{")
    screen = RunsScreen()
    infos = {i.status: i for i in list_runs(root)}
    assert set(infos) == {"running", "damaged"}
    # a lost run reads like a running one but for its status (making one needs a dead agent
    # whose ranks live on: tests/test_runs.py does that for real)
    infos["lost"] = dataclasses.replace(infos["running"], status="lost")
    for status, info in infos.items():
        listed = screen._cells(info, NOW)["status"]
        assert listed.plain == status and listed.style, status
        snap = RunWatcher(info.run_dir).poll(history=False)
        snap = dataclasses.replace(snap, run=info)
        shown = Text.from_markup(progress_text(snap, 160))
        spans = [s for s in shown.spans if s.start == 0 and s.end == len(status)]
        assert shown.plain.startswith(status) and [Style.parse(str(s.style)) for s in spans] == [
            Style.parse(listed.style)
        ], status
