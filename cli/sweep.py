"""`tunedeck sweep SPEC --grid KEY=V1,V2 ... [--set K=V] [--random N --seed S] [--parallel K]
[--median-after STEPS] [--wait] [--json]`: one queued run per point, K live at a time;
`tunedeck sweep show ID [--json]`: the sweep's table."""

from __future__ import annotations

import json
import sys
import time
from contextlib import suppress

from tunedeck.cli.common import EXIT_USAGE, add_set, err
from tunedeck.core.api import (
    TERMINAL,
    RunNotFound,
    clean,
    create_sweep,
    find_run,
    fmt_loss,
    parse_grid,
    print_json,
    sweep_rows,
    wait_settled,
)
from tunedeck.core.spec import SpecError


def register(sub) -> None:
    s = sub.add_parser(
        "sweep", help="one queued run per grid point (`sweep show ID`: the sweep's table)"
    )
    s.add_argument("target", nargs="+", metavar="SPEC | show ID")
    s.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2")
    add_set(s, "a spec key set for every point (repeatable)")
    s.add_argument("--random", type=int, default=0, metavar="N", help="N points of the grid")
    s.add_argument("--seed", type=int, default=0, help="seed of --random")
    s.add_argument("--parallel", type=int, default=1, metavar="K", help="runs live at once")
    s.add_argument(
        "--median-after",
        type=int,
        default=0,
        metavar="STEPS",
        help="stop a run worse than the median of its siblings at the same step, past STEPS "
        "(0: never)",
    )
    s.add_argument("--wait", action="store_true", help="block until every point has ended")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_sweep)


def cmd_sweep(args) -> int:
    if args.target[0] == "show":
        if len(args.target) != 2:
            err("usage: tunedeck sweep show ID [--json]")
            return EXIT_USAGE
        return show(args.target[1], args.json)
    if len(args.target) != 1 or not args.grid:
        err("usage: tunedeck sweep SPEC --grid KEY=V1,V2 [--grid ...]")
        return EXIT_USAGE
    try:
        rec = create_sweep(
            args.target[0],
            parse_grid(args.grid),
            args.set,
            parallel=args.parallel,
            n=args.random,
            seed=args.seed,
            median_after=args.median_after,
        )
    except SpecError as e:
        err(e)
        return EXIT_USAGE
    if args.json and not args.wait:
        print(json.dumps({"sweep": rec["id"], "runs": [p["run_id"] for p in rec["points"]]}))
    elif not args.json:
        print(rec["id"])
    if not args.wait:
        return 0
    # a point whose run was removed meanwhile is "missing": nothing to wait for
    ended = (*TERMINAL, "missing")
    while True:
        rows = sweep_rows(rec["id"])
        if all(r["status"] in ended for r in rows):
            break
        time.sleep(1.0)
    for r in rows:
        if r["status"] != "missing":
            with suppress(RunNotFound):  # deleted since
                wait_settled(find_run(r["run_id"]))
    return show(rec["id"], args.json)


def show(sweep_id: str, as_json: bool) -> int:
    rows = sweep_rows(sweep_id)
    if as_json:
        print_json({"sweep": sweep_id, "points": rows})
        return 0
    keys = list(rows[0]["settings"]) if rows else []
    head = ["#", *keys, "status", "step", "best eval", "final loss", "tok/s", "run"]
    lines = [head]
    for r in rows:
        tps = f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] is not None else "-"
        lines.append(
            [
                str(r["point"]),
                *(str(r["settings"][k]) for k in keys),
                r["status"],
                str(r["step"]),
                fmt_loss(r["best_eval_loss"]),
                fmt_loss(r["final_loss"]),
                tps,
                r["run_id"],
            ]  # fmt: skip
        )
    widths = [max(len(clean(x)) for x in col) for col in zip(*lines)]
    for line in lines:
        print("  ".join(clean(x).ljust(w) for x, w in zip(line, widths)).rstrip())
    for r in rows:
        if r["status"] != "succeeded" and r["message"]:
            print(f"#{r['point']}: {clean(r['message'])}", file=sys.stderr)
    return 0
