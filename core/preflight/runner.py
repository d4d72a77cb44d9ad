"""Running the checks in order. (The smoke run, a few real steps through the launch path, is
tunedeck.core.supervisor.smoke: it launches a run.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from tunedeck.core.preflight import config, gpu, host, inputs, network
from tunedeck.core.preflight.base import CheckResult, Context, result
from tunedeck.core.estimate.resolve import resolve
from tunedeck.core.spec import RunSpec, load_spec


def all_checks() -> list[Callable[[Context], CheckResult]]:
    return [*gpu.CHECKS, *network.CHECKS, *inputs.CHECKS, *host.CHECKS, *config.CHECKS]


def make_context(
    spec_path: str | Path | None = None,
    overrides: list[str] | None = None,
    spec: RunSpec | None = None,
    gpu_probe=None,
    base: RunSpec | None = None,
) -> Context:
    """Load the spec (raises SpecError) and resolve it against this machine's GPUs. `base`:
    the spec as its file has it, when `spec` was changed since (the batch check compares)."""
    if spec is None:
        spec = load_spec(spec_path, overrides or [])
        base = load_spec(spec_path) if overrides else None
    ctx = Context(
        spec=spec,
        resolved=spec,
        base=base,
        spec_path=Path(spec_path) if spec_path else None,
        gpu_probe=gpu_probe,
    )
    ctx.resolved = resolve(spec, gpu_count=len(ctx.gpus.gpus))
    return ctx


def run_checks(ctx: Context, only: list[str] | None = None) -> Iterator[CheckResult]:
    for check in all_checks():
        try:
            r = check(ctx)
        except Exception as e:  # noqa: BLE001 - one broken check must not hide the others
            name = check.__name__.removeprefix("check_")
            r = result(
                name,
                name.replace("_", " "),
                "fail",
                f"the check itself crashed: {type(e).__name__}: {e}",
                "report this to the tunedeck maintainers",
            )
        if only and r.id not in only:
            continue
        yield r


ORDER = {"fail": 0, "warn": 1, "pass": 2, "skip": 3}


def ordered(results: list[CheckResult]) -> list[CheckResult]:
    """Failures first, then warnings, passes and skips; the checklist's order within each."""
    return sorted(results, key=lambda r: ORDER[r.status])


def failures(results: list[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.status == "fail"]


def gate_record(
    results: list[CheckResult] | None,
    *,
    by: str,
    overridden: bool = False,
    overridden_at: float | None = None,
    applied: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a launch keeps of its preflight (state.json `preflight`): the outcome, each
    failure launched anyway and when that was decided, the fixes applied on the way. `results`
    None: the checklist was skipped (`--no-preflight`)."""
    now = time.time()
    if results is None:
        return {
            "status": "skipped",
            "by": by,
            "at": now,
            "overridden": True,
            "overridden_at": overridden_at or now,
            "failed": [],
            "warned": [],
            "applied": dict(applied or {}),
        }
    failed = failures(results)
    rec: dict[str, Any] = {
        "status": ("overridden" if overridden else "failed") if failed else "passed",
        "by": by,
        "at": now,
        "summary": summary(results),
        "failed": [
            {"id": r.id, "title": r.title, "detail": r.detail, "fix": r.fix} for r in failed
        ],
        "warned": [r.id for r in results if r.status == "warn"],
        "overridden": bool(failed) and overridden,
        "applied": dict(applied or {}),
    }
    if failed:
        rec["overridden_at"] = overridden_at or now
    return rec


def summary(results: list[CheckResult]) -> dict[str, int]:
    out = {"pass": 0, "warn": 0, "fail": 0, "skip": 0}
    for r in results:
        out[r.status] += 1
    return out


def summary_line(counts: dict[str, int]) -> str:
    return (
        f"{counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed, "
        f"{counts['skip']} skipped"
    )
