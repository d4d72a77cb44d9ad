"""What several verbs share: one-line errors, the preflight gate before a launch, waiting for a
run's end, the notes a launch prints."""

from __future__ import annotations

import json
import sys
import time

from tunedeck.core.api import (
    TERMINAL,
    LaunchError,
    clean,
    failures,
    find_run,
    fmt_age,
    fmt_loss,
    gate_record,
    launch,
    make_context,
    run_checks,
    shared_with,
    wait_settled,
)

EXIT_USAGE = 2


def err(text: object) -> None:
    """`tunedeck: <message>` on stderr, cleaned (messages quote file names and values)."""
    print(f"tunedeck: {clean(text, multiline=True)}", file=sys.stderr)


def one_line(e: BaseException) -> str:
    """An error as one line: the lines of a multi-problem message joined by `; ` (after a
    heading that ends in `:`, by a space)."""
    out = ""
    for line in clean(str(e), multiline=True).splitlines():
        line = line.strip()
        if line:
            out += (" " if not out or out.endswith(":") else "; ") + line
    return out.strip() or type(e).__name__


def add_set(s, hlp: str = "override a spec key (repeatable)") -> None:
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=hlp)


def gated_launch(args, spec):
    """The preflight gate, then the launch; the run directory, or None (said why)."""
    record = preflight_gate(args, spec)
    if record is None:
        return None
    try:
        return launch(spec, preflight=record, share_output=getattr(args, "share_output", False))
    except (LaunchError, OSError, ValueError) as e:
        err(f"launch failed: {e}")
        return None


def preflight_gate(args, spec) -> dict | None:
    """The checklist the TUI's gate runs, before anything is written: None (refused, each
    failure printed with its fix) when a check fails; else the record the run keeps.
    `--no-preflight` skips it, and the run records that it did."""
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
                        f"--set {k}={toml_literal(v)}"
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


def toml_literal(v) -> str:
    """A --set value as parse_override reads it back."""
    if isinstance(v, bool):
        return str(v).lower()
    return json.dumps(v) if isinstance(v, str) else str(v)


def wait(ref: str, quiet: bool = False) -> int:
    """Until the run ends, its progress on stderr as it changes; 0 only if it succeeded.
    `quiet` (a --json launch) prints nothing on the way and the ended run as one JSON line on
    stdout, so a script learns why it failed, not only that it did."""
    last = None
    while True:
        run = find_run(ref)
        line = (
            f"{clean(run.run_id)}: {clean(run.status)} step {run.step}/{run.max_steps} "
            f"loss {fmt_loss(run.loss)}"
        )
        if line != last and not quiet:
            print(line, file=sys.stderr)
            last = line
        if run.status in TERMINAL:
            run = wait_settled(run)
            if quiet:
                print(json.dumps(run.to_json()), flush=True)
            elif run.message:
                print(f"{clean(run.run_id)}: {clean(run.message)}", file=sys.stderr)
            return 0 if run.status == "succeeded" else 1
        time.sleep(0.5)


def stale_note(run) -> str:
    """A live run whose agent has gone quiet: its numbers are as old as this says."""
    if run.stale_s is None:
        return ""
    return f"  stale: agent silent for {fmt_age(run.stale_s)}"


def say_shared(run_dir) -> None:
    """After a `--share-output` launch: which live runs write the same folder (stderr)."""
    ids = shared_with(run_dir)
    if ids:
        print(
            f"note: {clean(run_dir.name)} shares its output folder with live run(s) "
            f"{clean(', '.join(ids))} (--share-output)",
            file=sys.stderr,
        )
