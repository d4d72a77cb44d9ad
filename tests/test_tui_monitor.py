"""The monitor's panes, driven by Textual's Pilot, and SVG snapshots of it.

Most tests read a run directory built here from fixed data (`build_run`): two H200 ranks
(telemetry through the real TelemetryStore on the real Store's connection, events in the
trainer's schema, findings through `Store.save_finding`), rank logs made of recorded NCCL
INFO output (tests/fixtures/h200/recorded/ddp2_nccl_info.log, split by process) and the recorded
watchdog timeout of tests/fixtures/h200/hung_rank. The snapshots use it at a fixed path, so
no temp path or wall-clock age reaches the screen. The prepare-failure and CPU tests run
the real agent.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from pathlib import Path

import pytest
from textual.widgets import Footer

from tests.conftest import DEMO, REPO, cli, cli_json, wait_for
from tests.conftest import until as _until
from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.rundir import RunDir
from tunedeck.core.store.store import Store
from tunedeck.core.views.watch import LogFileIndex, RankLog, RunWatcher
from tunedeck.tui.app import TunedeckApp
from tunedeck.tui.screens.confirm import ConfirmScreen
from tunedeck.tui.screens.help import HelpScreen
from tunedeck.tui.screens.monitor import MonitorScreen
from tunedeck.tui.widgets.findings import FindingScreen, FindingsList
from tunedeck.tui.widgets.hardware import HardwareView
from tunedeck.tui.widgets.logview import HIT_STYLE, LogView
from tunedeck.tui.widgets.lossplot import LossPlot
from tunedeck.tui.widgets.nccl import NcclView
from tunedeck.tui.widgets.progress import ProgressView
from tunedeck.tui.widgets.titlebar import TitleBar

RUN_ID = "20261130-130450-fx-monitor-7447"
FIXED_HOME = Path("/tmp/tunedeck-test-monitor-fixture")
T0 = 1796043570.0
NCCL_LOG = REPO / "tests" / "fixtures" / "h200" / "recorded" / "ddp2_nccl_info.log"
HUNG = REPO / "tests" / "fixtures" / "h200" / "hung_rank"
MESSAGE = (
    "torchrun exited with code 1: rank 0 (pid 801) failed after the NCCL watchdog "
    "timed out an ALLREDUCE (SeqNum=69, Timeout(ms)=20000) while rank 1 hung in its "
    "DataLoader; see the findings"
)


# -- the fixture run -----------------------------------------------------------------------


def _nccl_lines(pid: str) -> str:
    """One process's lines of the recorded NCCL INFO log (the shared checkout's)."""
    text = NCCL_LOG.read_text() if NCCL_LOG.exists() else ""
    return "".join(ln for ln in text.splitlines(True) if ln.startswith(f"vm:{pid}:"))


# the frozen spec of the fixture run (what a launch writes: a spec that loads)
FX_SPEC = """name = "fx-monitor"
backend = "builtin"
[model]
path = "Qwen/Qwen2.5-7B-Instruct"
[data]
path = "/data/chat.jsonl"
[train]
per_device_batch_size = 4
grad_accum = 2
learning_rate = 1e-4
"""


def build_run(home: Path, run_id: str = RUN_ID) -> Path:
    """A finished two-GPU run with NCCL logs, telemetry, events and findings: fixed data,
    so the same screen every time."""
    run = home / "runs" / run_id
    if run.exists():
        shutil.rmtree(run)
    rd = RunDir(run)
    rd.create()
    (run / "spec.toml").write_text(FX_SPEC)
    (run / "plan.json").write_text(
        json.dumps({"nproc_per_node": 2, "nnodes": 1, "world_size": 2, "nodes": []})
    )
    state = {
        "run_id": run_id,
        "name": "fx-monitor",
        "status": "failed",
        "message": MESSAGE,
        "created": T0 - 30,
        "started": T0,
        "ended": T0 + 600,
        "exit_code": 1,
        "host": "vm",
        "attempt": 0,
        "progress": {"step": 200, "max_steps": 1000, "loss": 1.4, "t": T0 + 590},
    }
    rd.write_state(state)
    # events: rank 1 waits for data, so the pane names it
    for rank in (0, 1):
        with open(rd.event_file(rank), "w") as f:
            f.write(
                json.dumps(
                    {"t": T0 + 5, "kind": "start", "rank": rank, "world_size": 2, "max_steps": 1000}
                )
                + "\n"
            )
            for step in range(1, 201):
                loss = 2.0 + 5.0 * math.exp(-step / 40) + 0.1 * math.sin(step / 3)
                wait = 0.002 if rank == 0 else 0.09
                f.write(
                    json.dumps(
                        {
                            "t": T0 + 10 + step * 2.5,
                            "kind": "step",
                            "rank": rank,
                            "step": step,
                            "epoch": step / 150,
                            "loss": round(loss, 4),
                            "lr": 1e-4,
                            "tokens": 8192,
                            "step_s": 0.3,
                            "data_wait_s": wait,
                            "mem_gib": 40.0,
                            "tokens_per_s": 27000.0,
                            "mfu": 0.412,
                        }
                    )
                    + "\n"
                )
                if step % 100 == 0 and rank == 0:
                    f.write(
                        json.dumps(
                            {
                                "t": T0 + 11 + step * 2.5,
                                "kind": "checkpoint",
                                "rank": 0,
                                "step": step,
                                "path": f"{run}/output/checkpoint-{step}",
                            }
                        )
                        + "\n"
                    )
    # rank logs: the recorded NCCL INFO lines of each process, steps, rank 0's watchdog
    att = rd.node_log_dir(0) / f"{run_id}_fx" / "attempt_0"
    hung_logs = sorted((HUNG / "logs" / "node0").glob("*/attempt_0"))[0]
    for rank, pid in ((0, "801"), (1, "802")):
        d = att / str(rank)
        d.mkdir(parents=True)
        steps = "".join(
            f"step {s}/1000 loss {2.0 + 5.0 * math.exp(-s / 40):.4f} lr 0.0001\n"
            for s in range(1, 201)
        )
        (d / "stdout.log").write_text(_nccl_lines(pid) + steps)
        (d / "stderr.log").write_text((hung_logs / str(rank) / "stderr.log").read_text())
    # run.db: findings and telemetry through the real Store
    with Store(rd, write=True) as store:
        store.save_finding(
            Finding(
                category="nccl_timeout",
                severity="error",
                summary="NCCL watchdog timed out an ALLREDUCE on rank 0 (waiting for rank 1)",
                cause="Rank 1 stopped calling collectives; rank 0 waited 20 s in the all-reduce "
                "and the watchdog took the process down.",
                fix="Find why rank 1 stopped (stack dump with d while it hangs); raise "
                "cluster.collective_timeout_s only for slow but progressing steps.",
                rank=0,
                evidence=[
                    "[rank0]:[E1130 13:05:52] Watchdog caught collective operation "
                    "timeout: WorkNCCL(SeqNum=69, OpType=ALLREDUCE)"
                ],
                t=T0 + 560,
                source="stderr.log:1",
            )
        )
        store.save_finding(
            Finding(
                category="dataloader_starvation",
                severity="warning",
                summary="rank 1 waits for data 30% of each step",
                cause="Rank 1's DataLoader cannot keep up; the GPU idles while it waits.",
                fix="Raise data.num_workers, enable pin_memory and persistent_workers.",
                rank=1,
                evidence=["data wait 0.090 s of 0.300 s per step (last 50 steps)"],
                t=T0 + 300,
            )
        )
        tel = store.telemetry
        for i in range(600):
            t = T0 + i
            gpus = []
            for g in (0, 1):
                util = 95.0 if g == 0 else (40.0 + 30 * math.sin(i / 20))
                gpus.append(
                    {
                        "gpu": g,
                        "t": t,
                        "util": util,
                        "mem_util": 30.0,
                        "mem_used_mib": 40000.0 + 50 * min(i, 200) + g * 1000,
                        "mem_total_mib": 143771.0,
                        "power_w": 300.0 + 3 * util,
                        "temp_c": 40.0 + util / 4,
                    }
                )
            tel.add("gpu", t, [(g["gpu"], g) for g in gpus])
            tel.add(
                "rank", t, [(r, {"cpu_pct": 100.0 - 30 * r, "rss_mib": 3000.0 + r}) for r in (0, 1)]
            )
            tel.add(
                "host",
                t,
                [(0, {"cpu_pct": 20.0, "mem_used_mib": 60000.0, "mem_total_mib": 257811.0})],
            )
        tel.set_latest(
            "status",
            T0,
            {
                "nvml": "ok",
                "message": "",
                "driver": "580.159.04",
                "gpus": ["NVIDIA H200", "NVIDIA H200"],
                "interval_s": 1.0,
            },
        )
        tel.set_latest("gpus", T0 + 599, gpus)
        tel.set_latest(
            "procs",
            T0 + 599,
            {
                "ranks": [],
                "procs": [],
                "gpu_procs": [
                    {"gpu": 0, "pid": 801, "mib": 40000, "rank": 0},
                    {"gpu": 1, "pid": 802, "mib": 41000, "rank": 1},
                ],
            },
        )
        tel.set_latest(
            "host",
            T0 + 599,
            {
                "cpu_pct": 20.0,
                "mem_used_mib": 60000.0,
                "mem_total_mib": 257811.0,
                "shm_free_mib": 128000.0,
            },
        )
        tel.flush_buckets()
    return run


@pytest.fixture
def fx_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    build_run(home)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    return home


def _ready(app) -> bool:
    """The monitor has shown every pane's data (log lines loaded, NCCL read)."""
    s = app.screen
    if not isinstance(s, MonitorScreen) or s.snap is None:
        return False
    from tunedeck.tui.widgets.lossplot import LossPlot

    view = s.query_one(LogView)
    plot = s.query_one(LossPlot)
    return (
        view.total > 0
        and any(view.visible_lines())
        and s.query_one(NcclView).ranks is not None
        and s.query_one(HardwareView).history is not None
        and plot.loaded
        and plot.up_to_date
    )


