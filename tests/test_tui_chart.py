"""The loss chart (LossPlot) and the Compare screen, driven by Pilot over real run directories
(events in the trainer's schema, ingested by the agent's Store), and as SVG snapshots."""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import Static

from tests.conftest import until
from tunedeck.core.rundir import RunDir, write_json_atomic
from tunedeck.core.rundir.events import EventWriter
from tunedeck.core.store.store import Store
from tunedeck.tui.screens.compare import CompareScreen
from tunedeck.tui.widgets.lossplot import (
    fmt_value,
    Frame,
    LossPlot,
    RunSource,
    TraceView,
    Window,
    render_chart,
)


def curve(s: int) -> float:
    """A loss that falls from ~5 to ~1.5 with a deterministic wiggle."""
    return 1.5 + 3.5 * math.exp(-s / 150) + 0.08 * math.sin(s * 1.3)


def write_run(
    path: Path,
    steps: int,
    loss=curve,
    eval_every: int = 50,
    spike: dict | None = None,
    ingest: bool = True,
    first: int = 1,
) -> RunDir:
    run = RunDir(path)
    run.path.mkdir(parents=True, exist_ok=True)
    w = EventWriter(run.path, 0)
    if first == 1:
        w.emit("start", world_size=1, max_steps=steps, restart=0, start_step=0)
    for s in range(first, first + steps):
        value = (spike or {}).get(s, loss(s))
        w.emit(
            "step",
            step=s,
            loss=value,
            lr=3e-4 * min(1.0, s / 100),
            grad_norm=0.8 + 0.3 * math.cos(s / 40),
            tokens=512,
            step_s=0.1,
            data_wait_s=0.001,
            compute_s=0.05,
            mem_gib=1.0,
            tokens_per_s=5120.0,
            epoch=0,
            mfu=None,
        )
        if eval_every and s % eval_every == 0:
            w.emit("eval", step=s, eval_loss=value + 0.2, eval_tokens=64)
    w.close()
    if ingest:
        with Store(run, write=True) as agent:
            while agent.ingest():
                pass
    return run


class ChartApp(App):
    def __init__(self, source, **kw):
        super().__init__()
        self.source = source
        self.kw = kw

    def compose(self):
        yield LossPlot(self.source, id="plot", **self.kw)


async def settled(pilot, plot: LossPlot):
    await until(pilot, lambda: plot.up_to_date)
    await pilot.pause()


def plot_rows(plot: LossPlot) -> list[str]:
    """The plot area's rows (no header, no x axis), y labels cut off."""
    lines = plot.rendered_text().split("\n")[1:-2]
    cut = lines[0].index("│") if "│" in lines[0] else lines[0].index("┤")
    return [ln[cut + 1 :] for ln in lines]


def header(plot: LossPlot) -> str:
    return plot.rendered_text().split("\n")[0]


def x_labels(plot: LossPlot) -> str:
    return plot.rendered_text().split("\n")[-1]


# -- keys ------------------------------------------------------------------------------


async def test_zoom_pan_home_change_what_is_drawn(tmp_path):
    run = write_run(tmp_path / "run", 1000)
    app = ChartApp(run.path)
    async with app.run_test(size=(100, 24)) as pilot:
        plot = app.query_one(LossPlot)
        await settled(pilot, plot)
        assert plot.view is None and plot.extent == (1, 1000)
        assert "all 1,000 steps" in header(plot)
        whole = plot.rendered_text()
        assert "1000" in x_labels(plot)
        # zoom in at the end (the view shows the newest step, so it stays there)
        await pilot.press("plus")
        assert plot.view == (501, 1000)
        await settled(pilot, plot)
        steps = plot.windows[0].steps
        assert (steps["start"], steps["end"]) == (501, 1000)  # re-queried for the window
        assert min(steps["step"]) == 501 and sum(steps["n"]) == 500
        assert "steps 501–1,000 of 1,000" in header(plot) and "following" in header(plot)
        assert plot.rendered_text() != whole
        assert "200" not in x_labels(plot).split() and "600" in x_labels(plot).split()
        # pan left a quarter: no longer at the end
        await pilot.press("h")
        assert plot.view == (376, 875) and not plot.following
        await settled(pilot, plot)
        assert "steps 376–875" in header(plot) and "following" not in header(plot)
        assert "400" in x_labels(plot).split()
        await pilot.press("h")
        assert plot.view == (251, 750)
        # pan right stops at the run's end
        for _ in range(4):
            await pilot.press("l")
        assert plot.view == (501, 1000) and plot.following
        await pilot.press("plus", "plus", "plus", "plus", "plus", "plus", "plus")
        assert plot.view == (991, 1000)  # never narrower than MIN_SPAN steps
        await settled(pilot, plot)
        assert plot.windows[0].steps["step"] == list(range(991, 1001))
        await pilot.press("minus")
        assert plot.view == (981, 1000)
        await pilot.press("0")  # home: the whole run
        assert plot.view is None
        await settled(pilot, plot)
        assert plot.rendered_text() == whole


