"""The terminal channel of alerts. When a run's agent records an alert (alerts.json) for the
run this TUI shows (the monitor's run; any run of the home on the other screens), the TUI
rings the bell and writes the desktop-notification escapes OSC 9 (iTerm2, WezTerm, Windows
Terminal, kitty) and OSC 777 (VTE terminals, foot, urxvt): the terminal on the user's own
desktop shows them, through SSH too. Each alert once; alerts.json is read in a thread worker.

Textual has `App.bell()` but no public call for other escapes; its own OSC 52 (clipboard)
goes through the driver's `write`, as these do."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

from textual.app import App

from tunedeck.core.api import RunNotFound, alert_feed, clean, find_run

POLL_S = 2.0
TEXT_MAX = 240  # a notification is a line; the rest is in `tunedeck diagnose`


def notify_escapes(title: str, body: str) -> str:
    """OSC 9 (one text) and OSC 777 (title and body; `;` separates its fields, so none in
    the title), each ended by BEL; no control character of the alert gets through."""
    title = clean(title)[:TEXT_MAX].replace(";", ",")
    body = clean(body)[:TEXT_MAX]
    return f"\x1b]9;{title}: {body}\x07\x1b]777;notify;{title};{body}\x07"


def title_and_body(alert: dict[str, Any]) -> tuple[str, str]:
    """The run's name, and the cause (else what happened: the alert's title after the name)."""
    run = str(alert.get("run") or alert.get("run_id") or "tunedeck")
    said = str(alert.get("title") or "").removeprefix(f"tunedeck {run}: ")
    return run, str(alert.get("cause") or said or alert.get("event") or "alert")


class TerminalAlerts:
    """Polls the feed every POLL_S from a thread worker; rings on the UI thread."""

    def __init__(self, app: App):
        self.app = app
        self.feed = alert_feed()
        self.run_ids: dict[str, str] = {}  # a monitor's run reference → its run id
        self._reading = threading.Lock()
        app.set_interval(POLL_S, self.poll)

    def poll(self) -> None:
        ref = getattr(self.app.screen, "run_ref", None)  # a monitor shows one run
        self.app.run_worker(
            partial(self._read, ref), thread=True, group="terminal-alerts", exit_on_error=False
        )

    def _read(self, ref: str | None) -> None:
        if not self._reading.acquire(blocking=False):
            return  # the last poll is still reading (a slow disk): skip this one
        try:
            run_id = None
            if ref is not None:
                if ref not in self.run_ids:
                    self.run_ids[ref] = find_run(ref).run_id
                run_id = self.run_ids[ref]
            alerts = self.feed.poll(run_id)
        except RunNotFound:
            return
        finally:
            self._reading.release()
        if alerts:
            self.app.call_from_thread(self.ring, alerts)

    def ring(self, alerts: list[dict[str, Any]]) -> None:
        self.app.bell()
        driver = self.app._driver
        if self.app.is_headless or driver is None:
            return
        for alert in alerts:
            driver.write(notify_escapes(*title_and_body(alert)))