async def _open(pilot, app):
    await _until(pilot, lambda: _ready(app), what="the monitor's first data")
    await pilot.pause(0.1)
    return app.screen


# -- panes ---------------------------------------------------------------------------------


async def test_progress_pane_status_in_full_and_rates(fx_home):
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await _open(pilot, app)
        text = screen.query_one(ProgressView).text
        plain = re.sub(r"\[/?[^\]]*\]", "", text)
        # the reason is whole (wrapped by the widget, never cut), in the narrowest layout
        assert MESSAGE in plain
        assert "step 200/1000" in plain and "20%" in plain
        events = (fx_home / "runs" / RUN_ID / "events" / "rank0.jsonl").read_text()
        last = [e for e in map(json.loads, events.splitlines()) if e["kind"] == "step"][-1]
        assert "epoch 1.33" in plain and f"loss {last['loss']:.4f}" in plain
        assert "tokens/s 54.0k" in plain  # both ranks together
        assert "MFU 41.2%" in plain
        # rank 1 waits 0.09 s of every 0.3 s step; rank 0 0.002 s
        assert "data wait 15.3%" in plain and "worst rank 1 30.0%" in plain
        assert "ETA -" in plain and "elapsed 10:00" in plain  # ended: no ETA
        assert "checkpoint-200" in plain and str(fx_home) not in plain
        snap = screen.snap
        assert snap.progress.worst_wait == (1, pytest.approx(0.3))
        # the run's settings in the title, before the id (which a narrow terminal cuts)
        await _until(pilot, lambda: screen.facts.ranks, what="the run's settings")
        title = str(screen.query_one(TitleBar).content)
        assert title.startswith(
            "tunedeck · monitor · fx-monitor · Qwen2.5-7B-Instruct lora · 2 ranks × 1 node · "
            "batch 16 · lr 0.0001 · ddp · "
        ), title


