"""`tunedeck logs RUN [--rank N] [-n LINES] [-f]`: a rank's log; what is missing is said, with
its path, on stderr and with exit 1 (an empty answer would read as "the rank printed
nothing")."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tunedeck.cli.common import err
from tunedeck.core.api import TERMINAL, clean, find_run, follow, log_tail


def register(sub) -> None:
    s = sub.add_parser("logs", help="print a rank's log")
    s.add_argument("run")
    s.add_argument("--rank", type=int, default=0)
    s.add_argument("-n", "--lines", type=int, default=200)
    s.add_argument("-f", "--follow", action="store_true")
    s.set_defaults(func=cmd_logs)


def cmd_logs(args) -> int:
    run = find_run(args.run)
    rid, rank, logs = clean(run.run_id), args.rank, run.run.logs
    if not logs.is_dir():
        err(f"{rid}: its logs folder is missing: {logs}")
        return 1
    plan = run.run.read_plan()
    try:
        world = int(plan.get("world_size") or 0) or int(plan.get("nproc_per_node") or 0) * int(
            plan.get("nnodes") or 0
        )
    except (TypeError, ValueError):
        world = 0
    if rank < 0 or (world and rank >= world):
        err(
            f"{rid} has no rank {rank}: its ranks are 0 to {world - 1}"
            if world
            else f"{rid} has no rank {rank}"
        )
        return 1
    nproc = run.run.nproc_per_node
    where = run.run.node_log_dir(rank // nproc if nproc else 0)
    if not args.follow:
        files = run.run.rank_log_files(rank)
        if not files:
            if run.active:  # not started yet: nothing is missing
                print(f"rank {rank} has written no log yet ({clean(run.status)})", file=sys.stderr)
                return 0
            err(f"{rid}: rank {rank} left no log under {where}")
            return 1
        if not any(p.is_file() for p in files):
            err(f"{rid}: rank {rank}'s log files are missing: {files[0].parent}")
            return 1
        for line in log_tail(run.run_dir, rank, args.lines):
            print(line)
        return 0
    files: list[Path] = []
    while not files:  # the rank may not have started yet
        files = run.run.rank_log_files(rank)
        if files:
            break
        if find_run(run.run_id).status in TERMINAL:
            err(f"{rid}: rank {rank} left no log under {where}")
            return 1
        time.sleep(0.5)
    for line in log_tail(run.run_dir, args.rank, args.lines):
        print(line, flush=True)
    try:
        for line in follow(files, stop=lambda: find_run(run.run_id).status in TERMINAL):
            print(line, flush=True)
    except KeyboardInterrupt:
        pass
    return 0
