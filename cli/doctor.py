"""`tunedeck doctor [RUN] [--json]`: what is wrong with a run directory, file by file
(every run when no RUN is given: only the damaged ones are printed). Exit 1 if anything is.
"""

from __future__ import annotations

from tunedeck.core.api import check_run, clean, find_run, list_runs, print_json, problems


def register(subparsers) -> None:
    s = subparsers.add_parser(
        "doctor",
        help="check a run's files (every run without RUN) and "
        "say what is damaged and what that breaks",
    )
    s.add_argument("run", nargs="?", help="run id, unique prefix or name")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_doctor)


def cmd_doctor(args) -> int:
    runs = [find_run(args.run)] if args.run else list_runs()
    report = [(r, check_run(r.run_dir)) for r in runs]
    if args.json:
        print_json(
            [
                {
                    "run_id": r.run_id,
                    "run_dir": str(r.run_dir),
                    "ok": not problems(checks),
                    "files": [c.to_json() for c in checks],
                }
                for r, checks in report
            ]
        )
        return 1 if any(problems(c) for _, c in report) else 0
    bad_runs = 0
    for run, checks in report:
        bad = problems(checks)
        bad_runs += bool(bad)
        if not args.run and not bad:
            continue
        print(f"{clean(run.run_id)}: {'ok' if not bad else f'{len(bad)} problem(s)'}")
        for c in checks if args.run else bad:
            if c.problem:
                line = f"  BAD {c.file}: {clean(c.problem)}" + (
                    f"  ({clean(c.note)})" if c.note else ""
                )
            elif not c.present:
                # an optional file that is not there: not checked, so not "ok" either
                line = f"  --  {c.file}: none" + (f"  ({clean(c.note)})" if c.note else "")
            else:
                line = f"  ok  {c.file}" + (f"  ({clean(c.note)})" if c.note else "")
            print(line)
    if not args.run:
        print(f"{len(report)} run(s) checked, {bad_runs} with problems")
    return 1 if bad_runs else 0
