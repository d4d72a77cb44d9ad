"""What a run was launched with, in a few words: the runs list's columns and detail strip and
the monitor's title read it. A run's spec.toml and plan.json are frozen at launch, so each
run's facts are read once (in a worker), never on an idle tick."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tunedeck.core.api import effective_batch
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import TRAINERS, SpecError, load_spec


@dataclass(frozen=True)
class RunFacts:
    backend: str = ""
    model: str = ""  # the model path's last part (a hub id's name, a folder's)
    method: str = ""
    strategy: str = ""
    ranks: int = 0  # the whole run's
    nodes: int = 0
    batch: int | None = None  # effective: per device x data parallel x accumulation
    lr: float | None = None
    output: str = ""

    @property
    def ranks_text(self) -> str:
        """ranks per node × nodes, as the runs list's RANKS column shows it."""
        if not self.ranks:
            return ""
        nodes = max(self.nodes, 1)
        return f"{self.ranks // nodes}×{nodes}"

    def line(self) -> str:
        """One line of the settings: model, method, ranks × nodes, batch, lr, strategy."""
        parts = [" ".join(x for x in (self.model, self.method) if x)]
        if self.ranks:
            nodes = max(self.nodes, 1)
            parts.append(
                f"{self.ranks} rank{'s' * (self.ranks != 1)} × {nodes} node{'s' * (nodes != 1)}"
            )
        if self.batch:
            parts.append(f"batch {self.batch}")
        if self.lr is not None:
            parts.append(f"lr {self.lr:g}")
        if self.strategy:
            parts.append(self.strategy)
        return " · ".join(p for p in parts if p)


def read_facts(run_dir: str | Path) -> RunFacts:
    """The facts of one run; what cannot be read (a spec from another version, a run still
    being written) is left empty, never raised into a screen."""
    rd = RunDir(run_dir)
    try:
        spec = load_spec(rd.path / "spec.toml")
    except (SpecError, OSError):
        return RunFacts()
    try:
        plan = rd.read_plan()
    except (OSError, ValueError):
        plan = {}
    nodes = int(plan.get("nnodes") or spec.cluster.nnodes or 1)
    ranks = int(plan.get("world_size") or 0) or int(plan.get("nproc_per_node") or 0) * nodes
    model = spec.model.path.removeprefix("builtin:").rstrip("/").rsplit("/", 1)[-1]
    trainer = spec.backend in TRAINERS  # a script backend has no model or method of ours
    return RunFacts(
        backend=spec.backend,
        model=model if trainer else "",
        method=spec.method.type if trainer else "",
        strategy=spec.parallel.strategy if trainer else "",
        ranks=ranks,
        nodes=nodes,
        batch=effective_batch(spec, ranks or None) if trainer and ranks else None,
        lr=spec.train.learning_rate if trainer else None,
        output=str(rd.output_dir(spec)),
    )
