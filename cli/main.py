"""`tunedeck` command line: the parser assembled from the verbs' modules, and the one place a
verb's error becomes a line. Without a verb it opens the TUI.

Only the core's light part (never torch, never textual) is imported at start, so `tunedeck ls`
answers in a fraction of a second on a login node; textual is imported only to open the TUI.

Names, statuses and messages (from run files and from the user) are printed through
`tunedeck.core.api.clean`: no escape sequence or bidi control reaches the terminal. No verb
prints a traceback: an unexpected error is one line (TUNEDECK_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys

from tunedeck.cli import (
    again,
    chat,
    alerts,
    delete,
    demo,
    diagnose,
    doctor,
    estimate,
    export_model,
    importexport,
    launch,
    logs,
    ls,
    metrics,
    nodes,
    preflight,
    queue,
    stacks,
    status,
    stop,
    tb,
    sweep,
    tui,
)
from tunedeck.cli.common import err, one_line
from tunedeck.core.api import RunNotFound, runs_root

# Each verb's module has register(subparsers); `tunedeck --help` lists them in this order.
VERBS = (
    launch,
    ls,
    status,
    metrics,
    logs,
    stop,
    demo,
    tui,
    preflight,
    estimate,
    diagnose,
    importexport,
    stacks,
    doctor,
    nodes,
    delete,
    again,
    export_model,
    chat,
    tb,
    alerts,
    queue,
    sweep,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tunedeck",
        description="Launch, watch and stop distributed fine-tuning runs. "
        f"Runs live under $TUNEDECK_HOME/runs (now {runs_root()}).",
    )
    p.add_argument("--readonly", action="store_true", help="TUI without stop actions")
    sub = p.add_subparsers(dest="cmd")
    for mod in VERBS:
        mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func = getattr(args, "func", tui.cmd_tui)
    try:
        return func(args)
    except RunNotFound as e:
        err(e)
        return 1
    except sqlite3.DatabaseError as e:  # a damaged run.db: that run's verbs say so, in a line
        run = getattr(args, "run", None)
        err(
            f"a run's database (run.db) cannot be read: {e}; `tunedeck doctor"
            f"{' ' + run if run else ''}` says what else is damaged"
        )
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - no verb prints a traceback on any input
        if os.environ.get("TUNEDECK_DEBUG"):
            raise
        err(f"{one_line(e)} ({type(e).__name__}; TUNEDECK_DEBUG=1 shows where)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
