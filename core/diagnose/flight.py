"""PyTorch's Flight Recorder dumps: which rank is missing from which collective.

Every rank of a process group numbers its collectives (`collective_seq_id`). A dump holds, per
process group, the last collective the rank enqueued and the last it completed (`pg_status`),
and the recent entries (op, sizes, dtypes, state). Read side by side, the ranks that enqueued
collective N and wait in it are the ones the others are not to blame for; the ranks whose last
enqueued collective is below N never entered it, and their last completed one says where they
stopped. Two ranks that entered the same N with a different op or size are a mismatch.

Dumps come as PyTorch writes them: a pickle (`TORCH_FR_DUMP_TEMP_FILE<rank>`, the dump on a
watchdog timeout; `_dump_fr_trace`) or JSON (`_dump_fr_trace_json`). The pickle is read with an
unpickler that builds only plain containers and numbers, so a file in the run directory cannot
run code. Format versions 2.x (torch 2.4 to 2.13) carry the same keys this reader uses.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

from tunedeck.core.diagnose.finding import Finding

MAX_DUMP_BYTES = 64 << 20
_RANK = re.compile(r"(\d+)(?:\.(?:pkl|json))?$")


class DumpError(ValueError):
    """A file that is not a Flight Recorder dump; the message names the file."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # a dump holds no objects but builtins
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def load_dump(path: Path) -> dict:
    """One rank's dump as a dict, JSON or pickle."""
    path = Path(path)
    try:
        raw = path.read_bytes()[: MAX_DUMP_BYTES + 1]
    except OSError as e:
        raise DumpError(f"{path}: {e.strerror or e}") from e
    if len(raw) > MAX_DUMP_BYTES:
        raise DumpError(f"{path}: larger than {MAX_DUMP_BYTES >> 20} MiB, not a dump")
    try:
        d = json.loads(raw) if raw[:1] == b"{" else _PlainUnpickler(io.BytesIO(raw)).load()
    except (ValueError, pickle.UnpicklingError, EOFError) as e:
        raise DumpError(f"{path}: not a Flight Recorder dump ({e})") from e
    if not isinstance(d, dict) or "version" not in d or "pg_status" not in d:
        raise DumpError(f"{path}: not a Flight Recorder dump (no version / pg_status)")
    return d


def rank_of(path: Path) -> int | None:
    """The rank a dump file is named for: PyTorch appends it to the prefix."""
    m = _RANK.search(Path(path).name)
    return int(m.group(1)) if m else None


def read_folder(folder: Path) -> tuple[dict[int, dict], list[str]]:
    """rank → its newest dump in `folder`, and a line per file that could not be read."""
    out: dict[int, tuple[float, dict]] = {}
    bad: list[str] = []
    for p in sorted(Path(folder).glob("*")):
        r = rank_of(p)
        if r is None or not p.is_file():
            continue
        try:
            d = load_dump(p)
        except DumpError as e:
            bad.append(str(e))
            continue
        t = p.stat().st_mtime
        if r not in out or t >= out[r][0]:
            out[r] = (t, d)
    return {r: d for r, (_, d) in out.items()}, bad


@dataclass
class Collective:
    """What a rank's dump says of one collective."""

    seq: int
    op: str
    sizes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    state: str = ""

    def text(self) -> str:
        sizes = f" sizes {self.sizes}" if self.sizes else ""
        dt = f" {','.join(map(str, self.dtypes))}" if self.dtypes else ""
        return f"{self.op} #{self.seq}{sizes}{dt}"


@dataclass
class Verdict:
    """One process group's stuck collective, read from every rank's dump."""

    pg: str
    seq: int
    collective: Collective | None
    entered: list[int]
    missing: list[int]
    last_done: dict[int, Collective | None]  # missing rank → its last completed collective
    mismatch: dict[int, Collective] = field(default_factory=dict)  # rank → what it entered

    @property
    def category(self) -> str:
        return "collective_mismatch" if self.mismatch else "rank_missing_from_collective"


def _pg_key(d: dict, pg_id: str) -> str:
    cfg = (d.get("pg_config") or {}).get(pg_id) or {}
    return str(cfg.get("desc") or cfg.get("name") or pg_id or "default_pg")


def _entry(d: dict, pg_id: str, seq: int) -> Collective | None:
    for e in reversed(d.get("entries") or []):
        pg = e.get("process_group") or ("", "")
        if e.get("collective_seq_id") == seq and str(pg[0]) == pg_id and not e.get("is_p2p"):
            name = str(e.get("profiling_name") or "?")
            return Collective(
                seq,
                name.split(":", 1)[-1],
                e.get("input_sizes") or [],
                e.get("input_dtypes") or [],
                str(e.get("state") or ""),
            )
    return None


