"""`<run dir>/exports.json`: the models `tunedeck export-model` wrote from a run (wherever -o
put them), newest last, so `tunedeck export RUN --format vllm` serves the merged folder
rather than base + adapter. Written by core/modelout, read by core/backends/export.py."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tunedeck.core.rundir import read_json, write_json_atomic

FILE = "exports.json"
KINDS = ("merged", "adapter", "full")


@dataclass(frozen=True)
class ExportRecord:
    path: str
    step: int
    kind: str  # one of KINDS
    dtype: str
    t: float

    @property
    def servable(self) -> bool:
        """A whole model vLLM loads as it is (not an adapter), still on disk."""
        return self.kind != "adapter" and (Path(self.path) / "config.json").is_file()


def read_exports(run_dir: Path) -> list[ExportRecord]:
    """The records, oldest first; malformed entries are skipped."""
    data = read_json(Path(run_dir) / FILE, [])
    out = []
    for e in data if isinstance(data, list) else []:
        try:
            rec = ExportRecord(
                str(e["path"]), int(e["step"]), str(e["kind"]), str(e["dtype"]), float(e["t"])
            )
        except (KeyError, TypeError, ValueError):
            continue
        if rec.kind in KINDS:
            out.append(rec)
    return out


def record_export(run_dir: Path, path: Path, step: int, kind: str, dtype: str) -> None:
    recs = [asdict(r) for r in read_exports(run_dir) if r.path != str(path)]
    recs.append(asdict(ExportRecord(str(Path(path).resolve()), step, kind, dtype, time.time())))
    write_json_atomic(Path(run_dir) / FILE, recs)