async def test_log_y_and_the_eval_lr_grad_toggles(tmp_path):
    run = write_run(tmp_path / "run", 600, loss=lambda s: 1 + 99 * math.exp(-s / 30))
    app = ChartApp(run.path)
    async with app.run_test(size=(100, 30)) as pilot:
        plot = app.query_one(LossPlot)
        await settled(pilot, plot)
        linear = plot.rendered_text()
        labels = [ln.split("┤")[0].strip() for ln in linear.split("\n") if "┤" in ln]
        assert {"20", "40"} <= set(labels) and "5" not in labels  # evenly spaced
        # most of the curve sits on the bottom rows in linear y; log y spreads it out
        rows = plot_rows(plot)
        low_linear = sum(1 for r in rows[-4:] for ch in r if ch != " ")
        await pilot.press("y")
        assert plot.log_y
        logged = plot.rendered_text()
        labels = [ln.split("┤")[0].strip() for ln in logged.split("\n") if "┤" in ln]
        assert {"2", "5", "10", "50"} <= set(labels) and "40" not in labels  # 1-2-5 per decade
        assert "log y" in header(plot)
        assert sum(1 for r in plot_rows(plot)[-4:] for ch in r if ch != " ") < low_linear
        await pilot.press("y")
        assert plot.rendered_text() == linear
        # eval loss: ◆ markers, off with t
        assert "◆" in "".join(plot_rows(plot))
        await pilot.press("t")
        assert not plot.show_eval and "◆" not in plot.rendered_text()
        await pilot.press("t")
        # learning rate and grad norm are fetched on demand, each drawn in a strip of its
        # own under the loss with its own labelled axis: max, name, min
        assert "lr" not in plot.windows[0].steps
        await pilot.press("r")
        await settled(pilot, plot)

        def gutter(text: str) -> list[str]:
            return [re.split("[│┤├]", ln, maxsplit=1)[0].strip() for ln in text.split("\n")[1:-2]]

        assert "lr" in plot.windows[0].steps
        lr_axis = gutter(plot.rendered_text())
        assert lr_axis[-5:] == ["3.0e-4", "", "lr", "", "3.0e-6"], lr_axis
        assert "lr" not in header(plot)  # the axis says it; the legend keeps its room
        await pilot.press("g")
        await settled(pilot, plot)
        axes = gutter(plot.rendered_text())
        assert plot.show_grad and axes[-10:] == lr_axis[-5:] + ["1.1", "", "grad", "", "0.5"]
        # the loss keeps its own ticks above the strips, on the rows left to it
        assert {"20", "40"} <= set(axes[:-10])
        with_both = plot.rendered_text()
        await pilot.press("r", "g")
        await settled(pilot, plot)
        assert "lr" not in plot.windows[0].steps and plot.rendered_text() != with_both
        assert plot.rendered_text() == linear


