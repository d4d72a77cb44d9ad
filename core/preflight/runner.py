"""Running the checks in order, and the smoke run (a few real steps through the launch path)."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Callable, Iterator

from tunedeck.core.preflight import config, gpu, host, inputs, network
from tunedeck.core.preflight.base import CheckResult, Context, result
from tunedeck.core.backends.resolve import resolve
from tunedeck.core.spec import RunSpec, load_spec

SMOKE_STEPS = 3


def all_checks() -> list[Callable[[Context], CheckResult]]:
    return [*gpu.CHECKS, *network.CHECKS, *inputs.CHECKS, *host.CHECKS, *config.CHECKS]


def make_context(spec_path: str | Path | None = None, overrides: list[str] | None = None,
                 spec: RunSpec | None = None, gpu_probe=None) -> Context:
    """Load the spec (raises SpecError) and resolve it against this machine's GPUs."""
    base = None
    if spec is None:
        spec = load_spec(spec_path, overrides or [])
        base = load_spec(spec_path) if overrides else None
    ctx = Context(spec=spec, resolved=spec, base=base,
                  spec_path=Path(spec_path) if spec_path else None, gpu_probe=gpu_probe)
    ctx.resolved = resolve(spec, gpu_count=len(ctx.gpus.gpus))
    return ctx


def run_checks(ctx: Context, only: list[str] | None = None) -> Iterator[CheckResult]:
    for check in all_checks():
        try:
            r = check(ctx)
        except Exception as e:  # noqa: BLE001 - one broken check must not hide the others
            name = check.__name__.removeprefix("check_")
            r = result(name, name.replace("_", " "), "fail",
                       f"the check itself crashed: {type(e).__name__}: {e}",
                       "report this to the tunedeck maintainers")
        if only and r.id not in only:
            continue
        yield r


def summary(results: list[CheckResult]) -> dict[str, int]:
    out = {"pass": 0, "warn": 0, "fail": 0, "skip": 0}
    for r in results:
        out[r.status] += 1
    return out


def summary_line(counts: dict[str, int]) -> str:
    return (f"{counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed, "
            f"{counts['skip']} skipped")


def smoke_run(spec: RunSpec, steps: int = SMOKE_STEPS, timeout_s: float = 1800,
              on_status: Callable[[str], None] | None = None) -> CheckResult:
    """Launch the real run for `steps` steps through tunedeck.core.runs.launch and wait for it."""
    from tunedeck.core.runs.launch import LaunchError, launch
    from tunedeck.core.runs.registry import find_run
    from tunedeck.core.runs.state import TERMINAL

    id, title = "smoke.run", f"Smoke run ({steps} real steps)"
    s = copy.deepcopy(spec)
    s.train.max_steps = steps
    s.train.save_steps = 0
    s.name = f"{spec.name}-smoke"[:40]
    try:
        run_dir = launch(s)
    except (LaunchError, OSError, ValueError) as e:
        return result(id, title, "fail", f"launch failed: {e}", "see the message above")
    run_id = run_dir.name
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        run = find_run(run_id)
        line = f"{run_id}: {run.status} step {run.step}/{run.max_steps}"
        if on_status and line != last:
            on_status(line)
            last = line
        if run.status in TERMINAL:
            break
        if time.monotonic() > deadline:
            from tunedeck.core.runs.control import stop

            stop(run, hard=True)
            return result(id, title, "fail", f"{run_id}: no end after {timeout_s:.0f}s",
                          f"tunedeck logs {run_id}")
        time.sleep(0.5)
    if run.status == "succeeded":
        return result(id, title, "pass", f"{run_id}: {run.step} steps, loss "
                      f"{run.loss if run.loss is not None else '?'}")
    return result(id, title, "fail", f"{run_id}: {run.status}"
                  + (f" ({run.message})" if run.message else ""), f"tunedeck logs {run_id}")
