"""`tunedeck preflight SPEC`: the checklist in the terminal; exit 1 when any check fails."""

from __future__ import annotations

import sys

from tunedeck.cli.common import add_set
from tunedeck.core.api import (
    clean,
    make_context,
    print_json,
    run_checks,
    smoke_run,
    summary,
    summary_line,
)
from tunedeck.core.spec import SpecError

MARK = {"pass": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def register(sub) -> None:
    s = sub.add_parser("preflight", help="check a spec on this node before launching it")
    s.add_argument("spec", help="spec file, e.g. presets/demo.toml")
    add_set(s)
    s.add_argument(
        "--smoke",
        action="store_true",
        help="then launch the real run for a few steps and wait for it (only when no check failed)",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_preflight)


def cmd_preflight(args) -> int:
    try:
        ctx = make_context(args.spec, args.set)
    except SpecError as e:
        print(f"tunedeck: {e}", file=sys.stderr)
        return 2
    results = []
    for r in run_checks(ctx):
        results.append(r)
        if not args.json:
            _print(r)
    failed = any(r.status == "fail" for r in results)
    if args.smoke:
        if failed:
            print("tunedeck: smoke run skipped: fix the failed checks first", file=sys.stderr)
        else:
            r = smoke_run(
                ctx.spec,
                on_status=None
                if args.json
                else (lambda line: print(f"      {line}", file=sys.stderr)),
            )
            results.append(r)
            if not args.json:
                _print(r)
            failed = r.status == "fail"
    counts = summary(results)
    if args.json:
        print_json({"ok": not failed, "summary": counts, "checks": [r.to_json() for r in results]})
    else:
        print("\n" + summary_line(counts))
    return 1 if failed else 0


def _print(r) -> None:
    print(f"[{MARK[r.status]}] {r.title}  ({r.id})")
    for line in r.detail.splitlines():  # details quote data rows and paths: cleaned
        print(f"       {clean(line)}")
    if r.fix and r.status in ("warn", "fail"):
        print(f"       fix: {clean(r.fix)}")
    sys.stdout.flush()
