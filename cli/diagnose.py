"""`tunedeck diagnose RUN_OR_FILE... [--json]`: findings with cause and fix.

Read-only, so it works on a running run too. For a run, findings the agent stored in run.db
(live detectors: starvation, stall, straggler) are merged with those from its logs.
"""

from __future__ import annotations

import sys

from tunedeck.core.api import clean, diagnose, print_json

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


def cmd_diagnose(args) -> int:
    try:
        findings = diagnose(args.targets)
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