async def test_hardware_pane_gpus_with_history(fx_home):
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open(pilot, app)
        hw = screen.query_one(HardwareView)
        text = hw.text
        assert "2× NVIDIA H200" in text and "driver 580.159.04" in text
        lines = text.splitlines()
        gpu0 = next(ln for ln in lines if ln.startswith("GPU0 r0"))
        gpu1 = next(ln for ln in lines if ln.startswith("GPU1 r1"))
        # latest sample: GPU0 busy at 95 %, GPU1 ~40 % (its sine at i = 599)
        util1 = 40.0 + 30 * math.sin(599 / 20)
        assert "95%" in gpu0 and "48.8G/140G" in gpu0 and "585W" in gpu0 and "64°C" in gpu0
        assert f"{util1:3.0f}%" in gpu1 and "49.8G/140G" in gpu1
        assert re.search(r"util █+ +95%", gpu0) and re.search(r"mem █+░+ 48.8G", gpu0)
        # the whole run's strips (10 minutes of 1 s samples)
        series = hw.history["gpu"]["series"]
        assert set(series) == {0, 1} and len(series[0]["util"]) > 100
        strip_lines = [ln for ln in lines if ln.rstrip().endswith("mem") and "util" in ln]
        assert len(strip_lines) == 2
        assert any(c in strip_lines[1] for c in "▁▂▃▄") and "█" in strip_lines[0]


async def test_log_rank_switch_search_and_first_error(fx_home):
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await _open(pilot, app)
        view = screen.query_one(LogView)
        # rank 0: stdout (its NCCL lines from pid 801, steps), then stderr
        assert view.state.rank == 0 and view.follow
        await pilot.press("e")  # the first error line: the watchdog's first E line
        await _until(pilot, lambda: view.cursor is not None, what="first error")
        assert "Watchdog caught collective operation timeout" in view.cache[view.cursor][0]
        assert view.cache[view.cursor][1] == RankLog.STDERR and not view.follow
        # search: every match highlighted, n/N move between them
        await pilot.press("slash")
        await pilot.press(*"via P2P")
        await pilot.press("enter")
        await _until(pilot, lambda: view.hits, what="search hits")
        assert len(view.hits) == 24  # rank 0 -> 1, one line per channel
        first = view.cursor
        assert "via P2P/CUMEM" in view.cache[first][0] and "vm:801:" in view.cache[first][0]
        await pilot.press("n")
        assert view.cursor == view.hits[(view.hits.index(first) + 1) % len(view.hits)]
        await pilot.press("N")
        assert view.cursor == first
        await pilot.pause(0.1)
        y = first - int(view.scroll_offset.y)
        strip = view.render_line(y)
        hl = [s for s in strip if s.style and s.style.bgcolor == HIT_STYLE.bgcolor]
        assert "".join(s.text for s in hl) == "via P2P", strip.text
        assert "/via P2P" in view.status()
        # with the loss plot focused, n and e are still the monitor's (the plot's own
        # toggles are t and g)
        plot = screen.query_one("#loss-plot")
        plot.focus()
        await pilot.pause()
        at, eval_on, grad_on = view.cursor, plot.show_eval, plot.show_grad
        await pilot.press("n")
        assert view.cursor == view.hits[(view.hits.index(at) + 1) % len(view.hits)]
        await pilot.press("e")
        await _until(
            pilot,
            lambda: "Watchdog caught" in view.cache[view.cursor][0],
            what="first error from the plot",
        )
        assert (plot.show_eval, plot.show_grad) == (eval_on, grad_on)
        await pilot.press("g", "t")
        assert (plot.show_eval, plot.show_grad) == (not eval_on, not grad_on)
        view.focus()
        # ]: rank 1's log (pid 802), and the search starts over
        await pilot.press("right_square_bracket")
        await _until(
            pilot, lambda: view.state.rank == 1 and any(view.visible_lines()), what="rank 1's log"
        )
        assert screen.query_one("#log-pane").border_title == "rank 1 log"
        assert view.query is None and not view.hits  # a search belongs to its log
        await pilot.press("g")
        await _until(
            pilot, lambda: view.visible_lines()[0].startswith("vm:802:"), what="rank 1's first line"
        )
        assert not any("vm:801:" in ln for ln in view.visible_lines())
        await pilot.press("left_square_bracket")
        await _until(pilot, lambda: view.state.rank == 0, what="back to rank 0")


async def test_log_follow_pauses_on_scroll_up_and_resumes(fx_home):
    run = fx_home / "runs" / RUN_ID
    stdout = next(run.glob("logs/node0/*/attempt_0/0/stdout.log"))
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.1)

    def append(tag: str, n: int = 30):
        with open(stdout, "a") as f:
            f.writelines(f"{tag} line {i}\n" for i in range(n))

    async with app.run_test(size=(100, 30)) as pilot:
        screen = await _open(pilot, app)
        view = screen.query_one(LogView)
        view.focus()
        append("A")
        await _until(
            pilot,
            lambda: "A line 29" in view.visible_lines()[-1:][0],
            what="following the new lines",
        )
        assert view.follow
        # scrolling up pauses: new lines come in below, the view stays where it was
        await pilot.press("pageup")
        await _until(pilot, lambda: not view.follow, what="paused")
        top = view.scroll_offset.y
        append("B")
        await _until(
            pilot,
            lambda: view.total and view.state and view.total >= 200 + 60,
            what="B lines indexed",
        )
        await pilot.pause(0.3)
        assert view.scroll_offset.y == top and not view.follow
        assert "paused" in view.status()
        # G resumes, and following goes on with later lines (it never sticks)
        await pilot.press("G")
        assert view.follow
        await _until(pilot, lambda: "B line 29" in view.visible_lines()[-1], what="B at end")
        for tag in ("C", "D", "E"):
            append(tag)
            await _until(
                pilot,
                lambda t=tag: f"{t} line 29" in view.visible_lines()[-1],
                what=f"{tag} at the end",
            )
        # scrolling back down to the bottom by hand resumes too
        await pilot.press("pageup")
        await _until(pilot, lambda: not view.follow, what="paused again")
        await pilot.press("end")
        assert view.follow
        append("F")
        await _until(pilot, lambda: "F line 29" in view.visible_lines()[-1], what="F at end")


