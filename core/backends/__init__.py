"""Backends turn a resolved RunSpec into a LaunchPlan (what torchrun runs, per node)."""

from __future__ import annotations

from pathlib import Path

from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.spec import RunSpec


def build_plan(spec: RunSpec, run_dir: Path, run_id: str) -> LaunchPlan:
    if spec.backend == "builtin":
        from tunedeck.core.backends.builtin import build_plan as builtin_plan

        return builtin_plan(spec, run_dir, run_id)
    if spec.backend == "swift":
        from tunedeck.core.backends.swift import build_plan as swift_plan

        return swift_plan(spec, run_dir, run_id)
    if spec.backend == "script":
        from tunedeck.core.backends.script import build_plan as script_plan

        return script_plan(spec, run_dir, run_id)
    raise ValueError(f"backend {spec.backend!r} is not available yet")