async def test_the_cursor_reads_every_series_at_its_step_and_smoothing_is_a_weight(tmp_path):
    # 150 steps on a 100-column plot: one step a bucket, so the readout is the step's own
    run = write_run(tmp_path / "run", 150, eval_every=10)
    app = ChartApp(run.path)
    async with app.run_test(size=(100, 24)) as pilot:
        plot = app.query_one(LossPlot)
        plot.focus()
        await settled(pilot, plot)
        assert "━ EMA 0.6" in header(plot) and plot.smoothing == 0.6
        await pilot.press("left")  # the cursor appears on the newest step
        await settled(pilot, plot)
        assert plot.cursor == 150
        head = header(plot)
        lr, grad = 3e-4, 0.8 + 0.3 * math.cos(150 / 40)
        assert head.startswith(f"▏step 150  loss {fmt_value(curve(150))}  EMA(0.6) ")
        assert f"eval {fmt_value(curve(150) + 0.2)} @150" in head
        assert f"lr {fmt_value(lr)}" in head and f"grad {fmt_value(grad)}" in head
        rows = plot.rendered_text().split("\n")[1:-2]
        assert sum(row[-1] == "│" for row in rows) >= 3  # the cursor's column, the last
        await pilot.press(*["left"] * 5)  # a cell (2 steps) a press
        assert plot.cursor == 140
        assert header(plot).startswith(f"▏step 140  loss {fmt_value(curve(140))}")
        # no smoothing: the EMA is the loss itself; the most: it lags far behind the fall
        await pilot.press(*["comma"] * 6)
        assert plot.smoothing == 0.0
        assert f"EMA(0) {fmt_value(curve(140))}" in header(plot)
        flat = plot.rendered_text()
        await pilot.press(*["full_stop"] * 9)
        assert plot.smoothing == 0.99
        ema = float(header(plot).split("EMA(0.99) ")[1].split()[0])
        assert ema > curve(140) + 0.5
        await pilot.press("c")
        assert plot.cursor is None and "━ EMA 0.99" in header(plot)
        assert plot.rendered_text() != flat
        # a click puts the cursor on the step under the pointer
        axis = plot.rendered_text().split("\n")[-2]
        left = axis.index("└") + 1
        await pilot.click(LossPlot, offset=(left + (100 - left) // 2, 8))
        assert plot.cursor == pytest.approx(75, abs=2)


async def test_a_single_spike_survives_the_whole_run_view(tmp_path):
    run = write_run(tmp_path / "run", 20000, eval_every=0, spike={15001: 30.0})
    app = ChartApp(run.path)
    async with app.run_test(size=(80, 20)) as pilot:
        plot = app.query_one(LossPlot)
        await settled(pilot, plot)
        assert "eval" not in header(plot)  # a run without eval has no eval in the legend
        rows = plot_rows(plot)
        top = [i for i, ch in enumerate(rows[0]) if ch != " "]
        assert len(top) == 1  # one column reaches the top: the spike's
        assert top[0] == pytest.approx(15001 / 20000 * len(rows[0]), abs=1.5)
        # panned and zoomed, the spike stays in view as long as its step is in the window
        await pilot.press("plus", "plus")
        await settled(pilot, plot)
        assert plot.view == (15001, 20000)
        assert [i for i, ch in enumerate(plot_rows(plot)[0]) if ch != " "] == [0]
        await pilot.press("l")  # at the end already: nothing moves
        await pilot.press("h", "h", "h", "h", "h", "h", "h", "h")
        await settled(pilot, plot)
        assert plot.view == (5001, 10000)  # panned off it: the y axis is the curve's
        assert max(plot.windows[0].steps["loss_max"]) < 2
        labels = [ln.split("┤")[0] for ln in plot.rendered_text().split("\n") if "┤" in ln]
        assert max(float(x) for x in labels) < 2


async def test_the_view_follows_a_live_run(tmp_path):
    run = write_run(tmp_path / "run", 400)
    app = ChartApp(run.path)
    async with app.run_test(size=(90, 20)) as pilot:
        plot = app.query_one(LossPlot)
        await settled(pilot, plot)
        await pilot.press("plus")
        assert plot.view == (201, 400)
        await settled(pilot, plot)
        # the trainer writes on; the agent has not ingested it yet (the reader reads the tail)
        write_run(run.path, 100, first=401, ingest=False)
        plot.refresh_data()
        await settled(pilot, plot)
        assert plot.extent == (1, 500) and plot.view == (301, 500)
        assert "steps 301–500 of 500" in header(plot)
        # panned away from the end: new steps leave the view where it is
        await pilot.press("h")
        assert plot.view == (251, 450)
        write_run(run.path, 50, first=501, ingest=False)
        plot.refresh_data()
        await settled(pilot, plot)
        assert plot.extent == (1, 550) and plot.view == (251, 450)
        await pilot.press("end")
        await settled(pilot, plot)
        assert plot.view == (351, 550) and plot.following
        # the whole-run view grows with the run
        await pilot.press("0")
        write_run(run.path, 50, first=551)
        plot.refresh_data()
        await settled(pilot, plot)
        assert plot.view is None and plot.extent == (1, 600)
        assert "all 600 steps" in header(plot)


async def test_queries_run_off_the_event_loop(tmp_path):
    """A slow fetch (a slow filesystem) runs in a worker thread: keys still work meanwhile,
    and a burst of requests is served by one answer to the newest."""
    run = write_run(tmp_path / "run", 300)
    real = RunSource(run.path)
    calls: list[tuple] = []
    gate = threading.Event()

    def slow(start, end, buckets, metrics) -> Window:
        calls.append((threading.current_thread() is threading.main_thread(), start, end))
        if buckets:
            gate.wait(5)
        return real(start, end, buckets, metrics)

    app = ChartApp(slow)
    async with app.run_test(size=(80, 20)) as pilot:
        plot = app.query_one(LossPlot)
        await pilot.pause(0.2)
        assert not plot.loaded and "reading…" in plot.rendered_text()
        await pilot.press("y")  # the event loop is free while the query waits
        assert plot.log_y
        for _ in range(5):
            plot.refresh_data()
        gate.set()
        await settled(pilot, plot)
        assert plot.loaded and calls and not any(main for main, _, _ in calls)
        windows = [c for c in calls if c[1] is not None]
        assert len(windows) <= 3  # not one query per request
    real.close()


async def test_no_steps_yet_and_a_missing_run(tmp_path):
    RunDir(tmp_path / "empty").create()
    app = ChartApp(tmp_path / "empty")
    async with app.run_test(size=(80, 12)) as pilot:
        plot = app.query_one(LossPlot)
        await settled(pilot, plot)
        assert "no steps yet" in plot.rendered_text()
        await pilot.press("plus", "h", "0", "y")  # nothing to zoom: no error
        assert plot.view is None

    def broken(*args):
        raise OSError("disk gone")

    app = ChartApp(broken)
    async with app.run_test(size=(80, 12)) as pilot:
        plot = app.query_one(LossPlot)
        await settled(pilot, plot)
        assert "cannot read the run: disk gone" in plot.rendered_text()


def test_render_from_buckets_is_pure_and_fast():
    """The drawing takes decimated buckets only: 1M steps in 300 buckets draw like 300."""
    n = 306
    width = 1_000_000 // n
    steps = {
        "first": 1,
        "last": 1_000_000,
        "step": [1 + i * width for i in range(n)],
        "step_max": [(i + 1) * width for i in range(n)],
        "n": [width] * n,
        "nan": [0] * n,
        "loss": [2.0 + 0.4 / (1 + i) for i in range(n)],
        "loss_min": [1.9] * n,
        "loss_max": [2.5] * n,
    }
    steps["loss_max"][200] = 40.0
    frame = Frame(
        1, 1_000_000, 1_000_000, [TraceView("loss", "#5fafff", Window(steps, {"first": None}))]
    )
    t = time.perf_counter()
    lines = render_chart(frame, 160, 48)
    took = time.perf_counter() - t
    assert len(lines) == 48 and all(sum(len(s.text) for s in ln) == 160 for ln in lines)
    top = "".join(s.text for s in lines[1])
    assert sum(1 for ch in top[7:] if ch != " ") == 1  # the spike, and only it
    assert "1M" in "".join(s.text for s in lines[-1])
    assert took < 0.5  # ~6 ms measured (bench/tui_chart.py); generous for a loaded CI box


# -- Compare -----------------------------------------------------------------------------

RUNS = (
    ("20260101-000000-aaaa", "lora-r16", 400, 1.0),
    ("20260101-000000-bbbb", "lora-r64", 300, 0.85),
    ("20260101-000000-cccc", "full-ft", 250, 1.15),
)


def make_registry(home: Path) -> None:
    for i, (run_id, name, steps, scale) in enumerate(RUNS):
        run = write_run(
            home / "runs" / run_id, steps, loss=lambda s, k=scale: k * curve(s), ingest=i != 2
        )  # the last one: the reader reads the file
        write_json_atomic(
            run.state,
            {
                "run_id": run_id,
                "name": name,
                "status": "succeeded",
                "created": 1.7e9 + i,
                "progress": {
                    "step": steps,
                    "max_steps": steps,
                    "loss": round(scale * curve(steps), 4),
                },
            },
        )


class CompareApp(App):
    def __init__(self, run_ids):
        super().__init__()
        self.run_ids = run_ids
        self.refresh_s = 60.0  # the tests refresh by hand

    def on_mount(self):
        self.push_screen(CompareScreen(self.run_ids))


async def compare_ready(pilot):
    screen = pilot.app.screen
    plot = screen.query_one(LossPlot)
    legend = screen.query_one("#compare-legend", Static)
    await until(pilot, lambda: plot.up_to_date and "reading" not in str(legend.render()))
    await pilot.pause()


async def test_compare_overlays_runs_with_a_legend(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    make_registry(tmp_path / "home")
    ids = [r[0] for r in RUNS] + ["nope"]
    app = CompareApp(ids)
    async with app.run_test(size=(120, 30)) as pilot:
        await compare_ready(pilot)
        screen = app.screen
        plot = screen.query_one(LossPlot)
        assert [t.label for t in plot.traces] == ids and len(set(screen.run_colors)) == 4
        assert plot.extent == (1, 400)  # the longest run sets the whole view
        assert [sum(w.steps["n"]) if w else None for w in plot.windows] == [400, 300, 250, None]
        legend = str(screen.query_one("#compare-legend", Static).render()).split("\n")
        assert legend[0] == (
            "━━ lora-r16  succeeded  step 400/400  loss 1.6634  best eval "
            "1.8634  20260101-000000-aaaa"
        )
        assert "best eval" in legend[1] and "full-ft" in legend[2]
        assert legend[3] == "━━ nope  not found"
        head = header(plot)
        assert all(r[0] in head for r in RUNS[:1])
        # the chart's keys work on the screen; lr and grad norm are one run's, not offered
        await pilot.press("plus")
        assert plot.view == (201, 400)
        await settled(pilot, plot)
        assert [sum(w.steps["n"]) if w else None for w in plot.windows] == [200, 100, 50, None]
        assert [w.steps["first"] if w else None for w in plot.windows] == [1, 1, 1, None]
        assert not plot.check_action("toggle", ("show_lr",))
        await pilot.press("r")
        assert not plot.show_lr
        await pilot.press("0")
        assert plot.view is None
        await settled(pilot, plot)

        def dots() -> int:
            return sum(1 for ch in "".join(plot_rows(plot)) if "\u2800" < ch <= "\u28ff")

        # overlaid runs show their smoothed lines; smoothing 0 brings the raw curves back
        smooth = dots()
        await pilot.press(*["comma"] * 6)
        assert plot.smoothing == 0 and dots() > smooth
        await pilot.press("left")
        # the cursor reads every run at its step
        assert header(plot).startswith(f"▏step 400  {RUNS[0][0]}  loss 1.66  EMA(0) 1.66")
        assert f"{RUNS[1][0]}  loss " in header(plot)
        await pilot.press("escape")
        assert not isinstance(app.screen, CompareScreen)


async def test_compare_closes_its_stores_only_after_a_legend_read_in_flight(tmp_path, monkeypatch):
    """The screen leaves while its legend worker is inside a run.db read: the connections
    close after that read, never under it (closing one mid-query crashed the whole TUI with a
    segfault in eval_series)."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    make_registry(tmp_path / "home")
    app = CompareApp([r[0] for r in RUNS])
    held, open_after = threading.Event(), []
    real = Store.eval_series

    def slow(store, *a, **kw):
        screen = app.screen
        if hold.is_set() and not held.is_set() and store in getattr(screen, "_stores", {}).values():
            held.set()
            time.sleep(0.5)  # the screen is popped meanwhile
            open_after.append(store.db is not None)
        return real(store, *a, **kw)

    hold = threading.Event()
    monkeypatch.setattr(Store, "eval_series", slow)
    async with app.run_test(size=(120, 30)) as pilot:
        await compare_ready(pilot)
        screen = app.screen
        hold.set()
        screen.load_legend()
        await until(pilot, held.is_set, timeout=10, what="the legend read")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, CompareScreen))
        await until(pilot, lambda: open_after, timeout=10, what="the legend read's end")
        assert open_after == [True]
        assert not screen._stores  # closed and let go
        # a chart fetch that outlives the screen opens no new connection
        assert all(s._store is None for s in screen._sources)
        with pytest.raises(RuntimeError, match="closed"):
            screen._sources[0](None, None, 1, ("loss",))


async def test_compare_aligns_by_tokens_seen(tmp_path, monkeypatch):
    """Run b trains on two ranks (twice the tokens a step): by steps it ends halfway along
    run a; by tokens seen both end at the same place."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    ids = ("20260101-000000-aaaa", "20260101-000000-bbbb")
    write_run(home / "runs" / ids[0], 400, eval_every=0)
    b = write_run(home / "runs" / ids[1], 200, eval_every=0, ingest=False)
    w = EventWriter(b.path, 1)  # rank 1: the same 512 tokens a step as rank 0
    for s in range(1, 201):
        w.emit("step", step=s, loss=curve(s), tokens=512, step_s=0.1)
    w.close()
    with Store(b, write=True) as agent:
        while agent.ingest():
            pass
    for i, run_id in enumerate(ids):
        write_json_atomic(
            home / "runs" / run_id / "state.json",
            {"run_id": run_id, "name": run_id[-4:], "status": "succeeded", "created": 1.7e9 + i},
        )
    app = CompareApp(list(ids))
    async with app.run_test(size=(120, 30)) as pilot:
        await compare_ready(pilot)
        plot = app.screen.query_one(LossPlot)
        assert plot.extent == (1, 400) and "all 400 steps" in header(plot)
        await pilot.press("a")
        await settled(pilot, plot)
        assert plot.x_unit == "tokens"
        assert [w.steps["last"] for w in plot.windows] == [400 * 512, 200 * 1024]
        assert plot.extent == (512, 204_800) and "all 205k tokens" in header(plot)
        # the cursor reads both runs at the same number of tokens
        await pilot.press("left")
        head = header(plot)
        assert head.startswith("▏205k tokens") and all(f"{i}  loss" in head for i in ids), head
        await pilot.press("a")
        await settled(pilot, plot)
        assert plot.x_unit == "steps" and plot.extent == (1, 400) and plot.cursor is None


# -- snapshots ---------------------------------------------------------------------------


@pytest.fixture
def snapshot_run(tmp_path):
    return write_run(tmp_path / "run", 2000, eval_every=100, spike={1400: 7.5})


async def chart_ready(pilot):
    await settled(pilot, pilot.app.query_one(LossPlot))


@pytest.mark.parametrize("size", [(80, 24), (160, 48), (120, 40), (240, 67)])
def test_snapshot_chart(snap_compare, snapshot_run, size):
    assert snap_compare(ChartApp(snapshot_run.path), terminal_size=size, run_before=chart_ready)


def test_snapshot_chart_zoomed_log_lr_grad(snap_compare, snapshot_run):
    async def zoom(pilot):
        await chart_ready(pilot)
        await pilot.press("plus", "plus", "h", "y", "r", "g", "full_stop")
        await pilot.press(*["left"] * 20)
        await chart_ready(pilot)

    assert snap_compare(ChartApp(snapshot_run.path), terminal_size=(160, 48), run_before=zoom)


@pytest.mark.parametrize("size", [(80, 24), (160, 48), (120, 40), (240, 67)])
def test_snapshot_compare(snap_compare, tmp_path, monkeypatch, size):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    make_registry(tmp_path / "home")
    assert snap_compare(
        CompareApp([r[0] for r in RUNS]), terminal_size=size, run_before=compare_ready
    )


def test_the_readmes_chart_keys_are_the_charts_bindings():
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    part = text.split("the loss chart over the whole run")[1].split("findings with")[0]
    named = set(re.findall(r"`([^`]+)`", part)) - {"?"}
    names = {"←": "left", "→": "right", ",": "comma", ".": "full_stop", "+": "plus"}
    names["-"] = "minus"
    bound = {k for b in LossPlot.BINDINGS for k in b.key.split(",")}
    assert {names.get(k, k) for k in named} <= bound, named
    # and every key the chart shows in the footer is named there
    shown = {b.key.split(",")[0] for b in LossPlot.BINDINGS if b.show}
    assert shown <= {names.get(k, k) for k in named}


_ = asyncio  # pytest-asyncio runs the async tests (asyncio_mode = auto)


async def test_nan_losses_are_marked(tmp_path):
    run = write_run(tmp_path / "run", 200, spike={120: float("nan")})  # written as null
    app = ChartApp(run.path)
    async with app.run_test(size=(80, 16)) as pilot:
        plot = app.query_one(LossPlot)
        await settled(pilot, plot)
        top = plot_rows(plot)[0]
        assert top.count("×") == 1
        assert top.index("×") == pytest.approx(120 / 200 * len(top), abs=1.5)
        assert "× NaN loss" in header(plot)