async def test_nccl_pane_on_recorded_nccl_log(fx_home):
    if not NCCL_LOG.exists():
        pytest.skip(f"{NCCL_LOG} not present")
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open(pilot, app)
        view = screen.query_one(NcclView)
        text = view.text
        r0, r1 = text.split("\nrank 1 ")
        assert "NCCL 2.28.9+cuda13.0" in r0 and "net Socket (eth0)" in r0
        assert "IB none" in r0 and "24 coll / 32 p2p channels" in r0 and "GDR on" in r0
        assert re.search(r"→ rank 1\s+P2P\s+via P2P/CUMEM\s+24 channels", r0)
        # rank 0's watchdog timeout, highlighted as an error with its file and line
        assert "ERROR stderr.log:1" in r0 and "Watchdog caught collective" in r0
        rendered = view.render()
        err = [sp for sp in rendered.spans if "red" in str(sp.style)]
        assert err, "errors are highlighted"
        assert "→ rank 0" in r1 and "pid 802" in r1
        # maximised, the pane has the whole screen
        screen.query_one("#nccl-pane").focus()
        await pilot.press("m")
        assert screen.maximized is screen.query_one("#nccl-pane")
        await pilot.press("escape")
        assert screen.maximized is None and isinstance(app.screen, MonitorScreen)


async def test_findings_pane_and_evidence_one_key_away(fx_home):
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await _open(pilot, app)
        box = screen.query_one(FindingsList)
        assert [f["category"] for f in box.findings] == ["nccl_timeout", "dataloader_starvation"]
        assert "2, 1 error" in screen.query_one("#findings-pane").border_title
        prompt = str(box.get_option_at_index(0).prompt)
        assert "nccl_timeout rank 0" in prompt and "fix: Find why rank 1 stopped" in prompt
        box.focus()
        await pilot.press("down", "enter")
        await _until(
            pilot,
            lambda: isinstance(app.screen, FindingScreen) and app.screen.query("#finding-text"),
            what="details",
        )
        detail = str(app.screen.query_one("#finding-text").render())
        assert "dataloader_starvation" in detail and "rank 1" in detail
        assert "cause" in detail and "Raise data.num_workers" in detail
        assert "data wait 0.090 s of 0.300 s" in detail  # the evidence line
        await pilot.press("escape")
        await _until(pilot, lambda: isinstance(app.screen, MonitorScreen), what="back")
        await pilot.press("v")  # from any pane: the highlighted finding
        await _until(pilot, lambda: isinstance(app.screen, FindingScreen), what="v")


async def test_new_findings_appear_with_a_notice(fx_home):
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await _open(pilot, app)
        box = screen.query_one(FindingsList)
        assert len(box.findings) == 2 and not app._notifications
        with Store(fx_home / "runs" / RUN_ID, write=True) as store:
            store.save_finding(
                Finding(
                    category="straggler",
                    severity="warning",
                    summary="rank 1 computes 1.6x slower",
                    cause="slow GPU",
                    fix="check its clocks",
                    rank=1,
                    t=T0 + 400,
                )
            )
        await _until(pilot, lambda: len(box.findings) == 3, what="the new finding")
        # notify() posts a message: the toast lands on the app's next turn, not at once
        await _until(
            pilot,
            lambda: any("straggler" in n.message for n in app._notifications),
            what="the notice",
        )


async def test_tab_moves_between_panes_and_m_maximises(fx_home):
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await _open(pilot, app)
        order = []
        for _ in range(6):
            await pilot.press("tab")
            w = screen.focused
            while w is not None and not (w.id or "").endswith("-pane"):
                w = w.parent
            order.append(w.id if w is not None else None)
        # from the chart, where the monitor opens, in reading order round to it again
        assert order == [
            "hw-pane",
            "log-pane",
            "nccl-pane",
            "progress-pane",
            "findings-pane",
            "loss-pane",
        ]
        await pilot.press("m")
        assert screen.maximized is screen.query_one("#loss-pane")
        await pilot.pause()
        assert screen.query_one("#loss-pane").size.height >= 20
        await pilot.press("m")
        assert screen.maximized is None


async def test_loss_pane_charts_the_whole_run_and_zooms(fx_home):
    """The loss pane is the zoomable chart of the whole run from run.db; it refreshes with
    the monitor, and its keys act when it has focus."""
    from tunedeck.tui.widgets.lossplot import LossPlot

    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.1)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open(pilot, app)
        plot = screen.query_one("#loss-pane").query_one(LossPlot)
        await _until(pilot, lambda: plot.loaded and plot.extent is not None, what="the chart")
        first, last = plot.extent
        assert first <= 1 and last == screen.snap.progress.step  # the whole run
        plot.focus()
        await pilot.press("plus")
        await _until(pilot, lambda: plot.view is not None and plot.up_to_date, what="a zoomed view")
        lo, hi = plot.view
        assert hi - lo < last - first
        await pilot.press("0")
        await _until(pilot, lambda: plot.view is None, what="the whole run again")
        n = len(screen.show_s)
        await _until(pilot, lambda: len(screen.show_s) >= n + 3, what="refreshes go on")


async def test_the_chart_has_the_area_and_help_lists_the_focused_panes_keys(fx_home):
    app = TunedeckApp(open_run=RUN_ID, refresh_s=3600)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open(pilot, app)
        plot = screen.query_one(LossPlot)
        # the chart opens focused, with most of the middle of the screen
        assert screen.focused is plot
        assert plot.size.width >= 80 and plot.size.height >= 24  # 38x6 before
        footer = {k for k, (_, b, on, _) in app.screen.active_bindings.items() if on and b.show}
        assert {"plus", "left", "full_stop", "r", "s", "e"} <= footer
        await pilot.press("question_mark")
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        text = str(help_screen.query_one("#help-text").render())
        # the chart's keys first, under its pane's title, then the screen's; `[` is text
        assert text.index("loss (focused)") < text.index("←/→") < text.index("this screen")
        assert text.index("this screen") < text.index("Stop")
        assert "[ ]" in text and "Previous rank" in text and "[/b]" not in text
        for desc in ("Cursor", "Smoothing", "Less smoothing", "Pan left", "Log y", "Grad norm"):
            assert desc in text
        await pilot.press("escape")
        # the log band grows while it has focus
        before = screen.query_one(LogView).size.height
        screen.query_one(LogView).focus()
        await _until(pilot, lambda: screen.has_class("-log-focus"), what="the log's focus class")
        await _until(
            pilot, lambda: screen.query_one(LogView).size.height > before, what="a taller log"
        )
        await pilot.press("question_mark")
        text = str(app.screen.query_one("#help-text").render())
        assert text.index("rank 0 log (focused)") < text.index("this screen")


