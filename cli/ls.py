"""`tunedeck ls [--json]`: every run, newest first; a damaged run says what is wrong."""

from __future__ import annotations

import sys
import time

from tunedeck.cli.common import stale_note
from tunedeck.core.api import clean, fmt_age, fmt_loss, list_runs, print_json, runs_root
from tunedeck.core.rundir.ownership import root_problem


def register(sub) -> None:
    s = sub.add_parser("ls", help="list runs")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_ls)


def cmd_ls(args) -> int:
    unsafe = root_problem(runs_root())
    if unsafe:  # on stderr, so --json stays one document
        print(f"warning: {clean(unsafe)}", file=sys.stderr)
    runs = list_runs()
    if args.json:
        print_json([r.to_json() for r in runs])
        return 0
    if not runs:
        print(f"no runs under {clean(runs_root())}")
        return 0
    now = time.time()
    names = {r.run_id: clean(r.name) for r in runs}
    width = max([4] + [len(n) for n in names.values()])
    print(f"{'RUN':<32} {'NAME':<{width}} {'STATUS':<10} {'STEP':>13} {'LOSS':>8} {'AGE':>5}")
    for r in runs:
        if r.damaged:  # what is wrong instead of numbers it does not have
            print(f"{clean(r.run_id):<32} {names[r.run_id]:<{width}} {clean(r.message)}")
            continue
        print(
            f"{clean(r.run_id):<32} {names[r.run_id]:<{width}} {clean(r.status):<10} "
            f"{f'{r.step}/{r.max_steps}':>13} {fmt_loss(r.loss):>8} "
            f"{fmt_age(r.age_s(now)):>5}" + stale_note(r)
        )
    damaged = sum(r.damaged for r in runs)
    if damaged:
        print(
            f"{damaged} damaged run(s): `tunedeck doctor RUN` says what is wrong", file=sys.stderr
        )
    return 0
