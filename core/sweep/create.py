"""`tunedeck sweep SPEC --grid KEY=V1,V2 ...`: the points and their runs."""

from __future__ import annotations

import itertools
import random
import secrets
import time
from pathlib import Path
from typing import Any

from tunedeck.core.paths import runs_root
from tunedeck.core.preflight.runner import gate_record
from tunedeck.core.rundir import write_json_atomic
from tunedeck.core.supervisor.launch import launch
from tunedeck.core.spec import SpecError, load_spec, parse_override
from tunedeck.core.stoprule.median import sweep_file


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """["train.learning_rate=1e-4,3e-4"] → {"train.learning_rate": [1e-4, 3e-4]}; each value a
    TOML literal as in --set. A bad item is a SpecError naming it."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, _, values = item.partition("=")
        words = [v.strip() for v in values.split(",") if v.strip()]
        if not key.strip() or not words:
            raise SpecError([f"--grid {item!r}: expected dotted.key=V1,V2,..."])
        grid[key.strip()] = [parse_override(f"{key}={w}")[1] for w in words]
    return grid


def points(grid: dict[str, list[Any]], n: int = 0, seed: int = 0) -> list[dict[str, Any]]:
    """Every combination in order, or `n` of them drawn with `seed` (`--random N --seed S`)."""
    keys = list(grid)
    every = [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]
    if n and n < len(every):
        return random.Random(seed).sample(every, n)
    return every


def _literal(v: Any) -> str:
    import tomli_w

    return tomli_w.dumps({"v": v}).partition("=")[2].strip()


def create_sweep(
    spec_path: str,
    grid: dict[str, list[Any]],
    sets: list[str] | None = None,
    parallel: int = 1,
    n: int = 0,
    seed: int = 0,
    median_after: int = 0,
    root: Path | None = None,
) -> dict[str, Any]:
    """Launch one queued run per point (every spec checked before any run is launched);
    returns the sweep record (also written to its file)."""
    if parallel < 1:
        raise SpecError([f"--parallel {parallel}: must be at least 1"])
    root = Path(root or runs_root())
    sweep_id = f"sw-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    chosen = points(grid, n, seed)
    specs = []
    for i, point in enumerate(chosen):
        over = [*(sets or []), *(f"{k}={_literal(v)}" for k, v in point.items())]
        spec = load_spec(spec_path, over)
        spec.run.queue = True
        spec.name = f"{spec.name}-{sweep_id[-4:]}-{i}"
        specs.append(spec)
    record: dict[str, Any] = {
        "id": sweep_id,
        "spec": str(Path(spec_path).resolve()),
        "grid": grid,
        "parallel": parallel,
        "median_after": median_after,
        "created": time.time(),
        "points": [],
    }
    path = sweep_file(sweep_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    for i, (point, spec) in enumerate(zip(chosen, specs)):
        tag = {"id": sweep_id, "point": i, "settings": point, "median_after": median_after}
        gate = gate_record(None, by="tunedeck sweep")  # each run waits its turn unchecked
        run_dir = launch(spec, root, gate, sweep={**tag, "parallel": parallel})
        record["points"].append({"point": i, "settings": point, "run_id": run_dir.name,
                                 "run_dir": str(run_dir)})  # fmt: skip
        write_json_atomic(path, record)  # the siblings read it as it grows
    return record