CHILD_ID = "20261130-131500-fx-monitor-resumed-1c2d"


def build_resumed(home: Path) -> Path:
    """A run resumed from the fixture run's checkpoint-100 (as `resume_spec` writes it: the
    parent's output folder, resume_from inside it), steps 101-300 on one rank."""
    parent = home / "runs" / RUN_ID
    run = home / "runs" / CHILD_ID
    if run.exists():
        shutil.rmtree(run)
    rd = RunDir(run)
    rd.create()
    (run / "spec.toml").write_text(
        f'name = "fx-monitor"\nbackend = "builtin"\n[run]\noutput_dir = "{parent}/output"\n'
        f'[train]\nresume_from = "{parent}/output/checkpoint-100"\n'
    )
    (run / "plan.json").write_text(json.dumps({"nproc_per_node": 1, "nnodes": 1, "nodes": []}))
    rd.write_state(
        {
            "run_id": CHILD_ID,
            "name": "fx-monitor",
            "status": "succeeded",
            "message": "finished",
            "created": T0 + 700,
            "started": T0 + 710,
            "ended": T0 + 1300,
            "exit_code": 0,
            "host": "vm",
            "attempt": 0,
            "progress": {"step": 300, "max_steps": 300, "loss": 1.1, "t": T0 + 1290},
        }
    )
    with open(rd.event_file(0), "w") as f:
        start = {"t": T0 + 715, "kind": "start", "rank": 0, "world_size": 1, "max_steps": 300}
        f.write(json.dumps(start | {"start_step": 100}) + "\n")
        for step in range(101, 301):
            loss = 2.0 + 5.0 * math.exp(-step / 40) - 0.8 * (step - 100) / 200
            f.write(
                json.dumps(
                    {"t": T0 + 720 + step, "kind": "step", "rank": 0, "step": step}
                    | {"loss": round(loss, 4), "lr": 5e-5, "tokens": 8192, "step_s": 0.3}
                )
                + "\n"
            )
    with Store(rd, write=True) as store:
        while store.ingest():
            pass
    return run


def _joined(app) -> bool:
    plot = app.screen.query_one(LossPlot)
    return (
        getattr(app.screen, "snap", None) is not None
        and app.screen.query_one(HardwareView).history is not None
        and len(plot.traces) == 2
        and plot.up_to_date
        and all(plot.windows)
    )


async def test_a_resumed_run_is_drawn_joined_to_the_run_it_resumed(fx_home):
    build_resumed(fx_home)
    app = TunedeckApp(open_run=CHILD_ID, refresh_s=3600)
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(pilot, lambda: _joined(app), what="the parent's curve")
        plot = app.screen.query_one(LossPlot)
        assert plot.traces[0].parent and plot.traces[0].label == RUN_ID and plot.runs == 1
        assert plot.extent == (1, 300)  # the whole story, not just steps 101-300
        text = plot.rendered_text()
        assert "all 300 steps" in text and "━ before the resume" in text
        # dots left of the resume (the parent's) and right of it (the run's own)
        rows = text.split("\n")[1:-2]
        axis = text.split("\n")[-2]
        left = axis.index("└") + 1
        resume_col = left + (100 * (len(axis) - left)) // 300
        assert any(r[left : resume_col - 2].strip() for r in rows)
        assert any(r[resume_col + 2 :].strip() for r in rows)
        # the cursor reads the parent before the resume and the run after it
        await pilot.press("left")
        await _until(pilot, lambda: plot.up_to_date, what="the readout")
        assert plot.cursor == 300 and RUN_ID not in header_of(plot)
        plot.cursor = 50
        plot.refresh()
        assert re.match(
            r"▏steps? (49–)?50  loss [\d.]+  EMA\(0.6\) [\d.]+  lr 1.0e-4", header_of(plot)
        )
        assert plot.size.width < 100 or f"in {RUN_ID}" in header_of(plot)


RDZV_ID = "20261130-132000-fx-rdzv-5e1a"
STOP_ID = "20261130-133000-fx-stopping-8b3c"
RDZV_LOG = REPO / "tests" / "corpus" / "recorded" / "rendezvous_timeout.log"


def build_rendezvous_failed(home: Path) -> Path:
    """A two-node run whose node 1 never came: torchrun gave up at the rendezvous, no rank
    started, so there are no rank logs or events; torchrun's log has the traceback."""
    run = home / "runs" / RDZV_ID
    if run.exists():
        shutil.rmtree(run)
    rd = RunDir(run)
    rd.create()
    (run / "spec.toml").write_text('name = "fx-rdzv"\nbackend = "builtin"\n')
    (run / "plan.json").write_text(json.dumps({"nproc_per_node": 2, "nnodes": 2, "nodes": []}))
    rd.write_state(
        {
            "run_id": RDZV_ID,
            "name": "fx-rdzv",
            "status": "failed",
            "message": "torchrun exited with code 1 before any rank started: the rendezvous "
            "timed out (node 1 never joined); see the findings",
            "created": T0 - 60,
            "started": T0,
            "ended": T0 + 35,
            "exit_code": 1,
            "host": "vm",
            "attempt": 0,
        }
    )
    rd.torchrun_log(0).parent.mkdir(parents=True, exist_ok=True)
    rd.torchrun_log(0).write_text(RDZV_LOG.read_text())
    with Store(rd, write=True) as store:
        store.save_finding(
            Finding(
                category="rendezvous_unreachable",
                severity="error",
                summary="rendezvous failed: nodes could not meet",
                cause="Not every node joined the rendezvous in time.",
                fix="Start all nodes with the same --nnodes, rdzv id and endpoint.",
                evidence=["torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"],
                t=T0 + 34,
                source="torchrun-node0.log",
            )
        )
    return run


