"""Which files of a run directory to read, and whose they are (rank, node, attempt).

Layout (docs/run-directory.md): torchrun's own output in logs/torchrun-node<k>.log and each
rank's output in logs/node<k>/<id>_<x>/attempt_<n>/<local_rank>/{stdout,stderr}.log, with the
error.json a failing rank wrote next to them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Source:
    path: Path
    rank: int | None = None
    node: int | None = None
    attempt: int | None = None
    kind: str = "log"          # log | torchrun | error_json | events | jsonl


def _plan_nproc(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "plan.json").read_text()).get("nproc_per_node") or 0)
    except (OSError, ValueError, AttributeError):
        return 0


def _dir_nproc(node_dir: Path) -> int:
    """Without a plan: one more than the highest local rank folder."""
    locals_ = [int(p.name) for p in node_dir.glob("*/attempt_*/*") if p.name.isdigit()]
    return max(locals_) + 1 if locals_ else 1


def _node_of(name: str) -> int | None:
    tail = name[4:] if name.startswith("node") else ""
    return int(tail) if tail.isdigit() else None


def rank_logs(run_dir: Path, latest_only: bool = False) -> list[Source]:
    """stdout/stderr/error.json of every rank, ordered by (attempt, rank)."""
    out: list[Source] = []
    plan_nproc = _plan_nproc(run_dir)
    for node_dir in sorted((run_dir / "logs").glob("node*")):
        node = _node_of(node_dir.name)
        if node is None or not node_dir.is_dir():
            continue
        nproc = plan_nproc or _dir_nproc(node_dir)
        # Each agent attempt is a torchrun invocation with its own <id>_<x>/ folder (torchrun's
        # own restarts, attempt_<n>, inside it): in time order they number the attempts.
        invocations = sorted((p for p in node_dir.iterdir() if p.is_dir()),
                             key=lambda p: p.stat().st_mtime)
        attempts = [a for inv in invocations
                    for a in sorted(inv.glob("attempt_*"), key=lambda p: _attempt(p.name))]
        first = 0
        if latest_only and attempts:
            first, attempts = len(attempts) - 1, attempts[-1:]
        for i, att in enumerate(attempts, first):
            for local_dir in sorted((p for p in att.iterdir() if p.name.isdigit()),
                                    key=lambda p: int(p.name)):
                rank = node * nproc + int(local_dir.name)
                for name, kind in (("stdout.log", "log"), ("stderr.log", "log"),
                                   ("error.json", "error_json")):
                    p = local_dir / name
                    if p.exists():
                        out.append(Source(p, rank, node, i, kind))
    out.sort(key=lambda s: (s.attempt or 0, s.rank or 0))
    return out


def _attempt(name: str) -> int:
    tail = name.rpartition("_")[2]
    return int(tail) if tail.isdigit() else 0


def run_sources(run_dir: Path) -> list[Source]:
    """Everything diagnosis reads: torchrun logs, rank logs and error files, metric streams."""
    out = [Source(p, None, _node_of(p.stem.rpartition("-")[2]), None, "torchrun")
           for p in sorted((run_dir / "logs").glob("torchrun-node*.log"))]
    out += rank_logs(run_dir)
    # logs a user put next to the run (console captures of tools launched by hand)
    out += [Source(p, None, None, None, "log") for p in sorted(run_dir.glob("*.log"))]
    out += [Source(p, int(p.stem[4:]) if p.stem[4:].isdigit() else None, None, None, "events")
            for p in sorted((run_dir / "events").glob("rank*.jsonl"))]
    out += [Source(p, 0, None, None, "jsonl") for p in logging_jsonl_files(run_dir)]
    return out


def logging_jsonl_files(run_dir: Path, max_depth: int = 4) -> list[Path]:
    """ms-swift's logging.jsonl files (output/v0-<date>/logging.jsonl). The agent looks every
    few seconds, so checkpoint folders (hundreds on a long run), logs and events are not
    walked."""
    found = []
    base = len(run_dir.parts)
    for root, dirs, files in os.walk(run_dir):
        depth = len(Path(root).parts) - base
        dirs[:] = [] if depth >= max_depth else sorted(
            d for d in dirs if not (d.startswith(("checkpoint-", ".")) or
                                    (depth == 0 and d in ("logs", "events"))))
        if "logging.jsonl" in files:
            found.append(Path(root) / "logging.jsonl")
    return sorted(found)


def source_for_file(path: Path) -> Source:
    """A lone file given on the command line: guess its kind from the name."""
    name = path.name
    if name == "error.json":
        kind = "error_json"
    elif name.startswith("rank") and name.endswith(".jsonl"):
        kind = "events"
    elif name == "logging.jsonl":
        kind = "jsonl"
    elif name.startswith("torchrun-node"):
        kind = "torchrun"
    else:
        kind = "log"
    rank = int(name[4:-6]) if kind == "events" and name[4:-6].isdigit() else None
    return Source(path, rank, None, None, kind)
