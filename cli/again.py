"""`tunedeck resume RUN` and `tunedeck clone RUN`: a new run from an ended one, as the runs
screen's R and c make it, then the preflight gate and the launch (`launch`'s --set, --wait,
--no-preflight and --json). Resume continues from the run's newest complete checkpoint into
the same output folder; clone starts from step 0 into a folder of its own. What the user should
know about the new spec (a cleared resume_from, a checkpoint already at max_steps, a script
that must read TUNEDECK_RESUME_FROM) is printed before the launch.

Both refuse a run that has not ended, and the launch refuses an output folder a live run writes
(two resumes of one run would share it): `--share-output` launches anyway, recorded in the new
run's state.json (`output_shared_with`).
"""

from __future__ import annotations

import json
import sys

from tunedeck.cli.common import EXIT_USAGE, add_set, gated_launch, say_shared, wait
from tunedeck.core.api import ManageError, clean, clone_spec, find_run, resume_spec
from tunedeck.core.spec import SpecError, cross_checks, parse_override, set_values


def register(subparsers) -> None:
    for name, hlp in (
        (
            "resume",
            "continue a stopped or failed run from its newest complete "
            "checkpoint (a new run, same output folder)",
        ),
        (
            "clone",
            "start a new run with an ended run's spec, from step 0 (a "
            "running run is refused: stop it first)",
        ),
    ):
        s = subparsers.add_parser(name, help=hlp, description=hlp)
        s.add_argument("run", help="run id, unique prefix or name")
        add_set(s, "override a key of the new run's spec (repeatable)")
        s.add_argument(
            "--wait",
            action="store_true",
            help="block until the new run ends; exit 0 only if it succeeded",
        )
        s.add_argument(
            "--no-preflight",
            action="store_true",
            help="launch without the preflight checklist (the run records it)",
        )
        s.add_argument(
            "--share-output",
            action="store_true",
            help="launch even though a "
            "live run writes the output folder (refused by default; the new run "
            "records the runs it shares it with)",
        )
        s.add_argument(
            "--json",
            action="store_true",
            help="print the new run's id as one JSON line; with --wait, the ended run as a second",
        )
        s.set_defaults(func=cmd_again, make=name)


def cmd_again(args) -> int:
    run = find_run(args.run)
    try:
        made = (resume_spec if args.make == "resume" else clone_spec)(run)
        spec = set_values(made.spec, dict(parse_override(o) for o in args.set))
        problems = cross_checks(spec)
        if problems:
            raise SpecError(problems)
    except (ManageError, SpecError) as e:
        print(
            f"tunedeck: cannot {args.make} {clean(run.run_id)}: {clean(e, multiline=True)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if made.checkpoint is not None:
        print(
            f"{args.make} {clean(run.run_id)} from {clean(made.checkpoint.path)}", file=sys.stderr
        )
    for note in made.notes:
        print(f"note: {clean(note)}", file=sys.stderr)
    run_dir = gated_launch(args, spec)
    if run_dir is None:
        return 1
    say_shared(run_dir)
    if args.json:
        print(
            json.dumps(
                {
                    "run_id": run_dir.name,
                    "run_dir": str(run_dir),
                    "from": run.run_id,
                    "checkpoint": str(made.checkpoint.path) if made.checkpoint else None,
                }
            ),
            flush=True,
        )
    else:
        print(run_dir.name)
    return wait(run_dir.name, quiet=args.json) if args.wait else 0
