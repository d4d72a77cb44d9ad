"""`tunedeck stacks RUN [--rank N] [--json]`: what each rank of a running run is doing.

For a stalled run: the rank whose stack is not inside a collective is the one that hangs.
"""

from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    s = subparsers.add_parser("stacks", help="Python stack of every rank of a running run "
                                             "(py-spy, or the built-in trainer's own dump)")
    s.add_argument("run", help="run id, unique prefix or name")
    s.add_argument("--rank", type=int, action="append", help="only this rank (repeatable)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_stacks)


def cmd_stacks(args) -> int:
    from core.runs.registry import find_run
    from core.runs.stacks import dump_stacks, suspects
    from core.runs.store import read_findings

    run = find_run(args.run)   # RunNotFound → cli prints it
    try:
        dumps = dump_stacks(run.run_dir, ranks=args.rank)
    except ValueError as e:
        print(f"tunedeck: {e}", file=sys.stderr)
        return 1
    if args.json:
        json.dump([d.to_json() for d in dumps], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    odd = suspects(dumps)
    for d in dumps:
        where = ("waiting in a collective" if d.in_collective else
                 "NOT in a collective: the others wait for it" if d in odd else "")
        print(f"=== rank {d.rank} (pid {d.pid}, {d.method})" + (f": {where}" if where else ""))
        print(d.text)
        print()
    # the agent's stall finding names a hung rank from GPU telemetry too
    for f in read_findings(run.run_dir):
        if f.get("category") == "stall":
            print(f"stall finding: {f.get('summary')}")
    return 0
