"""`tunedeck stop RUN [--hard] [--grace S] [--wait] [--json]`: the agent carries the stop out
(graceful: a checkpoint, then SIGKILL after the grace); waiting for the end is `--wait`."""

from __future__ import annotations

import argparse
import math

from tunedeck.cli.common import err
from tunedeck.core.api import TERMINAL, ForeignRun, clean, find_run, print_json, stop


def register(sub) -> None:
    s = sub.add_parser("stop", help="stop a run: graceful (checkpoint) then SIGKILL after grace")
    s.add_argument("run")
    s.add_argument("--hard", action="store_true", help="SIGKILL every process of the run now")
    s.add_argument("--grace", type=grace_seconds, help="seconds before a graceful stop escalates")
    s.add_argument(
        "--wait",
        action="store_true",
        help="wait until the run has ended (exit 1 if it did not in time)",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_stop)


def grace_seconds(text: str) -> float:
    """--grace: a finite number of seconds, 0 or more (nan/inf would never escalate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def cmd_stop(args) -> int:
    run = find_run(args.run)
    if run.damaged:
        err(
            f"{clean(run.run_id)} is {clean(run.message)}: its processes cannot be told, so "
            f"nothing is signalled (`tunedeck doctor {clean(run.run_id)}`)"
        )
        return 1
    if run.foreign:  # another user's run: its pids and plan are not this user's to act on
        err(
            f"{clean(run.run_id)} is {clean(run.message)}: only its owner can stop it, so "
            f"nothing is signalled"
        )
        return 1
    if not run.needs_stop:
        if args.json:
            print_json(run.to_json())
        else:
            print(f"{run.run_id} is already {run.status}")
        return 0
    how = "hard" if args.hard else "graceful"
    # The agent carries the stop out; waiting for the end is the user's choice (--wait).
    try:
        done = stop(run, hard=args.hard, grace_s=args.grace, wait=args.wait)
    except ForeignRun as e:  # became another user's since it was read: nothing was signalled
        err(e)
        return 1
    if args.json:
        print_json(done.to_json())
    elif args.wait:
        print(f"{done.run_id}: {done.status} ({done.message})")
    else:
        print(
            f"{done.run_id}: {how} stop requested; the agent carries it out "
            f"(`tunedeck status {done.run_id}`, or `stop --wait` to wait for the end)"
        )
    if not args.wait:
        return 0
    return 0 if done.status in TERMINAL else 1
