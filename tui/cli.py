"""`tunedeck` command line. Without a subcommand it opens the TUI.

Only core (never torch, never textual) is imported at start, so `tunedeck ls` answers in a
fraction of a second on a login node; textual is imported only to open the TUI.

Names, statuses and messages (from run files and from the user) are printed through
`tunedeck.tui.format.clean`: no escape sequence or bidi control reaches the terminal. No verb
prints a traceback: an unexpected error is one line (TUNEDECK_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import sys
import time
from pathlib import Path

from tunedeck.core.paths import PRESETS_DIR, runs_root
from tunedeck.core.runs.registry import RunNotFound, find_run, list_runs, log_tail
from tunedeck.core.runs.state import TERMINAL
from tunedeck.tui.commands import (
    again,
    delete,
    diagnose,
    doctor,
    estimate,
    importexport,
    nodes,
    preflight,
    stacks,
)
from tunedeck.tui.format import clean
from tunedeck.tui.format import fmt_age as _fmt_age
from tunedeck.tui.format import fmt_loss as _fmt_loss
from tunedeck.tui.format import print_json as _print_json

EXIT_USAGE = 2


def _err(text: object) -> None:
    """`tunedeck: <message>` on stderr, cleaned (messages quote file names and values)."""
    print(f"tunedeck: {clean(text, multiline=True)}", file=sys.stderr)


def _one_line(e: BaseException) -> str:
    """An error as one line: the lines of a multi-problem message joined by `; ` (after a
    heading that ends in `:`, by a space)."""
    out = ""
    for line in clean(str(e), multiline=True).splitlines():
        line = line.strip()
        if line:
            out += (" " if not out or out.endswith(":") else "; ") + line
    return out.strip() or type(e).__name__


# -- subcommands -------------------------------------------------------------------------


def cmd_launch(args) -> int:
    from tunedeck.core.spec import SpecError, load_spec

    try:
        spec = load_spec(args.spec, args.set)
    except SpecError as e:
        _err(e)
        return EXIT_USAGE
    if args.name:
        spec.name = args.name
    if args.dry_run:
        from tunedeck.core.preflight.preview import preview
        from tunedeck.core.backends.swift.flags import FlagTableError

        try:
            p = preview(spec)
        except (ValueError, OSError, FlagTableError) as e:  # the backend refuses the spec
            _err(_one_line(e))
            return EXIT_USAGE
        print(dry_run_text(p), end="")
        return 0
    run_dir = _gated_launch(args, spec)
    if run_dir is None:
        return 1
    again.say_shared(run_dir)
    run_id = run_dir.name
    if args.json:
        # one line, so scripts can read it while --wait keeps the process running
        print(json.dumps({"run_id": run_id, "run_dir": str(run_dir)}), flush=True)
    else:
        print(run_id)
    if args.wait:
        return _wait(run_id, quiet=args.json)
    return 0


def dry_run_text(p) -> str:
    """A core `Preview` (the compose screen's pane renders the same one) as `launch --dry-run`
    prints it: the launch script, then the rest as shell comments, so it still runs."""
    from tunedeck.core.preflight.preview import settings_lines

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


def _gated_launch(args, spec):
    """The preflight gate, then the launch; the run directory, or None (said why)."""
    from tunedeck.core.runs.launch import LaunchError, launch

    record = _preflight_gate(args, spec)
    if record is None:
        return None
    try:
        return launch(spec, preflight=record, share_output=getattr(args, "share_output", False))
    except (LaunchError, OSError, ValueError) as e:
        _err(f"launch failed: {e}")
        return None


def _preflight_gate(args, spec) -> dict | None:
    """The checklist the TUI's gate runs, before anything is written: None (refused, each
    failure printed with its fix) when a check fails; else the record the run keeps.
    `--no-preflight` skips it, and the run records that it did."""
    from tunedeck.core.preflight import failures, gate_record, make_context, run_checks

    if args.no_preflight:
        return gate_record(None, by="cli --no-preflight")
    path = getattr(args, "spec", None)  # resume and clone check the spec they made
    ctx = make_context(path, args.set) if path else make_context(spec=spec)
    results = list(run_checks(ctx))
    failed = failures(results)
    if not failed:
        return gate_record(results, by="cli")
    out = sys.stderr
    print(f"tunedeck: launch refused: {len(failed)} preflight check(s) failed", file=out)
    for r in failed:
        print(f"  [FAIL] {clean(r.title)}  ({clean(r.id)})", file=out)
        for line in clean(r.detail, multiline=True).splitlines():
            print(f"         {line}", file=out)
        if r.fix:
            print(f"         fix: {clean(r.fix)}", file=out)
        if r.fix_set:
            print(
                "         "
                + clean(
                    " ".join(
                        f"--set {k}={_toml_literal(v)}"
                        for k, v in r.fix_set.items()
                        if v is not None
                    )
                ),
                file=out,
            )
    whole = f"`tunedeck preflight {clean(path)}` shows the whole checklist; " if path else ""
    print(f"{whole}--no-preflight launches anyway (the run records it)", file=out)
    if args.json:
        print(
            json.dumps({"error": "preflight failed", "failed": [r.to_json() for r in failed]}),
            flush=True,
        )
    return None


def _toml_literal(v) -> str:
    """A --set value as parse_override reads it back."""
    if isinstance(v, bool):
        return str(v).lower()
    return json.dumps(v) if isinstance(v, str) else str(v)


def _wait(ref: str, quiet: bool = False) -> int:
    last = None
    while True:
        run = find_run(ref)
        line = (
            f"{clean(run.run_id)}: {clean(run.status)} step {run.step}/{run.max_steps} "
            f"loss {_fmt_loss(run.loss)}"
        )
        if line != last and not quiet:
            print(line, file=sys.stderr)
            last = line
        if run.status in TERMINAL:
            if run.message and not quiet:
                print(f"{clean(run.run_id)}: {clean(run.message)}", file=sys.stderr)
            return 0 if run.status == "succeeded" else 1
        time.sleep(0.5)


def cmd_ls(args) -> int:
    runs = list_runs()
    if args.json:
        _print_json([r.to_json() for r in runs])
        return 0
    if not runs:
        print(f"no runs under {clean(runs_root())}")
        return 0
    now = time.time()
    names = {r.run_id: clean(r.name) for r in runs}
    width = max([4] + [len(n) for n in names.values()])
    print(f"{'RUN':<32} {'NAME':<{width}} {'STATUS':<10} {'STEP':>13} {'LOSS':>8} {'AGE':>5}")
    for r in runs:
        if r.damaged:  # what is wrong instead of numbers it does not have
            print(f"{clean(r.run_id):<32} {names[r.run_id]:<{width}} {clean(r.message)}")
            continue
        print(
            f"{clean(r.run_id):<32} {names[r.run_id]:<{width}} {clean(r.status):<10} "
            f"{f'{r.step}/{r.max_steps}':>13} {_fmt_loss(r.loss):>8} "
            f"{_fmt_age(r.age_s(now)):>5}" + _stale_note(r)
        )
    damaged = sum(r.damaged for r in runs)
    if damaged:
        print(
            f"{damaged} damaged run(s): `tunedeck doctor RUN` says what is wrong", file=sys.stderr
        )
    return 0


def _stale_note(run) -> str:
    """A live run whose agent has gone quiet: its numbers are as old as this says."""
    if run.stale_s is None:
        return ""
    return f"  stale: agent silent for {_fmt_age(run.stale_s)}"


def cmd_status(args) -> int:
    run = find_run(args.run)
    if args.json:
        _print_json(run.to_json())
        return 0
    print(
        f"run       {clean(run.run_id)}\nname      {clean(run.name)}\n"
        f"status    {clean(run.status)}"
        f"{' (' + clean(run.message) + ')' if run.message else ''}{_stale_note(run)}\n"
        f"step      {run.step}/{run.max_steps}\nloss      {_fmt_loss(run.loss)}\n"
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


def cmd_metrics(args) -> int:
    from itertools import chain

    from tunedeck.core.runs.metrics import iter_records, write_json

    try:  # a run id/prefix/name, a run directory, or a log/metrics file of any known format
        recs = iter_records(
            args.run, since=args.since, every=args.every, last=args.last, text=args.json
        )
        plain = recs.plain
        first = next(recs, None)  # a bad line of a file fails here, before any output
    except FileNotFoundError as e:
        raise RunNotFound(str(e)) from None
    recs = chain(() if first is None else (first,), recs)
    try:  # streamed: a week-long run is never held whole, `| head` stops it early
        if args.json:
            write_json(recs, sys.stdout, plain=plain)
            return 0
        out = [f"{'STEP':>6} {'LOSS':>9} {'LR':>10} {'GRAD':>8} {'TOK/S':>9}\n"]
        for r in recs:
            out.append(
                f"{r['step']:>6} {_fmt_loss(r.get('loss')):>9} "
                f"{r.get('learning_rate') or 0:>10.3e} {r.get('grad_norm') or 0:>8.3f} "
                f"{r.get('tokens_per_s') or 0:>9.0f}\n"
            )
            if len(out) >= 4096:
                sys.stdout.write("".join(out))
                out.clear()
        sys.stdout.write("".join(out))
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _step_arg(low: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{n} is below {low}")
        return n

    return parse


def cmd_logs(args) -> int:
    run = find_run(args.run)
    rid, rank, logs = clean(run.run_id), args.rank, run.run.logs
    # what is missing is said, with its path, on stderr and with exit 1: an empty answer
    # would read as "the rank printed nothing"
    if not logs.is_dir():
        _err(f"{rid}: its logs folder is missing: {logs}")
        return 1
    plan = run.run.read_plan()
    try:
        world = int(plan.get("world_size") or 0) or int(plan.get("nproc_per_node") or 0) * int(
            plan.get("nnodes") or 0
        )
    except (TypeError, ValueError):
        world = 0
    if rank < 0 or (world and rank >= world):
        _err(
            f"{rid} has no rank {rank}: its ranks are 0 to {world - 1}"
            if world
            else f"{rid} has no rank {rank}"
        )
        return 1
    nproc = run.run.nproc_per_node
    where = run.run.node_log_dir(rank // nproc if nproc else 0)
    if not args.follow:
        files = run.run.rank_log_files(rank)
        if not files:
            if run.active:  # not started yet: nothing is missing
                print(f"rank {rank} has written no log yet ({clean(run.status)})", file=sys.stderr)
                return 0
            _err(f"{rid}: rank {rank} left no log under {where}")
            return 1
        if not any(p.is_file() for p in files):
            _err(f"{rid}: rank {rank}'s log files are missing: {files[0].parent}")
            return 1
        for line in log_tail(run.run_dir, rank, args.lines):
            print(line)
        return 0
    from tunedeck.core.ingest.tail import follow

    files: list[Path] = []
    while not files:  # the rank may not have started yet
        files = run.run.rank_log_files(rank)
        if files:
            break
        if find_run(run.run_id).status in TERMINAL:
            _err(f"{rid}: rank {rank} left no log under {where}")
            return 1
        time.sleep(0.5)
    for line in log_tail(run.run_dir, args.rank, args.lines):
        print(line, flush=True)
    try:
        for line in follow(files, stop=lambda: find_run(run.run_id).status in TERMINAL):
            print(line, flush=True)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_stop(args) -> int:
    from tunedeck.core.runs.control import ForeignRun, stop

    run = find_run(args.run)
    if run.damaged:
        _err(
            f"{clean(run.run_id)} is {clean(run.message)}: its processes cannot be told, so "
            f"nothing is signalled (`tunedeck doctor {clean(run.run_id)}`)"
        )
        return 1
    if run.foreign:  # another user's run: its pids and plan are not this user's to act on
        _err(
            f"{clean(run.run_id)} is {clean(run.message)}: only its owner can stop it, so "
            f"nothing is signalled"
        )
        return 1
    if not run.needs_stop:
        if args.json:
            _print_json(run.to_json())
        else:
            print(f"{run.run_id} is already {run.status}")
        return 0
    how = "hard" if args.hard else "graceful"
    # The agent carries the stop out; waiting for the end is the user's choice (--wait).
    try:
        done = stop(run, hard=args.hard, grace_s=args.grace, wait=args.wait)
    except ForeignRun as e:  # became another user's since it was read: nothing was signalled
        _err(e)
        return 1
    if args.json:
        _print_json(done.to_json())
    elif args.wait:
        print(f"{done.run_id}: {done.status} ({done.message})")
    else:
        print(
            f"{done.run_id}: {how} stop requested; the agent carries it out "
            f"(`tunedeck status {done.run_id}`, or `stop --wait` to wait for the end)"
        )
    if not args.wait:
        return 0
    return 0 if done.status in TERMINAL else 1


def _grace_seconds(text: str) -> float:
    """--grace: a finite number of seconds, 0 or more (nan/inf would never escalate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def cmd_tui(args) -> int:
    if not sys.stdout.isatty() and not os.environ.get("TUNEDECK_FORCE_TUI"):
        print("tunedeck: the TUI needs a terminal; try `tunedeck ls`", file=sys.stderr)
        return EXIT_USAGE
    from tunedeck.tui.app import TunedeckApp

    TunedeckApp(open_run=getattr(args, "open_run", None), readonly=args.readonly).run()
    return 0


def cmd_demo(args) -> int:
    """Launch the demo preset (unless one is already running) and open it in the TUI."""
    from tunedeck.core.spec import SpecError, load_spec

    active = [r for r in list_runs() if r.name == "demo" and r.active]
    if active:
        run_id = active[0].run_id
    else:
        args.spec, args.json = PRESETS_DIR / "demo.toml", False
        try:
            spec = load_spec(args.spec, args.set)
        except SpecError as e:
            _err(e)
            return EXIT_USAGE
        run_dir = _gated_launch(args, spec)  # the same checklist as every launch
        if run_dir is None:
            return 1
        run_id = run_dir.name
        print(f"launched {clean(run_id)}", file=sys.stderr)
    if args.no_tui:
        return _wait(run_id)
    args.open_run = run_id
    return cmd_tui(args)


# -- parser ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tunedeck",
        description="Launch, watch and stop distributed fine-tuning runs. "
        f"Runs live under $TUNEDECK_HOME/runs (now {runs_root()}).",
    )
    p.add_argument("--readonly", action="store_true", help="TUI without stop actions")
    sub = p.add_subparsers(dest="cmd")

    s = sub.add_parser("launch", help="start a run from a spec/preset TOML")
    s.add_argument("spec", help="spec file, e.g. presets/demo.toml")
    s.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec key, e.g. --set train.max_steps=50 (repeatable)",
    )
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
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_launch)

    s = sub.add_parser("ls", help="list runs")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_ls)

    for name, func, hlp in (
        ("status", cmd_status, "show a run's status"),
        ("metrics", cmd_metrics, "per-step loss, lr, throughput"),
    ):
        s = sub.add_parser(name, help=hlp)
        s.add_argument(
            "run",
            help="run id, unique prefix, or name (metrics: also a run directory or a log file)",
        )
        s.add_argument("--json", action="store_true")
        if name == "metrics":  # only what a script or a view shows, read in SQL
            s.add_argument("--since", type=_step_arg(0), metavar="STEP", help="steps from STEP on")
            s.add_argument(
                "--every", type=_step_arg(1), metavar="N", help="only steps that are multiples of N"
            )
            s.add_argument("--last", type=_step_arg(1), metavar="N", help="the last N steps")
        s.set_defaults(func=func)

    s = sub.add_parser("logs", help="print a rank's log")
    s.add_argument("run")
    s.add_argument("--rank", type=int, default=0)
    s.add_argument("-n", "--lines", type=int, default=200)
    s.add_argument("-f", "--follow", action="store_true")
    s.set_defaults(func=cmd_logs)

    s = sub.add_parser("stop", help="stop a run: graceful (checkpoint) then SIGKILL after grace")
    s.add_argument("run")
    s.add_argument("--hard", action="store_true", help="SIGKILL every process of the run now")
    s.add_argument("--grace", type=_grace_seconds, help="seconds before a graceful stop escalates")
    s.add_argument(
        "--wait",
        action="store_true",
        help="wait until the run has ended (exit 1 if it did not in time)",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_stop)

    s = sub.add_parser("demo", help="launch the CPU/GPU demo run and watch it in the TUI")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--no-tui", action="store_true", help="wait in the terminal instead")
    s.add_argument(
        "--no-preflight",
        action="store_true",
        help="launch without the preflight checklist (the run records it)",
    )
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser("tui", help="open the TUI (the default)")
    s.set_defaults(func=cmd_tui)

    # More subcommands live in tui/commands/<name>.py, each with register(subparsers).
    for mod in COMMAND_MODULES:
        mod.register(sub)
    return p


COMMAND_MODULES = (
    preflight,
    estimate,
    diagnose,
    importexport,
    stacks,
    doctor,
    nodes,
    delete,
    again,
)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func = getattr(args, "func", cmd_tui)
    try:
        return func(args)
    except RunNotFound as e:
        _err(e)
        return 1
    except sqlite3.DatabaseError as e:  # a damaged run.db: that run's verbs say so, in a line
        run = getattr(args, "run", None)
        _err(
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
        _err(f"{_one_line(e)} ({type(e).__name__}; TUNEDECK_DEBUG=1 shows where)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
