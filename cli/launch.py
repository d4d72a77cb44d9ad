"""`tunedeck launch SPEC`: the preflight gate, then a run (`--dry-run`: the launch script,
nothing started)."""

from __future__ import annotations

import json

from tunedeck.cli.common import EXIT_USAGE, add_set, err, gated_launch, one_line, say_shared, wait
from tunedeck.core.api import FlagTableError, preview, settings_lines
from tunedeck.core.spec import SpecError, load_spec


def register(sub) -> None:
    s = sub.add_parser("launch", help="start a run from a spec/preset TOML")
    s.add_argument("spec", help="spec file, e.g. presets/demo.toml")
    add_set(s, "override a spec key, e.g. --set train.max_steps=50 (repeatable)")
    s.add_argument("--name", help="run name (default: the spec's)")
    s.add_argument(
        "--wait", action="store_true", help="block until the run ends; exit 0 only if it succeeded"
    )
    s.add_argument("--dry-run", action="store_true", help="print the launch script, start nothing")
    s.add_argument(
        "--no-preflight",
        action="store_true",
        help="launch without the preflight "
        "checklist (by default a failed check refuses the launch); the run "
        "records that it was skipped",
    )
    s.add_argument(
        "--share-output",
        action="store_true",
        help="launch even though a live "
        "run writes the spec's output folder (refused by default); the run records "
        "the runs it shares it with",
    )
    s.add_argument(
        "--queue",
        action="store_true",
        help="wait in this home's GPU queue until the run's GPUs are free (run.queue = true); "
        "`tunedeck queue` lists it, `tunedeck stop` cancels it",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="print the run's id and folder as one JSON line; with --wait, the ended run as a second",
    )
    s.set_defaults(func=cmd_launch)


def dry_run_text(p) -> str:
    """A core `Preview` (the compose screen's pane renders the same one) as `launch --dry-run`
    prints it: the launch script, then the rest as shell comments, so it still runs."""
    kept = "; a launch picks its own" if p.port_picked else ""
    notes = [p.summary, f"port {p.port} ({p.port_note}{kept})", p.memory_line]
    notes += [f"  {line}" for line, _ in p.gpu_lines] + p.warnings
    if p.settings:
        notes += ["ms-swift settings: value (from)"] + [
            f"  {x}" for x in settings_lines(p.settings)
        ]
    # a value with a line break (a system prompt...) stays inside its comment
    lines = [n.replace("\r", "\\r").replace("\n", "\\n") for n in notes]
    return p.script + "".join(f"# {n}\n" for n in lines)


def cmd_launch(args) -> int:
    try:
        spec = load_spec(args.spec, args.set)
    except SpecError as e:
        err(e)
        return EXIT_USAGE
    if args.name:
        spec.name = args.name
    if args.queue:
        spec.run.queue = True
    if args.dry_run:
        try:
            p = preview(spec)
        except (ValueError, OSError, FlagTableError) as e:  # the backend refuses the spec
            err(one_line(e))
            return EXIT_USAGE
        print(dry_run_text(p), end="")
        return 0
    run_dir = gated_launch(args, spec)
    if run_dir is None:
        return 1
    say_shared(run_dir)
    run_id = run_dir.name
    if args.json:
        # one line, so scripts can read it while --wait keeps the process running
        print(json.dumps({"run_id": run_id, "run_dir": str(run_dir)}), flush=True)
    else:
        print(run_id)
    if args.wait:
        return wait(run_id, quiet=args.json)
    return 0
