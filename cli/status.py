"""`tunedeck status RUN [--json]`: a run's status, step, loss and folder."""

from __future__ import annotations

from tunedeck.cli.common import stale_note
from tunedeck.core.api import clean, find_run, fmt_loss, print_json


def register(sub) -> None:
    s = sub.add_parser("status", help="show a run's status")
    s.add_argument("run", help="run id, unique prefix, or name")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    run = find_run(args.run)
    if args.json:
        print_json(run.to_json())
        return 0
    status, note = clean(run.status), clean(run.message or "")
    if note and not note.startswith(status):  # "stopped (graceful)" already says the status
        status = f"{status} ({note})"
    elif note:
        status = note
    print(
        f"run       {clean(run.run_id)}\nname      {clean(run.name)}\n"
        f"status    {status}{stale_note(run)}\n"
        f"step      {run.step}/{run.max_steps}\nloss      {fmt_loss(run.loss)}\n"
        f"dir       {clean(run.run_dir)}"
    )
    shared = run.state.get("output_shared_with")
    if isinstance(shared, list):
        print(
            f"output    shared on purpose (--share-output) with "
            f"{clean(', '.join(map(str, shared))) or 'no live run at launch'}"
        )
    if run.exit_code is not None:
        print(f"exit code {run.exit_code}")
    return 0
