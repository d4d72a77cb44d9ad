"""What the tracker mirror reads of run.db besides the events (core/trackers `Mirror.poll`):
the telemetry sampler's newest snapshot (per GPU utilisation and memory, per rank CPU and
RSS, the host's CPU and memory) as scalars, and each new finding as a note (once: a finding
refined later keeps its row in run.db, so its new counts are no new note). Called from the mirror's own thread, on a
read-only connection of its own (the agent's stays on the agent's loop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunedeck.core.store.store import Store

_MIB_PER_GIB = 1024.0


def telemetry_values(latest: dict[str, Any]) -> dict[str, float]:
    """Tracker tags from the sampler's snapshot (`Store.telemetry_latest`)."""
    out: dict[str, float] = {}

    def put(tag: str, v: Any, scale: float = 1.0) -> None:
        if isinstance(v, (int, float)) and v == v:
            out[tag] = float(v) / scale

    for g in latest.get("gpus") or []:
        if isinstance(g, dict) and isinstance(g.get("gpu"), int):
            put(f"gpu{g['gpu']}/util_pct", g.get("util"))
            put(f"gpu{g['gpu']}/mem_gib", g.get("mem_used_mib"), _MIB_PER_GIB)
    host = latest.get("host") or {}
    if isinstance(host, dict):
        put("host/cpu_pct", host.get("cpu_pct"))
        put("host/mem_used_gib", host.get("mem_used_mib"), _MIB_PER_GIB)
    procs = latest.get("procs") or {}
    for r in procs.get("ranks") or [] if isinstance(procs, dict) else []:
        if isinstance(r, dict) and isinstance(r.get("rank"), int):
            put(f"rank{r['rank']}/cpu_pct", r.get("cpu_pct"))
            put(f"rank{r['rank']}/rss_gib", r.get("rss_mib"), _MIB_PER_GIB)
    return out


class RunDbPoll:
    """`Mirror`'s poll: the newest telemetry and the findings stored since the last call
    (read by row id: only the new rows, never the whole table)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.store: Store | None = None
        self.last_id = 0  # the last findings row sent

    def __call__(self) -> list[tuple[str, Any]]:
        if self.store is None:
            self.store = Store(self.run_dir)
        out: list[tuple[str, Any]] = []
        values = telemetry_values(self.store.telemetry_latest())
        if values:
            out.append(("values", values))
        for row_id, f in self.store.findings_after(self.last_id):
            self.last_id = row_id
            where = f" rank {f['rank']}" if f.get("rank") is not None else ""
            text = (
                f"{f.get('severity')}{where}: {f.get('summary')}\n\n{f.get('cause')}"
                f"\n\nfix: {f.get('fix')}"
            )
            out.append(("note", (f"finding/{f.get('category')}", text[:4000])))
        return out
