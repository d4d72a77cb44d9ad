"""The run's metrics mirrored into the trackers users already read: TensorBoard event files,
a W&B run (offline by default) and an MLflow run, under `<run dir>/tracking/`.

The built-in trainer's rank 0 wraps its event writer (`mirrored`): every event still goes to
events/rank0.jsonl first; the mirror gets a copy through a bounded queue and a thread of its
own, so a slow tracker never slows a step (a full queue drops the point and counts it) and a
failing one is closed and reported, never raised into the run.
"""

from __future__ import annotations

import queue
import sys
import threading
from pathlib import Path
from typing import Any

from tunedeck.core.spec import RunSpec
from tunedeck.core.trackers.sinks import Sink, open_sinks, tracking_dir

__all__ = ["Mirror", "MirroredEvents", "mirrored", "step_values", "tracking_dir"]

QUEUE_POINTS = 4096
CLOSE_TIMEOUT_S = 60.0

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
    """A thread feeding the sinks from a bounded queue; `dropped` counts points lost to a
    full queue, `failures` the sinks that failed (and were closed)."""

    def __init__(self, sinks: list[Sink], maxsize: int = QUEUE_POINTS):
        self.sinks = sinks
        self.dropped = 0
        self.failures: list[str] = []
        self._q: queue.Queue = queue.Queue(maxsize)
        self._thread = threading.Thread(target=self._drain, name="tracker-mirror", daemon=True)
        self._thread.start()

    def put(self, kind: str, fields: dict[str, Any]) -> None:
        try:
            self._q.put_nowait((kind, fields))
        except queue.Full:
            self.dropped += 1

    def _drain(self) -> None:
        while (item := self._q.get()) is not None:
            kind, fields = item
            step = fields.get("step")
            if not isinstance(step, int):
                continue
            values = step_values(kind, fields)
            for sink in list(self.sinks):
                try:
                    if values:
                        sink.log(step, values)
                    if kind == "end":
                        sink.note(step, "end", f"{fields.get('reason')} at step {step}")
                except Exception as e:  # noqa: BLE001 - a tracker never stops the run
                    self._fail(sink, e)

    def _fail(self, sink: Sink, e: Exception) -> None:
        self.failures.append(f"{sink.name}: {type(e).__name__}: {e}")
        print(f"warning: tracker {sink.name} failed and is off: {e}", file=sys.stderr, flush=True)
        self.sinks.remove(sink)
        try:
            sink.close(self.dropped)
        except Exception:  # noqa: BLE001 - already reported
            pass

    def close(self) -> None:
        self._q.put(None)  # blocks only while the thread drains a full queue
        self._thread.join(CLOSE_TIMEOUT_S)
        for sink in list(self.sinks):
            try:
                sink.close(self.dropped)
            except Exception as e:  # noqa: BLE001
                self._fail(sink, e)


class MirroredEvents:
    """An event writer whose events also reach a Mirror (the writer's other methods as they are)."""

    def __init__(self, writer, mirror: Mirror):
        self._writer, self.mirror = writer, mirror

    def emit(self, kind: str, **fields: Any):
        out = self._writer.emit(kind, **fields)
        self.mirror.put(kind, fields)
        return out

    def close(self) -> None:
        self._writer.close()
        self.mirror.close()

    def __getattr__(self, name: str):
        return getattr(self._writer, name)


def mirrored(writer, spec: RunSpec, run_dir: Path, rank: int):
    """`writer` itself, or on rank 0 with a tracker configured, writer + a Mirror. A tracker
    that cannot start (its package missing, a bad URI) is reported and left out."""
    if rank != 0:
        return writer
    sinks, problems = open_sinks(spec, Path(run_dir))
    for p in problems:
        print(f"warning: {p}", file=sys.stderr, flush=True)
    return MirroredEvents(writer, Mirror(sinks)) if sinks else writer