def build_stopping(home: Path) -> Path:
    """The fixture run as it was mid-run, a graceful stop asked and not yet recorded."""
    run = build_run(home, STOP_ID)
    rd = RunDir(run)
    state = json.loads(rd.state.read_text())
    state.update(status="running", message="", ended=None, exit_code=None)
    state.update(name="fx-stopping", stop_requested="graceful")
    rd.write_state(state)
    return run


class _Clock:
    """The time module with a fixed `time()`: a running run's elapsed time and ETA on
    screen never move (snapshots)."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def time() -> float:
        return T0 + 620


async def test_a_run_that_failed_at_rendezvous_shows_torchruns_log_and_its_error(
    tmp_path, monkeypatch
):
    home = tmp_path / "home"
    build_rendezvous_failed(home)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    app = TunedeckApp(open_run=RDZV_ID, refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: _log_shown(app), what="the launcher's log")
        view = app.screen.query_one(LogView)
        assert "no output from rank 0: torchrun-node0.log" in view.status()
        assert view.total == len(RDZV_LOG.read_text().splitlines())
        await pilot.press("e")  # the first error is there, not nowhere
        await _until(pilot, lambda: view.cursor is not None, what="first error")
        assert view.cache[view.cursor][0].startswith("Traceback")


def _log_shown(app) -> bool:
    s = app.screen
    if not isinstance(s, MonitorScreen) or s.snap is None:
        return False
    view = s.query_one(LogView)
    return (
        view.total > 0
        and any(view.visible_lines())
        and s.query_one(HardwareView).history is not None
        and s.query_one(LossPlot).up_to_date
    )


def header_of(plot) -> str:
    return plot.rendered_text().split("\n")[0]


async def test_readonly_hides_stop_and_kill(fx_home):
    app = TunedeckApp(open_run=RUN_ID, readonly=True, refresh_s=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open(pilot, app)
        assert screen.check_action("stop", ()) is False
        assert screen.check_action("kill", ()) is False
        assert screen.check_action("stacks", ()) is True
        footer = str(app.screen.query_one(Footer).screen.active_bindings)
        assert "'s'" not in footer and "'K'" not in footer
        titles = [t for t, _, _ in screen.commands()]
        assert "Stop" not in titles and "Kill" not in titles and "Find" in titles
        for key in ("s", "K"):
            await pilot.press(key)
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        help_text = str(app.screen.query_one("#help-text").render())
        assert "Stop" not in help_text and "Kill" not in help_text and "Find" in help_text
    # without --readonly both are there
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await _open(pilot, app)
        assert screen.check_action("stop", ()) and screen.check_action("kill", ())
        assert {"Stop", "Kill"} <= {t for t, _, _ in screen.commands()}


async def test_preparation_failure_shows_as_a_finding_with_its_fix(td_home, monkeypatch):
    missing = "/nonexistent/tunedeck-test/" + "very-long-folder-name/" * 4 + "train.jsonl"
    # (a launch checks the data first; the file may still vanish before the agent starts)
    run_id = cli_json(
        "launch", str(DEMO), "--no-preflight", "--set", f"data.path={missing}", home=td_home
    )["run_id"]
    st = wait_for(
        lambda: (s := cli_json("status", run_id, home=td_home))["status"] == "failed" and s,
        60,
        "the failed preparation",
    )
    assert missing in st["message"]
    # the agent stored it: `tunedeck diagnose` names it with the fix
    out = cli("diagnose", run_id, home=td_home).stdout
    assert "data_missing" in out and "Point data.path at an existing JSONL file" in out
    app = TunedeckApp(open_run=run_id, refresh_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(
            pilot,
            lambda: (
                isinstance(app.screen, MonitorScreen)
                and app.screen.snap is not None
                and app.screen.query_one(FindingsList).findings
            ),
            what="the finding in the monitor",
        )
        screen = app.screen
        [f] = screen.query_one(FindingsList).findings
        assert f["category"] == "data_missing" and missing in f["summary"]
        assert "Point data.path" in f["fix"]
        assert f["evidence"][0].startswith("FileNotFoundError")
        # the status line keeps the whole path at 80 columns (wrapped, not cut)
        plain = re.sub(r"\[/?[^\]]*\]", "", screen.query_one(ProgressView).text)
        assert missing in plain.replace("\n", "")
        assert screen.query_one(LogView).total == 0  # no rank ever started
        await pilot.press("v")
        await _until(
            pilot,
            lambda: isinstance(app.screen, FindingScreen) and app.screen.query("#finding-text"),
            what="details",
        )
        detail = str(app.screen.query_one("#finding-text").render())
        assert "FileNotFoundError" in detail and "Point data.path" in detail


async def test_cpu_demo_shows_per_rank_cpu_and_rss(finished_demo, monkeypatch):
    home, run_id, _ = finished_demo
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    app = TunedeckApp(open_run=run_id, refresh_s=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await _until(
            pilot,
            lambda: (
                isinstance(app.screen, MonitorScreen)
                and app.screen.snap is not None
                and app.screen.query_one(HardwareView).history is not None
            ),
            what="the monitor",
        )
        hw = app.screen.query_one(HardwareView)
        text = hw.text
        assert "no GPU telemetry" in text and "NVML:" in text
        # the run ended: each rank from the run's history, with CPU and RSS strips
        assert "rank 0" in text and "rank 1" in text
        strips = [ln for ln in text.splitlines() if ln.rstrip().endswith("rss")]
        assert len(strips) == 2 and all(any(c in ln for c in "▁▂▃▄▅▆▇█") for ln in strips)
        assert set(hw.history["rank"]["series"]) == {0, 1}


# -- stack dumps in their own view ---------------------------------------------------------


async def test_stacks_view_labels_the_rank_others_wait_for(fx_home):
    from tunedeck.core.supervisor.stacks import StackDump
    from tunedeck.tui.screens.stacks import StacksScreen

    dumps = [
        StackDump(
            0,
            801,
            "faulthandler",
            'Thread 0x7f (most recent call first):\n  File "trainer.py", line 60 '
            "in all_reduce_result",
        ),
        StackDump(
            1,
            802,
            "faulthandler",
            'Current thread 0x7e (most recent call first):\n  File "faults.py", '
            "line 30 in _test_hang",
        ),
    ]
    app = TunedeckApp(open_run=RUN_ID, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open(pilot, app)
        app.push_screen(StacksScreen(dumps))
        await _until(
            pilot,
            lambda: isinstance(app.screen, StacksScreen) and app.screen.query("#stacks-text"),
            what="stacks",
        )
        text = str(app.screen.query_one("#stacks-text").render())
        assert "rank 0 (pid 801, faulthandler): waiting in a collective" in text
        assert "rank 1 (pid 802, faulthandler): NOT in a collective" in text
        summary = str(app.screen.query_one("#stacks-summary").render())
        assert "rank 1" in summary and "the others wait for it" in summary
        await pilot.press("escape")
        await _until(pilot, lambda: isinstance(app.screen, MonitorScreen), what="closed")


# -- the log index (core/views/watch.py) ----------------------------------------------------


def test_log_index_reads_any_window_without_reading_the_file(tmp_path):
    import random

    rng = random.Random(7)
    lines = [f"L{i} " + "x" * rng.choice([0, 5, 80, 400, 3000]) for i in range(60000)]
    lines[777] = "y" * 300_000  # one very long line
    path = tmp_path / "stdout.log"
    path.write_text("\n".join(lines) + "\nhalf a line")
    ix = LogFileIndex(path)
    assert ix.update(max_bytes=1 << 20) > 0 and ix.lines < len(lines)  # a slice at a time
    while ix.scanned < path.stat().st_size:
        ix.update(max_bytes=1 << 20)
    assert ix.lines == len(lines)  # the unterminated line waits
    size = path.stat().st_size
    assert len(ix.cp_line) < size // (32 << 10)  # sparse: ~one checkpoint per 64 kB
    scanned = ix.bytes_read
    for _ in range(300):
        start, n = rng.randrange(len(lines)), rng.randint(1, 60)
        assert ix.read(start, n) == [ln[:4000] for ln in lines[start : start + n]]
    # a window costs about its own bytes plus the distance to a checkpoint, never the file
    before = ix.bytes_read
    ix.read(50000, 40)
    assert ix.bytes_read - before < 256 << 10
    assert ix.bytes_read - scanned < 300 * (400 << 10)
    assert ix.find(re.compile(rb"^L4242 ", re.M), 10) == [4242]
    with open(path, "a") as f:
        f.write(" now whole\nnext\n")
    assert ix.update() == 2 and ix.read(len(lines), 2) == ["half a line now whole", "next"]
    path.write_text("short\n")  # truncated: start over
    assert ix.update() == -1 and ix.update() == 1 and ix.read(0, 1) == ["short"]


def test_rank_log_orders_stdout_and_stderr_as_they_arrive(tmp_path):
    d = tmp_path / "run" / "logs" / "node0" / "x_1" / "attempt_0" / "0"
    d.mkdir(parents=True)
    out, err = d / "stdout.log", d / "stderr.log"
    out.write_text("o1\no2\n")
    err.write_text("e1\n")
    log = RankLog(RunDir(tmp_path / "run"), 0)
    st = log.update()
    # what was there before the view: all of stdout, then all of stderr
    assert st.total == 3 and log.lines(0, 3) == [("o1", 0), ("o2", 0), ("e1", 1)]
    with open(err, "a") as f:
        f.write("e2\nTraceback (most recent call last):\n")
    with open(out, "a") as f:
        f.write("o3\n")
    log.update()
    # one poll's worth: stdout's new lines, then stderr's
    assert [t for t, _ in log.lines(0, 10)] == [
        "o1",
        "o2",
        "e1",
        "o3",
        "e2",
        "Traceback (most recent call last):",
    ]
    assert log.first_error() == 5
    assert log.search(re.compile(rb"[oe]2")) == [1, 4]
    # a new torchrun attempt: a new view
    gen = log.generation
    d2 = tmp_path / "run" / "logs" / "node0" / "x_1" / "attempt_1" / "0"
    d2.mkdir(parents=True)
    (d2 / "stdout.log").write_text("again\n")
    st = log.update()
    assert st.generation != gen and st.attempt == "attempt_1" and log.lines(0, 5) == [("again", 0)]


def test_a_big_log_opens_at_its_tail_then_gets_its_head(tmp_path, monkeypatch):
    from tunedeck.core.views import watch

    monkeypatch.setattr(watch, "BIG_BYTES", 1 << 20)
    monkeypatch.setattr(watch, "TAIL_BYTES", 64 << 10)
    d = tmp_path / "run" / "logs" / "node0" / "x_1" / "attempt_0" / "0"
    d.mkdir(parents=True)
    lines = [f"line {i} " + "x" * (i % 97) for i in range(60000)]  # ~4.6 MB
    (d / "stdout.log").write_text("\n".join(lines) + "\n")
    (d / "stderr.log").write_text("err 0\n")
    log = RankLog(RunDir(tmp_path / "run"), 0)
    st = log.update(max_bytes=1 << 20)
    # at once: the last ~64 kB of stdout (from a line start), then stderr
    tail = st.total - 1
    assert 500 < tail < 2000 and not log.caught_up and st.indexed < st.size
    assert log.lines(0, 1)[0][0] == lines[-tail]
    assert log.lines(tail - 1, 2) == [(lines[-1], 0), ("err 0", 1)]
    with open(d / "stdout.log", "a") as f:  # the run goes on while it is indexed
        f.write("new 1\n")
    gen = st.generation
    while not log.caught_up:
        st = log.update(max_bytes=1 << 20)
    # the head went above: every line shown before is moved down by as many, in order
    assert st.moved_from == gen and st.moved_by == len(lines) - tail
    assert st.total == len(lines) + 2
    assert log.lines(0, 2) == [(lines[0], 0), (lines[1], 0)]
    assert log.lines(st.moved_by, 1)[0][0] == lines[-tail]
    assert [t for t, _ in log.lines(st.total - 3, 3)] == [lines[-1], "err 0", "new 1"]
    assert log.search(re.compile(rb"^line 7 ", re.M)) == [7]
    assert log.first_error() is None


def test_watcher_reads_a_long_event_file_from_its_end(tmp_path):
    """A long run's rank events are not replayed: the loss curve is sampled, the rates come
    from the last steps."""
    home = tmp_path / "home"
    run = build_run(home)
    ev = RunDir(run).event_file(0)
    with open(ev, "a") as f:
        for step in range(201, 60001):
            f.write(
                json.dumps(
                    {
                        "t": T0 + 600 + step,
                        "kind": "step",
                        "rank": 0,
                        "step": step,
                        "loss": 1.0 + 1000 / step,
                        "step_s": 1.0,
                        "data_wait_s": 0.5,
                        "tokens_per_s": 100.0,
                    }
                )
                + "\n"
            )
    assert ev.stat().st_size > 8 << 20
    w = RunWatcher(run)
    try:
        snap = w.poll()
        st = w.ranks[0].tail
        assert snap.loss_stats["sampled"] and snap.loss_stats["steps"] == 60000
        assert 100 < len(snap.loss_points) <= 400
        assert snap.loss_points[0] > snap.loss_points[-1]
        assert st.offset == ev.stat().st_size  # caught up from near the end
        assert snap.progress.step == 60000 and snap.progress.worst_wait[0] == 0
        assert snap.progress.worst_wait[1] == pytest.approx(0.5)
        assert snap.history is not None and w.poll().history is None  # ended: once
    finally:
        w.close()


def test_data_wait_share_from_the_probe_for_other_backends(tmp_path):
    """ms-swift and script runs: steps without data_wait_s, the DataLoader probe's waits."""
    run = tmp_path / "run"
    rd = RunDir(run)
    rd.create()
    rd.write_state({"run_id": "r", "status": "running", "created": T0, "started": T0})
    with open(rd.event_file(0), "w") as f:
        for step in range(1, 30):
            f.write(
                json.dumps({"t": T0 + step, "kind": "step", "rank": 0, "step": step, "loss": 2.0})
                + "\n"
            )
    for rank, wait in ((0, 0.05), (1, 0.6)):
        with open(rd.probe_file(rank), "w") as f:
            for i in range(120):  # once a second; only the last minute counts
                f.write(
                    json.dumps(
                        {
                            "t": T0 + i,
                            "kind": "data_wait",
                            "rank": rank,
                            "wait_s": wait if i >= 60 else 0.0,
                            "n": 10,
                        }
                    )
                    + "\n"
                )
    w = RunWatcher(run)
    try:
        p = w.poll().progress
    finally:
        w.close()
    assert p.worst_wait == (1, pytest.approx(0.6, rel=0.02))
    assert p.data_wait == pytest.approx((0.05 + 0.6) / 2, rel=0.02)


