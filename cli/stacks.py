"""`tunedeck stacks RUN [--rank N] [--json]`: what each rank of a running run is doing.

For a stalled run: the rank whose stack is not inside a collective is the one that hangs.
"""

from __future__ import annotations

import sys

from tunedeck.core.api import (
    dump_stacks,
    find_run,
    print_json,
    read_findings,
    stack_suspects,
    stack_where,
)


def register(subparsers) -> None:
    s = subparsers.add_parser(
        "stacks",
        help="Python stack of every rank of a running run "
        "(py-spy, or the built-in trainer's own dump)",
    )
    s.add_argument("run", help="run id, unique prefix or name")
    s.add_argument("--rank", type=int, action="append", help="only this rank (repeatable)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_stacks)


def cmd_stacks(args) -> int:
    run = find_run(args.run)  # RunNotFound → cli prints it
    try:
        dumps = dump_stacks(run.run_dir, ranks=args.rank)
    except ValueError as e:
        print(f"tunedeck: {e}", file=sys.stderr)
        return 1
    if args.json:
        print_json([d.to_json() for d in dumps])
        return 0
    odd = stack_suspects(dumps)
    for d in dumps:
        label = stack_where(d, odd)
        print(f"=== rank {d.rank} (pid {d.pid}, {d.method})" + (f": {label}" if label else ""))
        print(d.text)
        print()
    # the agent's stall finding names a hung rank from GPU telemetry too
    for f in read_findings(run.run_dir):
        if f.get("category") == "stall":
            print(f"stall finding: {f.get('summary')}")
    return 0
