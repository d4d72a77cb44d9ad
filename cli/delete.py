"""`tunedeck delete RUN [--outputs PATH] [--dry-run] [--json]`: a finished run's records go
(spec, plan, state, logs, events, run.db); its output folder (checkpoints, adapters) stays
unless --outputs names that very folder, as the runs screen asks for it typed. A live run, an
output folder another run writes to or one holding the runs root are refused, nothing deleted.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tunedeck.core.api import (
    ManageError,
    clean,
    delete_run,
    find_run,
    plan_delete,
    print_json,
)


def register(subparsers) -> None:
    s = subparsers.add_parser(
        "delete",
        help="delete a finished run's records (its output folder only with --outputs naming it)",
    )
    s.add_argument("run", help="run id, unique prefix or name")
    s.add_argument(
        "--outputs",
        metavar="PATH",
        help="also delete the output folder: give its path, as --dry-run shows it",
    )
    s.add_argument("--dry-run", action="store_true", help="say what would go and stay")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_delete)


def cmd_delete(args) -> int:
    run = find_run(args.run)
    try:
        plan = plan_delete(run)
        if args.dry_run:
            return _show_plan(plan, args.json)
        done = delete_run(run, Path(args.outputs).expanduser() if args.outputs else None)
    except ManageError as e:
        print(f"tunedeck: {clean(str(e))}", file=sys.stderr)
        return 1
    if args.json:
        print_json(
            {
                "run_id": run.run_id,
                "removed": [str(p) for p in done.removed],
                "kept": str(done.kept) if done.kept else None,
            }
        )
        return 0
    print(f"deleted {clean(run.run_id)}: {len(done.removed)} file(s) and folder(s)")
    if done.kept is not None:
        n = plan.checkpoints
        print(
            f"kept its output folder {clean(str(done.kept))} ({n} complete checkpoint"
            f"{'' if n == 1 else 's'})"
            + (f": {clean(plan.outputs_kept_because)}" if plan.outputs_kept_because else "")
        )
    return 0


def _show_plan(plan, as_json: bool) -> int:
    if as_json:
        print_json(
            {
                "run_id": plan.run_id,
                "records": [str(p) for p in plan.records],
                "output_dir": str(plan.output_dir) if plan.output_dir else None,
                "checkpoints": plan.checkpoints,
                "outputs_deletable": plan.outputs_deletable,
                "outputs_kept_because": plan.outputs_kept_because or None,
            }
        )
        return 0
    print(
        f"{clean(plan.run_id)}: would delete {len(plan.records)} record file(s) and "
        f"folder(s) in {clean(str(plan.run_dir))}"
    )
    if plan.output_dir is None:
        print("no output folder on disk")
    elif plan.outputs_deletable:
        print(
            f"would keep the output folder {clean(str(plan.output_dir))} "
            f"({plan.checkpoints} complete checkpoint(s)); to delete it too: "
            f"--outputs {clean(str(plan.output_dir))}"
        )
    else:
        print(
            f"would keep the output folder {clean(str(plan.output_dir))}: "
            f"{clean(plan.outputs_kept_because)}"
        )
    return 0