# -- snapshots -----------------------------------------------------------------------------


def _snapshot_app():
    build_run(FIXED_HOME)
    return TunedeckApp(open_run=RUN_ID, refresh_s=3600)


async def _settle(pilot):
    await _until(pilot, lambda: _ready(pilot.app), what="snapshot data")
    await pilot.pause(0.2)


@pytest.fixture
def fixed_home(monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(FIXED_HOME))
    yield FIXED_HOME


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (160, 48), (240, 67)], ids=str)
def test_snapshot_monitor(fixed_home, snap_compare, size):
    assert snap_compare(_snapshot_app(), terminal_size=size, run_before=_settle)


SIZES = [(80, 24), (120, 40), (160, 48), (240, 67)]


@pytest.mark.parametrize("size", SIZES, ids=str)
def test_snapshot_resumed(fixed_home, snap_compare, size):
    async def run_before(pilot):
        await _until(pilot, lambda: _joined(pilot.app), what="the parent's curve")
        await pilot.pause(0.2)

    build_run(FIXED_HOME)
    build_resumed(FIXED_HOME)
    app = TunedeckApp(open_run=CHILD_ID, refresh_s=3600)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=str)
def test_snapshot_failed_at_rendezvous(fixed_home, snap_compare, size):
    async def run_before(pilot):
        await _until(pilot, lambda: _log_shown(pilot.app), what="the launcher's log")
        await pilot.pause(0.2)

    build_rendezvous_failed(FIXED_HOME)
    app = TunedeckApp(open_run=RDZV_ID, refresh_s=3600)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=str)
