"""alerts.json in the run directory: every alert the run sent or is sending, by key, with
each channel's outcome; with no channel it is the record the TUI's terminal channel reads
(`feed`). Written before an alert leaves, so an agent that adopts the run (its
first agent was lost) sends nothing twice and retries what had not gone out. Its single
writer is the run's agent (the delivery thread and the loop share it under a lock)."""

from __future__ import annotations

import threading
from typing import Any

from tunedeck.core.rundir import RunDir, read_json, write_json_atomic

NAME = "alerts.json"


class Ledger:
    def __init__(self, run: RunDir):
        self.path = run.path / NAME
        data = read_json(self.path, {})
        alerts = data.get("alerts") if isinstance(data, dict) else None
        self.alerts: dict[str, dict[str, Any]] = {
            str(k): v for k, v in (alerts or {}).items() if isinstance(v, dict)
        }
        self.suppressed = int(data.get("suppressed") or 0) if isinstance(data, dict) else 0
        self.lock = threading.Lock()

    def has(self, key: str) -> bool:
        return key in self.alerts

    def unsent(self) -> list[tuple[dict[str, Any], set[str]]]:
        """Alerts an agent lost while sending them, each with the channels it had not begun
        to send them to: the agent that adopts the run sends them there. A channel begun is
        not tried again (it may have delivered: twice would be worse than once lost)."""
        return [
            (a["alert"], set(a["expect"]) - set(a["channels"]) - set(a.get("begun", ())))
            for a in self.alerts.values()
            if a.get("state") == "pending"
        ]

    def begin(self, key: str, channel: str) -> None:
        with self.lock:
            entry = self.alerts[key]
            entry["begun"] = sorted({*entry.get("begun", ()), channel})
            self._write()

    def record(self, alert: dict[str, Any], channels: list[str]) -> None:
        with self.lock:
            self.alerts[alert["key"]] = {
                "alert": alert,
                "state": "pending" if channels else "recorded",
                "expect": channels,
                "channels": {},
            }
            self._write()

    def fold(self, key: str, finding: dict[str, Any]) -> None:
        """A finding the end's alert stands for: never sent on its own."""
        with self.lock:
            self.alerts[key] = {"finding": finding, "state": "folded into end"}
            self._write()

    def outcome(self, key: str, channel: str, ok: bool, tries: int, error: str = "") -> None:
        """One channel's outcome; once every channel has one, the alert is `sent` or
        `failed` (some channel did not take it; `error` says why, with no URL in it)."""
        with self.lock:
            entry = self.alerts[key]
            said = {"ok": ok, "tries": tries}
            if error:
                said["error"] = error
            entry["channels"][channel] = said
            if set(entry["expect"]) <= set(entry["channels"]):
                bad = [c for c, r in entry["channels"].items() if not r.get("ok")]
                entry["state"] = "failed" if bad else "sent"
            self._write()

    def suppress(self) -> None:
        with self.lock:
            self.suppressed += 1
            self._write()

    def _write(self) -> None:
        write_json_atomic(self.path, {"alerts": self.alerts, "suppressed": self.suppressed})
