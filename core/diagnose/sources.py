"""Which files of a run diagnosis reads: torchrun's own logs, every rank's output and error
files, logs a user put beside the run, and the metric streams. The layout itself is
tunedeck.core.rundir's."""

from __future__ import annotations

from pathlib import Path

from tunedeck.core.rundir import RunDir, Source, event_rank


def run_sources(run: RunDir | Path) -> list[Source]:
    run = run if isinstance(run, RunDir) else RunDir(run)
    events = [Source(p, event_rank(p), kind="events") for p in run.event_files()]
    jsonl = [Source(p, 0, kind="jsonl") for p in run.logging_jsonl_files()]
    return [*run.torchrun_logs(), *run.rank_logs(), *run.user_logs(), *events, *jsonl]
