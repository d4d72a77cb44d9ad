"""The run's metrics mirrored into the trackers users already read: TensorBoard event files,
a W&B run (offline by default) and an MLflow run, under `<run dir>/tracking/`.

The agent mirrors, for every backend: the rank-0 events it ingests into run.db (the built-in
trainer's own, or what it parsed from ms-swift's logging.jsonl or a script's console) go to
a `Mirror` through a bounded queue, and a thread of its own opens the trackers and writes
them, so a slow or hanging tracker never slows ingest (a full queue drops the point and
counts it) and a failing one is closed and reported, never raised into the run. Trackers the
backend reports to itself (`tracking.backend_reports`) are left out. Every POLL_S the same
thread also asks `poll` (the agent's read side of run.db) for what is not an event: GPU and
rank telemetry as scalars at the newest step, findings as notes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunedeck.core.spec import RunSpec
from tunedeck.core.trackers.sinks import (
    Sink,
    backend_reports,
    open_sinks,
    tensorboard_logdir,
    tracking_dir,
    wanted,
)

__all__ = [
    "Mirror",
    "backend_reports",
    "open_mirror",
    "step_values",
    "tensorboard_logdir",
    "tracking_dir",
]

log = logging.getLogger("tunedeck.trackers")

QUEUE_POINTS = 16384  # steps; a few hundred bytes each
CLOSE_TIMEOUT_S = 60.0
POLL_S = 10.0

# what `poll` returns: ("values", {tag: number}) logged at the newest step, or
# ("note", (tag, text))
Polled = list[tuple[str, Any]]

# event field -> tracker tag (what TensorBoard, W&B and MLflow all show)
STEP_TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "perf/tokens_per_s",
    "mfu": "perf/mfu",
    "mem_gib": "perf/mem_gib",
}


def step_values(kind: str, fields: dict[str, Any]) -> dict[str, float]:
    """The numbers one event adds to the trackers, by tag (empty: nothing to log)."""
    out: dict[str, float] = {}
    if kind == "step":
        for key, tag in STEP_TAGS.items():
            v = fields.get(key)
            if isinstance(v, (int, float)) and v == v:
                out[tag] = float(v)
        wait, step_s = fields.get("data_wait_s"), fields.get("step_s")
        if isinstance(wait, (int, float)) and isinstance(step_s, (int, float)) and step_s > 0:
            out["perf/data_wait_share"] = wait / step_s
    elif kind == "eval" and isinstance(fields.get("eval_loss"), (int, float)):
        out["eval/loss"] = float(fields["eval_loss"])
    return out


class Mirror:
    """A thread that opens the sinks (`opener`: W&B and MLflow take seconds to import and
    start) and feeds them from a bounded queue; `dropped` counts points lost to a full queue,
    `failures` the trackers that failed (and were closed)."""

    def __init__(
        self,
        opener: Callable[[], list[Sink]],
        maxsize: int = QUEUE_POINTS,
        poll: Callable[[], Polled] | None = None,
        poll_s: float = POLL_S,
    ):
        self.sinks: list[Sink] = []
        self.dropped = 0
        self.failures: list[str] = []
        self.step = 0  # the newest step an event named: where polled values are logged
        self._poll, self._poll_s = poll, poll_s
        self._q: queue.Queue = queue.Queue(maxsize)
        self._thread = threading.Thread(
            target=self._drain, args=(opener,), name="tracker-mirror", daemon=True
        )
        self._thread.start()

    def put(self, kind: str, fields: dict[str, Any]) -> None:
        """Queue what one event adds (its step, a few numbers, an end's reason): a catch-up
        burst of many thousand steps fits the queue without holding the events."""
        step = fields.get("step")
        if not isinstance(step, int):
            return
        values = step_values(kind, fields)
        end = f"{fields.get('reason')} at step {step}" if kind == "end" else None
        if not values and end is None:
            return
        try:
            self._q.put_nowait((step, values, end))
        except queue.Full:
            self.dropped += 1

    def feed(self, events: list[dict[str, Any]]) -> None:
        """Rank 0's events among what the agent ingested (one series per run, as in
        `tunedeck metrics`)."""
        for e in events:
            if e.get("rank") == 0:
                self.put(e.get("kind", ""), e)

    def _drain(self, opener: Callable[[], list[Sink]]) -> None:
        try:
            self.sinks = opener()
        except Exception as e:  # noqa: BLE001 - a tracker never stops the run
            self.failures.append(f"trackers: {type(e).__name__}: {e}")
            log.warning("trackers could not start: %s", e)
        next_poll = time.monotonic() + self._poll_s
        while True:
            try:
                item = self._q.get(timeout=max(next_poll - time.monotonic(), 0.0))
            except queue.Empty:
                item = ()
            if time.monotonic() >= next_poll or item is None:
                self._polled()
                next_poll = time.monotonic() + self._poll_s
            if item is None:
                # closed here, under close()'s time limit: a tracker's finish waits on its
                # own service and must never hold the agent's end
                for sink in list(self.sinks):
                    try:
                        sink.close(self.dropped)
                    except Exception as e:  # noqa: BLE001
                        self._fail(sink, e, close=False)
                return
            if not item:
                continue
            step, values, end = item
            self.step = max(self.step, step)
            if values:
                self._each(lambda sink: sink.log(step, values))
            if end is not None:
                self._each(lambda sink: sink.note(step, "end", end))

    def _polled(self) -> None:
        if self._poll is None:
            return
        try:
            got = self._poll()
        except Exception as e:  # noqa: BLE001 - run.db busy or gone: the next poll tries again
            log.debug("tracker poll failed: %s", e)
            return
        step = self.step
        for kind, data in got:
            if kind == "values" and data:
                self._each(lambda sink: sink.log(step, data))
            elif kind == "note":
                tag, text = data
                self._each(lambda sink: sink.note(step, tag, text))

    def _each(self, call: Callable[[Sink], Any]) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as e:  # noqa: BLE001 - a tracker never stops the run
                self._fail(sink, e)

    def _fail(self, sink: Sink, e: Exception, close: bool = True) -> None:
        self.failures.append(f"{sink.name}: {type(e).__name__}: {e}")
        log.warning("tracker %s failed and is off: %s", sink.name, e)
        self.sinks.remove(sink)
        if not close:
            return
        try:
            sink.close(self.dropped)
        except Exception:  # noqa: BLE001 - already reported
            pass

    def close(self) -> None:
        """Drain what is queued and close the trackers, for at most CLOSE_TIMEOUT_S: a
        tracker that hangs costs its last points, never the run's end."""
        try:
            self._q.put(None, timeout=CLOSE_TIMEOUT_S)
        except queue.Full:
            pass
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            self.failures.append(f"trackers: still writing after {CLOSE_TIMEOUT_S:.0f} s; left")
            log.warning("%s", self.failures[-1])


def open_mirror(
    spec: RunSpec, run_dir: Path, poll: Callable[[], Polled] | None = None
) -> Mirror | None:
    """The agent's mirror for a run, or None when no tracker is left to write. A tracker that
    cannot start (its package missing, a bad URI) is logged and left out."""
    if not wanted(spec):
        return None

    def opener() -> list[Sink]:
        sinks, problems = open_sinks(spec, Path(run_dir))
        for p in problems:
            log.warning("%s", p)
        return sinks

    return Mirror(opener, poll=poll)
