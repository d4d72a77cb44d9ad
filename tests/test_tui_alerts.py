"""The alerts' terminal channel: a run's agent records an alert (alerts.json, with no URL nor
command configured); the TUI showing the runs list rings the bell and writes the OSC 9 and
OSC 777 desktop-notification escapes, once. Seen in a real tmux on a server of the test's own:
`pipe-pane` records the raw bytes the TUI writes, `window_bell_flag` the bell. The feed the TUI
reads is checked on its own too: one run or all, each alert once, nothing from before; and a
monitor rings for its own run only."""

from __future__ import annotations

import json
import shlex
import sys
import time

from tests.conftest import DEMO, cli, until, wait_for
from tests.test_manage import make_run
from tunedeck.core.alerts.feed import AlertFeed
from tunedeck.core.alerts.ledger import Ledger
from tunedeck.core.rundir import RunDir
from tunedeck.tui import terminal_alerts
from tunedeck.tui.app import TunedeckApp
from tunedeck.tui.screens.monitor import MonitorScreen
from tunedeck.tui.screens.runs import RunsScreen
from tunedeck.tui.terminal_alerts import notify_escapes, title_and_body


def test_an_alert_rings_the_bell_and_notifies_the_desktop_once(td_home, tmux, tmp_path):
    raw = tmp_path / "pane.bytes"
    tmux.start("deck", [sys.executable, "-m", "tunedeck.tui"], env={"TUNEDECK_HOME": str(td_home)})
    wait_for(lambda: "No runs yet" in tmux.screen("deck"), 60, "the runs list")
    tmux("pipe-pane", "-o", "-t", "deck", f"cat >> {shlex.quote(str(raw))}", check=True)
    assert tmux("display", "-p", "-t", "deck", "#{window_bell_flag}").stdout.strip() == "0"

    out = cli(
        "launch", str(DEMO), "--json", "--no-preflight", "--wait", "--set", "name=bell-demo",
        "--set", "train.max_steps=3", "--set", "train.save_steps=0", home=td_home,
    )  # fmt: skip
    run_id = json.loads(out.stdout.splitlines()[0])["run_id"]
    osc9 = b"\x1b]9;bell-demo: succeeded"
    wait_for(lambda: raw.exists() and osc9 in raw.read_bytes(), 30, "the OSC 9 notification")
    # the agent records the alert after the run's final status: read it once the TUI rang
    ledger = json.loads((td_home / "runs" / run_id / "alerts.json").read_text())
    assert ledger["alerts"]["end"]["state"] == "recorded"  # no channel: the terminal's only
    time.sleep(4.5)  # two more polls: nothing again
    data = raw.read_bytes()
    assert data.count(osc9) == 1, data[-400:]
    assert data.count(b"\x1b]777;notify;bell-demo;succeeded") == 1, data[-400:]
    start = data.index(osc9)
    assert data.index(b"\x07", start) < data.index(b"\x1b]777", start)  # OSC 9 ended by BEL
    assert tmux("display", "-p", "-t", "deck", "#{window_bell_flag}").stdout.strip() == "1"


def test_the_feed_gives_each_new_alert_once_for_one_run_or_all(tmp_path):
    root = tmp_path / "runs"
    old, a, b = (RunDir(root / name) for name in ("r-old", "r-a", "r-b"))
    for run in (old, a, b):
        run.path.mkdir(parents=True)
    Ledger(old).record({"key": "end", "t": 1.0, "run": "old", "title": "x"}, [])
    feed = AlertFeed(root, since=100.0)
    assert feed.poll() == []  # recorded before the viewer started
    Ledger(a).record({"key": "end", "t": 101.0, "run": "a", "title": "tunedeck a: failed"}, [])
    Ledger(b).record({"key": "finding:stall:1:0", "t": 102.0, "run": "b", "cause": "c"}, [])
    assert [x["run"] for x in feed.poll("r-a")] == ["a"]  # the monitor's run only
    assert feed.poll("r-a") == []
    assert [x["run"] for x in feed.poll()] == ["b"]  # the runs list: every run, a already seen
    assert feed.poll() == []
    # what the escapes carry: the run's name, its cause; no control character gets through
    assert title_and_body({"run": "a", "title": "tunedeck a: failed (exit 1)"}) == (
        "a",
        "failed (exit 1)",
    )
    assert notify_escapes("r;\x1b[2Jx", "boom\x07\nnext") == (
        "\x1b]9;r,x: boom next\x07\x1b]777;notify;r,x;boom next\x07"
    )


async def test_a_monitor_rings_for_its_own_run_only(tmp_path, monkeypatch):
    """The monitor's run alerts; another run's alert waits for the runs list, and still
    rings only once."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    root = tmp_path / "home" / "runs"
    shown, other = (RunDir(make_run(root, rid, name=rid)) for rid in ("run-shown", "run-other"))
    rung: list[str] = []
    monkeypatch.setattr(terminal_alerts, "POLL_S", 0.1)
    monkeypatch.setattr(terminal_alerts.TerminalAlerts, "ring", lambda self, a: rung.extend(
        x["run"] for x in a))  # fmt: skip
    app = TunedeckApp(open_run="run-shown", refresh_s=3600)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen))
        now = time.time()
        Ledger(other).record({"key": "end", "t": now, "run": "run-other", "title": "x"}, [])
        Ledger(shown).record({"key": "end", "t": now, "run": "run-shown", "title": "y"}, [])
        await until(pilot, lambda: rung == ["run-shown"])
        await pilot.pause(0.5)
        assert rung == ["run-shown"]
        app.pop_screen()
        await until(pilot, lambda: isinstance(app.screen, RunsScreen))
        await until(pilot, lambda: rung == ["run-shown", "run-other"])
        await pilot.pause(0.5)
        assert rung == ["run-shown", "run-other"]
