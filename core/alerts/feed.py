"""The terminal channel's reading side: the alerts the agents recorded in their runs'
alerts.json since a viewer started, each once. A run's file is read again only when it was
replaced (the ledger writes atomically), so a poll of a large home costs a stat per run."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tunedeck.core.alerts.ledger import NAME
from tunedeck.core.paths import runs_root
from tunedeck.core.rundir import read_json


class AlertFeed:
    def __init__(self, root: Path | None = None, since: float | None = None):
        self.root = Path(root or runs_root())
        self.since = time.time() if since is None else since  # older alerts were news before
        self.sigs: dict[str, tuple[int, int, int]] = {}
        self.seen: set[tuple[str, str]] = set()

    def poll(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """New alerts of one run (`run_id`) or of every run of the home, oldest first."""
        if run_id is not None:
            names = [run_id]
        else:
            try:
                names = [e.name for e in os.scandir(self.root) if e.is_dir()]
            except OSError:
                return []
        out = []
        for name in names:
            path = self.root / name / NAME
            try:
                st = path.stat()
            except OSError:
                continue
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self.sigs.get(name) == sig:
                continue
            self.sigs[name] = sig
            out += self._new(name, read_json(path, {}))
        return sorted(out, key=lambda a: a["t"])

    def _new(self, run_id: str, data: Any) -> list[dict[str, Any]]:
        entries = data.get("alerts") if isinstance(data, dict) else None
        out = []
        for key, entry in (entries if isinstance(entries, dict) else {}).items():
            alert = entry.get("alert") if isinstance(entry, dict) else None
            if not isinstance(alert, dict) or (run_id, key) in self.seen:
                continue  # a finding folded into the end's alert has none of its own
            self.seen.add((run_id, key))
            t = alert.get("t")
            if isinstance(t, (int, float)) and t >= self.since:
                out.append({**alert, "t": float(t)})
        return out
