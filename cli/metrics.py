"""`tunedeck metrics RUN_OR_FILE [--since STEP] [--every N] [--last N] [--json]`: per-step
loss, lr, grad norm and throughput, streamed (a week-long run is never held whole)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from itertools import chain

from tunedeck.core.api import RunNotFound, fmt_loss, iter_records, write_json


def register(sub) -> None:
    s = sub.add_parser("metrics", help="per-step loss, lr, throughput")
    s.add_argument("run", help="run id, unique prefix, or name; also a run directory or a log file")
    s.add_argument("--json", action="store_true")
    # only what a script or a view shows, read in SQL
    s.add_argument("--since", type=step_arg(0), metavar="STEP", help="steps from STEP on")
    s.add_argument(
        "--every", type=step_arg(1), metavar="N", help="only steps that are multiples of N"
    )
    s.add_argument("--last", type=step_arg(1), metavar="N", help="the last N steps")
    s.set_defaults(func=cmd_metrics)


def step_arg(low: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{n} is below {low}")
        return n

    return parse


def cmd_metrics(args) -> int:
    try:  # a run id/prefix/name, a run directory, or a log/metrics file of any known format
        recs = iter_records(
            args.run, since=args.since, every=args.every, last=args.last, text=args.json
        )
        plain = recs.plain
        first = next(recs, None)  # a bad line of a file fails here, before any output
    except FileNotFoundError as e:
        raise RunNotFound(str(e)) from None
    recs = chain(() if first is None else (first,), recs)
    # the stream makes ~13 objects a row and no cycles: the collector's passes over them
    # (a tenth of the CPU of a 1M-step --json) find nothing
    gc.disable()
    try:  # streamed: a week-long run is never held whole, `| head` stops it early
        if args.json:
            write_json(recs, sys.stdout, plain=plain)
            return 0
        out = [f"{'STEP':>6} {'LOSS':>9} {'LR':>10} {'GRAD':>8} {'TOK/S':>9}\n"]
        for r in recs:
            out.append(
                f"{r['step']:>6} {fmt_loss(r.get('loss')):>9} "
                f"{r.get('learning_rate') or 0:>10.3e} {r.get('grad_norm') or 0:>8.3f} "
                f"{r.get('tokens_per_s') or 0:>9.0f}\n"
            )
            if len(out) >= 4096:
                sys.stdout.write("".join(out))
                out.clear()
        sys.stdout.write("".join(out))
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
