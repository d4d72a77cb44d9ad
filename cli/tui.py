"""`tunedeck tui [--readonly]`, also what `tunedeck` without a verb does: open the TUI. Textual
is imported only here, when the TUI opens."""

from __future__ import annotations

import os
import sys

from tunedeck.cli.common import EXIT_USAGE


def register(sub) -> None:
    s = sub.add_parser("tui", help="open the TUI (the default)")
    s.set_defaults(func=cmd_tui)


def cmd_tui(args) -> int:
    if not sys.stdout.isatty() and not os.environ.get("TUNEDECK_FORCE_TUI"):
        print("tunedeck: the TUI needs a terminal; try `tunedeck ls`", file=sys.stderr)
        return EXIT_USAGE
    from tunedeck.tui.app import TunedeckApp

    TunedeckApp(open_run=getattr(args, "open_run", None), readonly=args.readonly).run()
    return 0
