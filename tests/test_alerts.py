"""Alerts from the agent (core/alerts): real apprise deliveries to JSON webhooks served on
loopback here, a user command given the alert as JSON on stdin, each finding and end alerting
once (across an adopting agent too), a webhook that never answers costing the run nothing,
and the webhook's token shown nowhere but secrets.json. Two real CPU demo runs share the
asserts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import DEMO, agent_gone, cli, cli_json, pids_gone, wait_for

pytest.importorskip("apprise")

TOKEN = "hooktoken5f3a9c"


class Hook:
    """A JSON webhook on 127.0.0.1 recording what it is sent; `hang`: it never answers."""

    def __init__(self, hang: bool = False):
        got = self.got = []
        stop = self.stop = threading.Event()

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                if hang:
                    stop.wait(60)
                    return
                n = int(self.headers.get("Content-Length") or 0)
                got.append((self.path, json.loads(self.rfile.read(n))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"json://127.0.0.1:{self.srv.server_port}/{TOKEN}"

    def titles(self) -> list[str]:
        return [body["title"] for _, body in self.got]

    def close(self):
        self.stop.set()
        self.srv.shutdown()


@pytest.fixture
def hooks():
    made = [Hook(), Hook(hang=True)]
    yield made
    for h in made:
        h.close()


SINK = """import json, sys, time
alert = json.load(sys.stdin)
time.sleep(float(sys.argv[2]))  # a slow command: the agent's end waits for it
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(alert) + "\\n")
"""


def _spec(tmp: Path, urls: list[str], sink_out: Path, sink_s: float = 0.0) -> Path:
    """The demo preset with [alerts]: the URLs live in this 0600 file, never in an argv."""
    sink = tmp / "sink.py"
    sink.write_text(SINK)
    text = DEMO.read_text().replace(
        'path = "data/demo_chat.jsonl"', f'path = "{DEMO.parent / "data" / "demo_chat.jsonl"}"'
    )
    text += f"\n[alerts]\nurls = {json.dumps(urls)}\n"
    text += f"command = {json.dumps([sys.executable, str(sink), str(sink_out), str(sink_s)])}\n"
    path = tmp / "alerting.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def _commands(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _state(home: Path, run_id: str) -> dict:
    return json.loads((home / "runs" / run_id / "state.json").read_text())


def test_stall_nan_and_finish_each_alert_once_across_an_adopting_agent(
    td_home, tmp_path, hooks, monkeypatch
):
    monkeypatch.setenv("TUNEDECK_STALL_FLOOR_S", "4")
    monkeypatch.setenv("TUNEDECK_ALERT_HOLD_S", "4")  # the NaN and the stall alert 6 s sooner
    # rank 0 takes 0.3 s a step more: 70 steps outlast the NaN alert's 4 s hold (~15 steps)
    # on an idle machine; a busy one only makes the steps slower
    monkeypatch.setenv("TUNEDECK_TEST_SLOW_RANK", "0:0.3")
    good, hang = hooks
    with socket.socket() as s:  # a port nothing listens on: refused at once
        s.bind(("127.0.0.1", 0))
        refused = f"json://127.0.0.1:{s.getsockname()[1]}/{TOKEN}"
    sink_out = tmp_path / "command.jsonl"
    spec = _spec(tmp_path, [good.url, hang.url, refused], sink_out)
    out = cli(
        "launch", str(spec), "--json", "--no-preflight",
        "--set", "train.max_steps=70", "--set", "train.learning_rate=1e3",
        "--set", "train.save_steps=0", home=td_home,
    )  # fmt: skip
    run_id = json.loads(out.stdout)["run_id"]
    run_dir = td_home / "runs" / run_id
    # the loss goes NaN within a few steps (lr 1e3): one loss_anomaly alert
    wait_for(
        lambda: any("loss" in t for t in good.titles()), 300, "the NaN alert"
    )  # a cold cache builds the demo model first
    # rank 1 stops (SIGSTOP): a stall, alerted once, while the run goes on
    rank1 = wait_for(lambda: _state(td_home, run_id)["rank_pids"].get("1"), 30, "rank 1's pid")
    os.kill(rank1, signal.SIGSTOP)
    try:
        wait_for(lambda: any("stall" in t.lower() or "no step" in t for t in good.titles()),
                 90, "the stall alert")  # fmt: skip
        # the token is in no argv while the run lives (ps), nor in any file but secrets.json
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert TOKEN not in ps
        # the agent is lost (SIGKILL); the next command adopts the run
        agent = _state(td_home, run_id)["agent_pid"]
        os.kill(agent, signal.SIGKILL)
        wait_for(lambda: pids_gone([agent]), 10, "the agent's death")
    finally:
        os.kill(rank1, signal.SIGCONT)
    cli_json("status", run_id, home=td_home)
    st = wait_for(
        lambda: (s := _state(td_home, run_id))["status"] in ("succeeded", "failed") and s,
        240,
        "the run's end",
    )
    assert st["status"] == "succeeded" and st.get("adopted"), st["message"]
    wait_for(lambda: any("succeeded" in t for t in good.titles()), 30, "the end's alert")
    time.sleep(2)  # nothing more may come
    titles = good.titles()
    assert sum("succeeded" in t for t in titles) == 1, titles
    assert sum("loss is nan" in t for t in titles) == 1, titles
    assert sum("stall" in t.lower() or "no step" in t for t in titles) == 1, titles
    assert len(titles) == 3, titles
    # the user command got the same alerts, as JSON on stdin (its own channel: it may be later)
    got = wait_for(lambda: len(g := _commands(sink_out)) >= 3 and g, 30, "the command's alerts")
    assert sorted(a["event"] for a in got) == ["finished", "loss_anomaly", "stall"], got
    assert all(a["run_id"] == run_id and a["look"].endswith(run_id) for a in got)

    # a refused webhook is recorded as failed (with no URL in the record); the run did not care
    def end_said():
        ledger = json.loads((run_dir / "alerts.json").read_text())
        chans = ledger["alerts"]["end"]["channels"]
        return chans if "url2 json://****" in chans else None

    end = wait_for(end_said, 30, "the refused webhook's outcome")  # 3 tries, 4 s
    assert end["url0 json://****"]["ok"] is True
    assert end["url2 json://****"] == {
        "ok": False,
        "tries": 3,
        "error": end["url2 json://****"]["error"],
    }
    # the hanging webhook held nothing up: the end was recorded and alerted meanwhile
    assert "url1 json://****" not in end or end["url1 json://****"]["ok"] is False
    # secrets: the token is only in secrets.json (0600)
    agent_gone(run_dir)  # it may still be waiting on the hanging webhook
    for path in run_dir.rglob("*"):
        if path.is_file() and path.name not in ("secrets.json", "run.db"):
            assert TOKEN not in path.read_text(errors="replace"), path
    assert "****" in (run_dir / "spec.toml").read_text()
    assert TOKEN in (run_dir / "secrets.json").read_text()
    assert (run_dir / "secrets.json").stat().st_mode & 0o777 == 0o600


def test_alerts_test_verb_reaches_every_channel(td_home, tmp_path, hooks):
    good, _ = hooks
    sink_out = tmp_path / "test.jsonl"
    spec = _spec(tmp_path, [good.url], sink_out)
    out = cli("alerts", "test", str(spec), "--json", home=td_home)
    assert [r["ok"] for r in json.loads(out.stdout)] == [True, True]
    assert good.titles() == ["tunedeck: test alert (demo)"]
    assert _commands(sink_out)[0]["event"] == "test"
    bad = tmp_path / "bad.toml"
    bad.write_text('[alerts]\non = ["finished", "nope"]\n')
    r = cli("alerts", "test", str(bad), home=td_home, check=False)
    assert r.returncode == 2 and "alerts.on: unknown event nope" in r.stderr


def test_a_crash_is_one_alert_naming_the_rank(td_home, tmp_path, hooks, monkeypatch):
    monkeypatch.setenv("TUNEDECK_TEST_CRASH_AT_STEP", "3")  # the last rank raises
    good, _ = hooks
    sink_out = tmp_path / "command.jsonl"
    spec = _spec(tmp_path, [good.url], sink_out, sink_s=2.0)
    out = cli(
        "launch", str(spec), "--json", "--no-preflight", "--wait",
        "--set", "train.max_steps=20", "--set", "train.save_steps=0", home=td_home, check=False,
    )  # fmt: skip
    run_id = json.loads(out.stdout.splitlines()[0])["run_id"]
    assert _state(td_home, run_id)["status"] == "failed"
    # --wait returns once the agent has sent the end's alerts, the slow command's included:
    # a script may archive the folder at once
    (alert,) = _commands(sink_out)
    ledger = json.loads((td_home / "runs" / run_id / "alerts.json").read_text())
    assert all(v["state"] != "pending" for v in ledger["alerts"].values()), ledger
    time.sleep(2)
    (title,) = good.titles()
    assert "failed" in title and "rank 1" in title, title
    assert alert["event"] == "failed" and alert["cause"] and alert["fix"], alert
    assert alert["look"] == f"tunedeck diagnose {run_id}"
    folded = [k for k, v in ledger["alerts"].items() if v["state"] == "folded into end"]
    assert folded, ledger  # the crash finding travelled with the end's alert


def test_idle_gpus_and_a_passed_eta_each_alert_once(td_home, tmp_path, monkeypatch):
    """One fake GPU (NVML's interface) reading 0 % the whole run: idle for the run's 3 s
    threshold. Rank 1 stopped after the early steps set the pace: the run passes its ETA."""
    monkeypatch.setenv("TUNEDECK_FAKE_NVML", "1:0")
    monkeypatch.setenv("TUNEDECK_TEST_SLOW_RANK", "0:0.1")
    sink_out = tmp_path / "command.jsonl"
    spec = _spec(tmp_path, [], sink_out)
    text = spec.read_text().replace("[alerts]\n", "[alerts]\n" + (
        'on = ["idle_gpus", "eta_reached", "finished"]\nidle_minutes = 0.05\neta_margin = 0.5\n'
    ))  # fmt: skip
    spec.write_text(text)
    out = cli(
        "launch", str(spec), "--json", "--no-preflight", "--set", "train.max_steps=24",
        "--set", "train.save_steps=0", home=td_home,
    )  # fmt: skip
    run_id = json.loads(out.stdout)["run_id"]

    def events() -> list[str]:
        return [a["event"] for a in _commands(sink_out)]

    # a cold cache builds the demo model first
    wait_for(lambda: _state(td_home, run_id)["progress"].get("step", 0) >= 6, 300, "the pace")
    rank1 = _state(td_home, run_id)["rank_pids"]["1"]
    os.kill(rank1, signal.SIGSTOP)
    try:
        wait_for(lambda: {"idle_gpus", "eta_reached"} <= set(events()), 90, "both alerts")
    finally:
        os.kill(rank1, signal.SIGCONT)
    wait_for(lambda: _state(td_home, run_id)["status"] == "succeeded", 240, "the run's end")
    wait_for(lambda: "finished" in events(), 30, "the end's alert")
    got = _commands(sink_out)
    assert sorted(a["event"] for a in got) == ["eta_reached", "finished", "idle_gpus"], got
    idle = next(a for a in got if a["event"] == "idle_gpus")
    assert "idle" in idle["title"] and "0%" in idle["title"] and idle["fix"], idle
    eta = next(a for a in got if a["event"] == "eta_reached")
    assert "past its ETA" in eta["title"] and "/24" in eta["title"], eta


def test_the_watchdogs_judge_only_what_they_should():
    from tunedeck.core.alerts.watchdogs import EtaWatch, IdleGpus, Readings

    idle = IdleGpus(minutes=1)
    assert idle.due(0, [0.0, 2.0]) is None  # idle from now on
    assert idle.due(50, [0.0, 0.0]) is None
    assert idle.due(61, [1.0, 0.0]) == 61  # a minute of every GPU under 5 %
    assert idle.due(62, [0.0, 40.0]) is None  # one GPU busy: the clock starts again
    assert idle.due(100, [0.0, 0.0]) is None and idle.due(161, []) is None  # no NVML: none
    eta = EtaWatch(margin=0.5)
    pace = Readings([], first=(1, 100.0), last=(10, 109.0), max_steps=100)  # 1 s a step
    assert eta.due(109.0, pace) is None and eta.promised == 199.0
    at_90 = Readings([], (1, 100.0), (90, 189.0), 100)
    assert eta.due(240.0, at_90) is None  # 140 s in: late only past 100 + 99 * 1.5
    assert eta.due(249.0, at_90) == 199.0
    assert eta.due(400.0, Readings([], (1, 100.0), (100, 300.0), 100)) is None  # done
