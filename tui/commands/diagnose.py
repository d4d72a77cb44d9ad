"""`tunedeck diagnose RUN_OR_FILE... [--json]`: findings with cause and fix.

Read-only, so it works on a running run too. For a run, findings the agent stored in run.db
(live detectors: starvation, stall, straggler) are merged with those from its logs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tunedeck.tui.format import clean, print_json

JSON_KEYS = (
    "category",
    "severity",
    "rank",
    "node",
    "host",
    "summary",
    "cause",
    "fix",
    "evidence",
    "root_cause",
    "source",
)


def register(subparsers) -> None:
    s = subparsers.add_parser("diagnose", help="explain failures: cause, evidence and fix")
    s.add_argument(
        "targets",
        nargs="+",
        metavar="RUN_OR_FILE",
        help="run id, unique prefix or name; a run directory; or log files",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_diagnose)


def collect(targets: list[str]) -> list:
    from tunedeck.core.diagnose.engine import diagnose_files, diagnose_run
    from tunedeck.core.diagnose.finding import Finding
    from tunedeck.core.runs.registry import find_run
    from tunedeck.core.runs.store import read_findings

    findings: list[Finding] = []
    files: list[Path] = []
    for ref in targets:
        p = Path(ref)
        if p.is_file():
            files.append(p)
            continue
        run_dir = p if p.is_dir() else find_run(ref).run_dir  # RunNotFound → cli prints it
        mine = diagnose_run(run_dir)
        seen = {f.key() for f in mine}  # per run: another run's finding is no duplicate
        for d in read_findings(run_dir):
            f = Finding.from_json(d)
            if f.key() not in seen:  # run.db keeps refined versions under one key
                mine.append(f)
                seen.add(f.key())
        findings += mine
    if files:
        findings += diagnose_files(files)
    return findings


def cmd_diagnose(args) -> int:
    try:
        findings = collect(args.targets)
    except FileNotFoundError as e:
        print(f"tunedeck: {e}", file=sys.stderr)
        return 1
    if args.json:
        print_json([{k: d[k] for k in JSON_KEYS} for d in (f.to_json() for f in findings)])
        return 0
    if not findings:
        print("no findings: nothing in the logs looks wrong")
        return 0
    for f in findings:
        where = " ".join(
            x
            for x in (
                f"node {f.node}" if f.node is not None else "",
                f"rank {f.rank}" if f.rank is not None else "",
            )
            if x
        )
        tag = (
            "ROOT CAUSE"
            if f.root_cause and f.severity == "error"
            else ("consequence" if not f.root_cause else f.severity)
        )
        # log lines are anyone's text: escape sequences never reach the terminal
        print(f"[{tag}] {f.category}{' (' + where + ')' if where else ''}: {clean(f.summary)}")
        print(f"  cause: {clean(f.cause)}")
        print(f"  fix:   {clean(f.fix)}")
        for e in f.evidence[:6]:
            print(f"    | {clean(e)}")
        print()
    return 0
