"""`tunedeck demo [--no-tui]`: launch the demo preset (unless one is already running) and
open it in the TUI."""

from __future__ import annotations

import sys

from tunedeck.cli.common import EXIT_USAGE, err, gated_launch, wait
from tunedeck.cli.tui import cmd_tui
from tunedeck.core.api import PRESETS_DIR, clean, list_runs
from tunedeck.core.spec import SpecError, load_spec


def register(sub) -> None:
    s = sub.add_parser("demo", help="launch the CPU/GPU demo run and watch it in the TUI")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--no-tui", action="store_true", help="wait in the terminal instead")
    s.add_argument(
        "--no-preflight",
        action="store_true",
        help="launch without the preflight checklist (the run records it)",
    )
    s.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    active = [r for r in list_runs() if r.name == "demo" and r.active]
    if active:
        run_id = active[0].run_id
    else:
        args.spec, args.json = PRESETS_DIR / "demo.toml", False
        try:
            spec = load_spec(args.spec, args.set)
        except SpecError as e:
            err(e)
            return EXIT_USAGE
        run_dir = gated_launch(args, spec)  # the same checklist as every launch
        if run_dir is None:
            return 1
        run_id = run_dir.name
        print(f"launched {clean(run_id)}", file=sys.stderr)
    if args.no_tui:
        return wait(run_id)
    args.open_run = run_id
    return cmd_tui(args)
