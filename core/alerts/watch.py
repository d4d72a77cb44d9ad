"""What the agent calls: `RunAlerts(run, spec)` once, `tick(now)` every loop, `ended(status,
message)` after the run's end is recorded. Findings are read from run.db (a read-only
connection of its own, by row id: constant work per tick); each alerts once (alerts.json).

An error finding waits HOLD_S before it alerts: a crash ends the run within that time, and
the failed end's alert then carries its cause and fix, so one crash is one alert; a run that
ends any other way sends its held findings as they are (a NaN loss is news even if the run
"succeeded"). Warnings and
errors of a run that goes on (a stall) alert after the hold. At most RATE_MAX alerts per
RATE_WINDOW_S (the end's always goes); the rest are counted and the next alert says so.
Every WATCHDOG_S the tick also asks `watchdogs` about idle GPUs and the ETA (when `on` names
them), each once per run."""

from __future__ import annotations

import logging
import sqlite3
import json
import time
from collections import deque
from typing import Any

from tunedeck.core.envnum import env_number
from tunedeck.core.alerts import message
from tunedeck.core.alerts.config import AlertConfig, config_for
from tunedeck.core.alerts.deliver import Deliverer
from tunedeck.core.alerts.ledger import Ledger
from tunedeck.core.alerts.watchdogs import EtaWatch, IdleGpus, readings
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.secrets import read_secrets
from tunedeck.core.spec import RunSpec

log = logging.getLogger("tunedeck.alerts")

POLL_S = 1.0
WATCHDOG_S = 5.0  # idle GPUs and the ETA: minutes-scale, looked at every few seconds


# TUNEDECK_ALERT_HOLD_S, default 10: tests whose run goes on past an error finding set it
# lower to hear the alert sooner
HOLD_S = env_number("TUNEDECK_ALERT_HOLD_S", 10.0)
RATE_MAX = 10
RATE_WINDOW_S = 600.0
END_WAIT_S = 10.0  # the agent waits this long at the end for alerts still going out


class RunAlerts:
    def __init__(self, run: RunDir, spec: RunSpec):
        self.run, self.name = run, spec.name
        self.cfg = AlertConfig()
        self.out: Deliverer | None = None
        if spec.cluster.node_rank != 0:  # a run alerts once: from its head node's agent
            return
        try:
            self.cfg = config_for(read_secrets(run).unmask_spec(spec))
        except Exception as e:  # a bad user file must not stop the run
            log.warning("alerts go to the terminal only (alerts.json): %s", e)
        # with no URL nor command the alerts are still recorded: alerts.json is the terminal
        # channel, which a TUI showing the run reads (tui/terminal_alerts.py)
        self.ledger = Ledger(run)
        self.out = Deliverer(self.cfg, self.ledger)
        for alert, channels in self.ledger.unsent():  # a lost agent's, not all out
            self.out.send(alert, only=channels)
        self.last_id = 0
        self.last_poll = 0.0
        self.held: dict[str, tuple[float, str, dict[str, Any]]] = {}
        self.sent_at: deque[float] = deque()
        self.idle = IdleGpus(self.cfg.idle_minutes) if self.cfg.wants("idle_gpus") else None
        self.eta = EtaWatch(self.cfg.eta_margin) if self.cfg.wants("eta_reached") else None
        self.last_watchdog = 0.0

    def tick(self, now: float | None = None) -> None:
        if self.out is None:
            return
        now = now or time.time()
        if now - self.last_poll < POLL_S:
            return
        self.last_poll = now
        try:
            for f in self._new_findings():
                self._consider(f, now)
            for key, (since, event, f) in list(self.held.items()):
                if now - since >= HOLD_S:
                    del self.held[key]
                    self._send(message.from_finding(self.run.run_id, self.name, event, f), now)
            if now - self.last_watchdog >= WATCHDOG_S:
                self.last_watchdog = now
                self._watchdogs(now)
        except Exception:
            log.exception("alerts: reading findings failed")

    def _watchdogs(self, now: float) -> None:
        idle = self.idle if self.idle and not self.ledger.has("idle_gpus") else None
        eta = self.eta if self.eta and not self.ledger.has("eta_reached") else None
        if not (idle or eta) or not self.run.db.exists():
            return
        con = self._connect()
        try:
            r = readings(con)
        finally:
            con.close()
        run_id = self.run.run_id
        if idle and (idle_s := idle.due(now, r.utils)) is not None:
            self.idle = None  # once, even when the rate limit held it back
            self._send(message.idle_gpus(run_id, self.name, idle_s, r.utils), now)
        if eta and r.last and (promised := eta.due(now, r)) is not None:
            self.eta = None
            over = now - promised
            self._send(message.eta_reached(run_id, self.name, over, r.last[0], r.max_steps), now)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.run.db}?mode=ro", uri=True, timeout=2.0)

    def ended(self, status: str, msg: str) -> None:
        """The run's end is recorded: its alert (carrying a failure's root cause) goes out;
        a failed run's error findings still held are folded into it."""
        if self.out is None:
            return
        try:
            for f in self._new_findings():
                self._consider(f, time.time())
            # a failed end's alert carries its root cause and stands for the held errors; a run
            # that ended otherwise (a NaN loss in a run that "succeeded") alerts them as they are
            errors = []
            if status == "failed":
                errors = [f for _, _, f in self.held.values() if f.get("severity") == "error"]
            root = next(
                (f for f in errors if f.get("root_cause", True)), errors[0] if errors else None
            )
            for f in errors:
                key = message.finding_key(f)
                del self.held[key]
                self.ledger.fold(key, f)
            event = message.END_EVENT.get(status, status)
            if self.cfg.wants(event) and not self.ledger.has("end"):
                self.out.send(message.from_end(self.run.run_id, self.name, status, msg, root))
            for since, event, f in self.held.values():
                self._send(message.from_finding(self.run.run_id, self.name, event, f), since)
            self.held.clear()
        except Exception:
            log.exception("alerts: the end's alert failed")
        if not self.out.drain(END_WAIT_S):
            log.warning("alerts still going out after %.0fs; alerts.json keeps them", END_WAIT_S)

    def _consider(self, f: dict[str, Any], now: float) -> None:
        key = message.finding_key(f)
        event = message.finding_event(f, self.cfg.wants)
        if event is None or key in self.held or self.ledger.has(key):
            return
        self.held[key] = (now, event, f)

    def _send(self, alert: dict[str, Any], now: float) -> None:
        while self.sent_at and now - self.sent_at[0] > RATE_WINDOW_S:
            self.sent_at.popleft()
        if len(self.sent_at) >= RATE_MAX:
            self.ledger.suppress()
            return
        self.sent_at.append(now)
        if self.ledger.suppressed:
            alert["suppressed"] = self.ledger.suppressed
        self.out.send(alert)

    def _new_findings(self) -> list[dict[str, Any]]:
        db = self.run.db
        if not db.exists():
            return []
        con = self._connect()
        try:
            rows = con.execute(
                "SELECT id, data FROM findings WHERE id > ? ORDER BY id", (self.last_id,)
            ).fetchall()
        except sqlite3.Error:
            return []
        finally:
            con.close()
        if rows:
            self.last_id = rows[-1][0]
        return [json.loads(d) for _, d in rows]