def _completed(d: dict, pg_id: str) -> int:
    return max(
        (
            int(e.get("collective_seq_id") or -1)
            for e in d.get("entries") or []
            if e.get("state") == "completed" and str((e.get("process_group") or ("",))[0]) == pg_id
        ),
        default=-1,
    )


def analyze(dumps: dict[int, dict], world: list[int] | None = None) -> list[Verdict]:
    """The stuck collective of each process group that has one. `world`: the ranks that should
    have a dump (a rank with none is listed as missing, its whereabouts unknown)."""
    pgs: dict[str, dict[int, tuple[int, int]]] = {}
    for rank, d in dumps.items():
        for pg_id, st in (d.get("pg_status") or {}).items():
            enq = int(st.get("last_enqueued_collective", -1))
            # NCCL's watchdog updates pg_status lazily: an entry already marked completed counts
            done = max(int(st.get("last_completed_collective", -1)), _completed(d, str(pg_id)))
            pgs.setdefault(str(pg_id), {})[rank] = (enq, done)
    out = []
    for pg_id, by_rank in sorted(pgs.items()):
        waiting = [done + 1 for enq, done in by_rank.values() if enq > done]
        if not waiting:
            continue
        seq = min(waiting)
        entered = sorted(r for r, (enq, _) in by_rank.items() if enq >= seq)
        missing = sorted(r for r, (enq, _) in by_rank.items() if enq < seq)
        if world is not None and pg_id == "0":  # the default group spans the world
            missing = sorted(set(missing) | (set(world) - set(dumps)))
        seen = {r: _entry(dumps[r], pg_id, seq) for r in entered}
        first = next((c for c in seen.values() if c is not None), None)
        mismatch = {}
        if first is not None:
            shape = (first.op, first.sizes)
            if any(c is not None and (c.op, c.sizes) != shape for c in seen.values()):
                mismatch = {r: c for r, c in seen.items() if c is not None}
        if not missing and not mismatch:
            continue  # every rank is in it and agrees: slow, not held out
        last_done = {
            r: _entry(dumps[r], pg_id, by_rank[r][1]) if r in dumps else None for r in missing
        }
        out.append(
            Verdict(
                _pg_key(dumps[entered[0]], pg_id), seq, first, entered, missing, last_done, mismatch
            )
        )
    return out


def finding(
    v: Verdict, t: float | None = None, source: str = "", stacks: dict | None = None
) -> Finding:
    """The finding for one verdict; `stacks`: rank → where its Python stack stood then."""
    what = v.collective.text() if v.collective else f"collective #{v.seq}"
    evidence = [f"process group {v.pg}: ranks {v.entered} entered {what}"]
    for r in v.missing:
        last = v.last_done.get(r)
        where = f"last completed {last.text()}" if last else "no dump from this rank"
        if stacks and r in stacks:
            where += f"; now in {stacks[r]}"
        evidence.append(f"rank {r}: never entered #{v.seq} ({where})")
    for r, c in sorted(v.mismatch.items()):
        evidence.append(f"rank {r}: entered {c.text()}")
    if v.mismatch:
        summary = f"ranks disagree on collective #{v.seq} in process group {v.pg}"
        cause = (
            f"The ranks reached collective #{v.seq} with different operations or sizes "
            "(Flight Recorder): a code path that depends on the rank or on its data, such "
            "as a condition around a collective or uneven tensor shapes."
        )
        fix = (
            "Make every rank issue the same collectives in the same order with the same "
            "shapes: look for rank- or data-dependent branches before the step that hangs."
        )
        rank = None
    else:
        who = ", ".join(map(str, v.missing))
        summary = f"rank{'s' if len(v.missing) > 1 else ''} {who} never entered {what}"
        cause = (
            f"Flight Recorder: ranks {v.entered} wait in {what} of process group {v.pg}; "
            f"rank{'s' if len(v.missing) > 1 else ''} {who} never reached it, so the others "
            "are waiting for them, not failing themselves."
        )
        fix = (
            "Look at where the missing rank is (its stack, in the evidence and `tunedeck "
            "stacks`): data loading, a checkpoint save on one rank only, an uneven number "
            "of batches, or a rank-dependent branch before the collective."
        )
        rank = v.missing[0] if len(v.missing) == 1 else None
    return Finding(
        category=v.category,
        severity="error",
        summary=summary,
        cause=cause,
        fix=fix,
        rank=rank,
        evidence=evidence,
        t=t,
        source=source,
    )
