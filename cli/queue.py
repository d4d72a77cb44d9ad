"""`tunedeck queue`: the runs waiting for GPUs in order (position 1 starts next), then the
queued runs that started and the GPUs they hold. `tunedeck stop RUN` takes one out."""

from __future__ import annotations

import time

from tunedeck.core.api import clean, fmt_age, print_json, queue_rows


def register(sub) -> None:
    s = sub.add_parser("queue", help="runs waiting for GPUs, in the order they start")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_queue)


def cmd_queue(args) -> int:
    rows = queue_rows()
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no run is queued")
        return 0
    for r in rows:
        where = f"#{r['position']}" if r["position"] else "GPUs " + ",".join(map(str, r["gpus"]))
        # a waiting run: how long it has waited; a started one: how long it has held its GPUs
        t = r.get("started") if not r["position"] else r["since"]
        age = fmt_age(time.time() - t) if t else "-"
        label = "queued" if r["position"] else "running"
        print(
            f"{where:<10} {r['run_id']:<34} {clean(r['name'])[:20]:<20} {r['status']:<8} "
            f"prio {r['priority']:<4} {label} {age}  {clean(r['message'])[:60]}"
        )
    return 0