def test_snapshot_stopping(fixed_home, snap_compare, size, monkeypatch):
    from tunedeck.core.views import watch

    monkeypatch.setattr(watch, "time", _Clock())
    build_stopping(FIXED_HOME)
    app = TunedeckApp(open_run=STOP_ID, refresh_s=3600)
    assert snap_compare(app, terminal_size=size, run_before=_settle)


@pytest.mark.parametrize("size", SIZES, ids=str)
def test_snapshot_help(fixed_home, snap_compare, size):
    async def run_before(pilot):
        await _settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.2)

    assert snap_compare(_snapshot_app(), terminal_size=size, run_before=run_before)


def test_snapshot_nccl_maximised_80x24(fixed_home, snap_compare):
    async def run_before(pilot):
        await _settle(pilot)
        pilot.app.screen.query_one("#nccl-pane").focus()
        await pilot.press("m")
        await pilot.pause(0.2)

    assert snap_compare(_snapshot_app(), terminal_size=(80, 24), run_before=run_before)


def test_a_stop_in_progress_reads_stopping_until_it_is_recorded():
    from tunedeck.core.views.registry import RunInfo
    from tunedeck.core.views.watch import Progress, Snapshot
    from tunedeck.tui.widgets.progress import progress_text

    def text(status: str, state: dict) -> str:
        run = RunInfo(
            **{"run_id": RUN_ID, "run_dir": FIXED_HOME, "name": "fx", "status": status},
            **{"message": "", "created": T0, "started": T0, "ended": None, "step": 5},
            **{"max_steps": 10, "loss": None, "tokens_per_s": None, "exit_code": None},
            state=state,
        )
        snap = Snapshot(run, Progress(step=5, max_steps=10), None, [], {})
        return progress_text(snap, 100).split("\n")[0]

    asked = {"status": "running", "stop_requested": "graceful"}
    assert text("running", asked).startswith("[bold yellow]stopping (graceful)[/]")
    assert text("running", {"status": "running"}).startswith("[")
    assert "stopping" not in text("running", {"status": "running"})
    done = {"status": "stopped", "stop_requested": "graceful", "message": "stopped (graceful)"}
    assert "stopping" not in text("stopped", done)
