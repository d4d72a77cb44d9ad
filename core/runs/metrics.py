"""Per-step metrics of a run (all ranks, de-duplicated by step) and of `tunedeck metrics`'s
argument, whatever it names: a run id/prefix/name, a run directory or a log file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunedeck.core.ingest.metrics import FileMetrics, MetricsParser, merge_by_step, \
    records_from_file
from tunedeck.core.rundir import RunDir, event_rank
from tunedeck.core.runs.store import Store


def run_metric_files(run: RunDir) -> list[tuple[Path, int | None]]:
    """The best metric source of a run: built-in events, else ms-swift logging.jsonl, else the
    ranks' own output (latest attempt), as (path, rank) in rank order."""
    events = run.event_files()
    if events:
        return [(p, event_rank(p)) for p in events]
    jsonl = run.logging_jsonl_files()
    if jsonl:
        return [(jsonl[-1], 0)]
    logs = run.rank_logs(latest_only=True)
    return [(s.path, s.rank) for s in logs if s.path.name == "stdout.log"] or \
        [(s.path, s.rank) for s in logs if s.kind == "log"]


def records_from_run(run_dir: str | Path | RunDir) -> list[dict[str, Any]]:
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    if not run.path.is_dir():
        raise FileNotFoundError(f"no such run directory: {run.path}")
    if run.event_files():
        # event streams: what the agent already ingested into run.db plus what it has not
        # read yet, so a week-long run is not re-parsed from its files on every call
        return merge_by_step(_records_from_events(run))
    per_source = []
    for path, rank in run_metric_files(run):
        fm = FileMetrics(path, rank)
        fm.poll(final=True)
        per_source.append(fm.records())
    return merge_by_step(per_source)


def _records_from_events(run: RunDir) -> list[list[dict[str, Any]]]:
    by_rank: dict[int, list[dict[str, Any]]] = {}
    with Store(run) as store:
        events = store.events()
    for e in events:
        rank = e.get("rank")
        by_rank.setdefault(rank if isinstance(rank, int) else -1, []).append(e)
    out = []
    for rank in sorted(by_rank, key=lambda r: (r < 0, r)):
        parser = MetricsParser(rank if rank >= 0 else None)
        parser.feed_dicts(by_rank[rank])
        out.append(parser.records())
    return out


def records(ref: str | Path) -> list[dict[str, Any]]:
    """`tunedeck metrics RUN_OR_FILE`: a file, a run directory, or a run id/prefix/name."""
    p = Path(ref)
    if p.is_file():
        return records_from_file(p)
    if p.is_dir():
        return records_from_run(p)
    from tunedeck.core.runs.registry import find_run

    return records_from_run(find_run(str(ref)).run_dir)
