"""A sweep's table (`tunedeck sweep show ID`, and the rows --json prints): per point its
settings, status, best eval loss, final loss, tokens/s and why it ended."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import RunDir, read_json
from tunedeck.core.views.registry import read_run
from tunedeck.core.store.store import read_events
from tunedeck.core.stoprule.median import sweep_file


class SweepNotFound(LookupError):
    pass


def read_sweep(sweep_id: str) -> dict[str, Any]:
    rec = read_json(sweep_file(sweep_id), None)
    if not isinstance(rec, dict):
        raise SweepNotFound(f"no sweep {sweep_id!r} in {sweep_file(sweep_id).parent}")
    return rec


def sweep_of(run_id: str, root: Path | None = None) -> str | None:
    """The sweep a run is a point of (its state.json's `sweep`), else None."""
    st = read_json(RunDir(Path(root or runs_root()) / run_id).state, {})
    sweep = st.get("sweep") if isinstance(st, dict) else None
    return str(sweep["id"]) if isinstance(sweep, dict) and sweep.get("id") else None


def newest_sweep() -> str | None:
    """The id of this home's newest sweep (ids begin with their creation time)."""
    folder = sweep_file("x").parent
    try:
        ids = [p.stem for p in folder.glob("sw-*.json")]
    except OSError:
        return None
    return max(ids, default=None)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def sweep_rows(sweep_id: str) -> list[dict[str, Any]]:
    rows = []
    for p in read_sweep(sweep_id)["points"]:
        run = read_run(Path(p["run_dir"]))
        evals = [_finite(e.get("eval_loss")) for e in read_events(p["run_dir"], "eval")]
        evals = [e for e in evals if e is not None]
        rows.append(
            {
                "point": p["point"],
                "run_id": p["run_id"],
                "settings": p["settings"],
                "status": run.status if run else "missing",
                "step": run.step if run else 0,
                "best_eval_loss": min(evals) if evals else None,
                "final_loss": _finite(run.loss) if run else None,
                "tokens_per_s": _finite(run.tokens_per_s) if run else None,
                "message": run.message if run else "",
            }
        )
    return rows
