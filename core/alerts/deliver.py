"""Sending alerts off the agent's loop: one daemon thread per agent takes them from a queue
and hands each to every channel, apprise URL by URL (so each one's outcome is known) and the
user command (argv, never a shell; the alert as JSON on stdin), each with a timeout and a few
tries. A channel that fails is recorded in alerts.json; nothing here ever reaches the run.

URLs hold tokens: they are never logged nor recorded, only their scheme (`json://****`)."""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import threading
import time
from typing import Any

from tunedeck.core.alerts.config import AlertConfig
from tunedeck.core.alerts.ledger import Ledger
from tunedeck.core.alerts.message import body

log = logging.getLogger("tunedeck.alerts")

TRIES = 3
PAUSES_S = (1.0, 3.0)  # between tries
COMMAND_TIMEOUT_S = 30.0
NOTIFY_TYPE = {"error": "failure", "warning": "warning", "info": "success"}


def url_name(i: int, url: str) -> str:
    scheme = url.split("://", 1)[0] if "://" in url else "url"
    return f"url{i} {scheme}://****"


def send_url(url: str, alert: dict[str, Any]) -> str:
    """'' when apprise delivered it, else why not (no URL in it)."""
    import apprise

    # apprise's own log lines may name the host and path, where tokens live
    logging.getLogger("apprise").setLevel(logging.CRITICAL)
    a = apprise.Apprise()
    if not a.add(url):
        return "not a notification URL apprise knows"
    ok = a.notify(
        title=alert["title"],
        body=body(alert),
        notify_type=NOTIFY_TYPE.get(alert.get("severity", "info"), "info"),
    )
    return "" if ok else "the service did not accept it (or did not answer in time)"


def run_command(argv: list[str], alert: dict[str, Any]) -> str:
    """'' when the command exited 0, else why not."""
    try:
        p = subprocess.run(
            argv,
            input=json.dumps(alert).encode(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=COMMAND_TIMEOUT_S,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return f"did not end within {COMMAND_TIMEOUT_S:.0f}s"
    except OSError as e:
        return f"could not start: {e.strerror or e}"
    if p.returncode != 0:
        tail = p.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f"exited with code {p.returncode} {tail[0][:200]}".strip()
    return ""


class Deliverer:
    """One thread and queue per channel: a channel that hangs (a webhook that never answers)
    delays only itself."""

    def __init__(self, cfg: AlertConfig, ledger: Ledger | None):
        self.cfg, self.ledger = cfg, ledger
        self.queues: dict[str, queue.Queue[dict[str, Any]]] = {}

    def send(self, alert: dict[str, Any], only: set[str] | None = None) -> None:
        """Queue `alert` on every channel (`only`: those named; a retry after adoption)."""
        chans = [(n, f) for n, f in self.channels() if only is None or n in only]
        assert self.ledger is not None
        if only is None:  # before it leaves: never twice, even across agents
            self.ledger.record(alert, [n for n, _ in chans])
        for name, fn in chans:
            q = self.queues.get(name)
            if q is None:
                q = self.queues[name] = queue.Queue()
                threading.Thread(
                    target=self._work, args=(name, fn, q), name=f"alerts {name}", daemon=True
                ).start()
            q.put(alert)

    def drain(self, timeout_s: float) -> bool:
        """Wait for what is queued to go out; False when the time ran out first."""
        end = time.monotonic() + timeout_s
        while any(q.unfinished_tasks for q in self.queues.values()) and time.monotonic() < end:
            time.sleep(0.05)
        return not any(q.unfinished_tasks for q in self.queues.values())

    def channels(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [
            (url_name(i, u), lambda a, u=u: send_url(u, a)) for i, u in enumerate(self.cfg.urls)
        ]
        if self.cfg.command:
            out.append(("command", lambda a: run_command(self.cfg.command, a)))
        return out

    def _work(self, name: str, send, q: queue.Queue) -> None:
        while True:
            alert = q.get()
            try:
                assert self.ledger is not None
                self.ledger.begin(alert["key"], name)
                ok, tries, why = _try(alert, send)
                self.ledger.outcome(alert["key"], name, ok, tries, why)
                if ok:
                    log.info("alert %s sent to %s", alert["key"], name)
                else:
                    log.warning("alert %s not delivered to %s: %s", alert["key"], name, why)
            except Exception:
                log.exception("alert %s: channel %s failed", alert.get("key"), name)
            finally:
                q.task_done()


def _try(alert: dict[str, Any], send) -> tuple[bool, int, str]:
    why = ""
    for n in range(1, TRIES + 1):
        try:
            why = send(alert)
        except Exception as e:  # a channel's bug is that channel's failure
            why = type(e).__name__
        if not why:
            return True, n, ""
        if n < TRIES:
            time.sleep(PAUSES_S[min(n - 1, len(PAUSES_S) - 1)])
    return False, TRIES, why


def send_test(cfg: AlertConfig, run_name: str = "test") -> list[tuple[str, str]]:
    """`tunedeck alerts test`: one message through every channel now; (channel, '' or why)."""
    alert = {
        "event": "test",
        "key": "test",
        "run_id": "-",
        "run": run_name,
        "host": os.uname().nodename,
        "t": time.time(),
        "title": f"tunedeck: test alert ({run_name})",
        "look": "tunedeck ls",
        "severity": "info",
    }
    return [(name, _try(alert, send)[2]) for name, send in Deliverer(cfg, None).channels()]
