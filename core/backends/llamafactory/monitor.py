"""LLaMA-Factory's trainer_log.jsonl (written by rank 0's LogCallback into the output folder)
→ tunedeck's step and eval events in events/rank0.jsonl.

A line holds current_steps, total_steps, loss, eval_loss, lr, epoch, throughput (tokens/s,
with include_num_input_tokens_seen), percentage, elapsed/remaining time; the keys without a
value are left out. The last line of a finished run repeats the last step without a loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunedeck.core.ingest.tail import Tail
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.events import EventWriter, from_record

LOG_NAME = "trainer_log.jsonl"


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def record_of(line: dict[str, Any]) -> dict[str, Any] | None:
    """One trainer_log.jsonl line as a normalised metrics record (from_record's input)."""
    step = line.get("current_steps")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    rec: dict[str, Any] = {"step": step}
    for src, dst in (
        ("loss", "loss"),
        ("eval_loss", "eval_loss"),
        ("lr", "learning_rate"),
        ("epoch", "epoch"),
        ("throughput", "tokens_per_s"),
    ):
        if _num(line.get(src)):
            rec[dst] = line[src]
    if _num(line.get("total_steps")) and line["total_steps"] > 0:
        rec["max_steps"] = int(line["total_steps"])
    return rec


def events_of(line: dict[str, Any]) -> list[dict[str, Any]]:
    """The events one line makes: a step (with a loss), an eval (with an eval loss), or both."""
    rec = record_of(line)
    if rec is None:
        return []
    out = []
    ev = from_record(rec)
    if ev:
        out.append(ev)
    if "loss" in rec and "eval_loss" in rec:  # from_record keeps the step only
        out.append({"kind": "eval", "step": rec["step"], "eval_loss": rec["eval_loss"]})
    return out


class TrainerLogMonitor:
    """Tails <output>/trainer_log.jsonl into events/rank0.jsonl. LLaMA-Factory appends to the
    file on a resume and starts it over on overwrite_output_dir; a restarted attempt's
    repeats of earlier steps replace them (run.db keeps one row per rank and step)."""

    def __init__(self, run: RunDir, output_dir: Path):
        self.path = Path(output_dir) / LOG_NAME
        self.writer = EventWriter(run.path, 0, dedupe_steps=True)
        self.tail: Tail | None = None
        self.finished = False
        self.total: int | None = None

    def _read(self) -> None:
        if self.tail is None:
            if not self.path.exists():
                return
            self.tail = Tail(self.path)
        for line in self.tail.records():
            if not isinstance(line, dict):
                continue
            rec = record_of(line)
            if rec and rec.get("max_steps"):
                self.total = rec["max_steps"]
            for ev in events_of(line):
                self.writer.emit(**ev)
            if (
                rec
                and "loss" not in rec
                and "eval_loss" not in rec
                and self.total
                and rec["step"] >= self.total
            ):
                self.finished = True  # the closing line of a run that reached its last step

    def tick(self, now: float, new_events: list) -> None:
        self._read()

    def restarted(self, step: int) -> None:
        self._read()
        self.finished = False
        self.writer.restart_at(step)

    def close(self, new_events: list) -> None:
        self._read()
        if self.finished:
            self.writer.emit("end", step=self.writer.last_step, reason="completed")
        self.writer.close()


__all__ = ["TrainerLogMonitor", "events_of", "record_of", "LOG_NAME"]
