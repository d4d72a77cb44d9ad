"""The smoke run: the real run for a few steps, through the real launch path, and a preflight
result that says how it went."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

from tunedeck.core.preflight.base import CheckResult, result
from tunedeck.core.supervisor.control import stop
from tunedeck.core.supervisor.launch import LaunchError, launch
from tunedeck.core.views.registry import find_run
from tunedeck.core.store.state import TERMINAL
from tunedeck.core.spec import RunSpec

SMOKE_STEPS = 3


def smoke_run(
    spec: RunSpec,
    steps: int = SMOKE_STEPS,
    timeout_s: float = 1800,
    on_status: Callable[[str], None] | None = None,
) -> CheckResult:
    """Launch the real run for `steps` steps through tunedeck.core.supervisor.launch and wait for it."""
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
            stop(run, hard=True)
            return result(
                id,
                title,
                "fail",
                f"{run_id}: no end after {timeout_s:.0f}s",
                f"tunedeck logs {run_id}",
            )
        time.sleep(0.5)
    if run.status == "succeeded":
        return result(
            id,
            title,
            "pass",
            f"{run_id}: {run.step} steps, loss {run.loss if run.loss is not None else '?'}",
        )
    return result(
        id,
        title,
        "fail",
        f"{run_id}: {run.status}" + (f" ({run.message})" if run.message else ""),
        f"tunedeck logs {run_id}",
    )
