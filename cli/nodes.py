"""`tunedeck nodes RUN [--json]`: every node of a multi-node run, as the head sees it."""

from __future__ import annotations

from tunedeck.core.api import (
    clean,
    find_run,
    format_node_rows,
    node_rows,
    print_json,
    read_findings,
)


def register(subparsers) -> None:
    s = subparsers.add_parser(
        "nodes",
        help="each node of a run: host, status, link, ranks, step, slowest rank, GPUs, findings",
    )
    s.add_argument("run", help="run id, unique prefix or name")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_nodes)


def cmd_nodes(args) -> int:
    run = find_run(args.run)
    try:
        findings = read_findings(run.run_dir)
    except Exception:  # no run.db yet: the nodes still show
        findings = []
    rows = node_rows(run.run_dir, findings)
    if args.json:
        print_json(rows)
        return 0
    for line in format_node_rows(rows):
        print(clean(line))
    return 0
