"""What a preflight check returns and what every check gets to look at."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from tunedeck.core.spec import RunSpec
from tunedeck.core.telemetry.gpus import GpuFacts, probe_gpus

STATUSES = ("pass", "warn", "fail", "skip")


@dataclass
class CheckResult:
    id: str
    title: str
    status: str  # pass | warn | fail | skip
    detail: str
    fix: str = ""
    # the fix as values, when a value is the fix: dotted spec keys (`env.NAME`; None removes
    # a variable) for core.spec.set_values, so a UI applies it with one key and the CLI
    # prints it as --set
    fix_set: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    """The spec as written (`base`, before --set), with overrides (`spec`), and resolved for
    this machine (`resolved`). GPU facts come from `gpu_probe` so a machine without GPUs can
    still test the GPU logic with recorded facts."""

    spec: RunSpec
    resolved: RunSpec
    base: RunSpec | None = None
    spec_path: Path | None = None
    gpu_probe: Callable[[], GpuFacts] | None = None
    cache: dict = field(default_factory=dict)

    def memo(self, key: str, fn):
        if key not in self.cache:
            self.cache[key] = fn()
        return self.cache[key]

    @property
    def gpus(self) -> GpuFacts:
        return self.memo("gpus", self.gpu_probe or probe_gpus)

    @property
    def estimate(self):
        """Memory estimate of the run the spec starts (ms-swift's defaults for keys an
        ms-swift spec leaves unset, as `tunedeck estimate` and the compose form show it), or
        the error text when it cannot be made."""

        def make():
            from tunedeck.core.estimate import ArchError
            from tunedeck.core.backends.run_estimate import estimate_run

            try:
                facts = self.gpus
                n = self.resolved.cluster.nproc_per_node
                gpus = n if self.resolved.cluster.device == "cuda" else None
                mem = min((g.memory_total_gib for g in facts.gpus), default=None)
                name = facts.gpus[0].name if facts.gpus else ""
                return estimate_run(
                    copy.deepcopy(self.spec), gpus=gpus, gpu_name=name, gpu_mem_gib=mem
                )
            except ArchError as e:
                return str(e)

        return self.memo("estimate", make)

    @property
    def run(self) -> RunSpec:
        """The resolved spec as its backend runs it (ms-swift's defaults for the keys an
        ms-swift spec leaves unset): for the batch and size figures, never for a plan."""

        def make():
            from tunedeck.core.backends.run_estimate import as_run

            return as_run(self.resolved)[0]

        return self.memo("run", make)

    def procs_per_node(self) -> int:
        return max(self.resolved.cluster.nproc_per_node, 1)


def result(
    id: str,
    title: str,
    status: str,
    detail: str,
    fix: str = "",
    fix_set: dict[str, Any] | None = None,
) -> CheckResult:
    assert status in STATUSES, status
    return CheckResult(id, title, status, detail, fix, dict(fix_set or {}))
