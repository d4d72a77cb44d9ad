"""Hang forensics: when the stall detector fires, find out who holds the run up, at once.

The stall threshold comes from the run's own step times (core/detect/stall.py), so this runs
long before a collective timeout would. In a thread (the agent's tick must stay short): take
every rank's Python stack (core/supervisor/stacks.py), then ask every rank for its Flight
Recorder dump (core/probe/flight.py), wait for the dumps, and read them side by side
(core/diagnose/flight.py). What was taken is kept in the run: flight/rank<r> (the dumps) and
stacks/hang-<unix time>.json (the stacks). The finding, `rank_missing_from_collective` or
`collective_mismatch`, names the collective's sequence id and where the missing rank stands; the
monitor's tick stores it (run.db's connection belongs to the agent's thread). The run is left
alone.
"""

from __future__ import annotations

import logging
import threading
import time

from tunedeck.core.diagnose import flight as reader
from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.monitoring import MonitorContext
from tunedeck.core.probe import flight as probe
from tunedeck.core.rundir import RunDir, write_json_atomic
from tunedeck.core.supervisor.stacks import StackDump, dump_stacks

log = logging.getLogger("tunedeck.hang")

DUMP_WAIT_S = 10.0


def innermost(d: StackDump) -> str:
    """The innermost frame of a rank's main thread: py-spy names it MainThread; faulthandler
    lists the threads newest first, so the main thread is its last block."""
    blocks: list[list[str]] = []
    for line in d.text.splitlines():
        s = line.strip()
        if s.startswith(("Thread ", "Current thread ")):
            blocks.append([s])
        elif s and blocks:
            blocks[-1].append(s)
    main = next((b for b in blocks if "MainThread" in b[0]), blocks[-1] if blocks else [])
    return main[1] if len(main) > 1 else d.method


class HangMonitor:
    """Started by the stall finding (`trigger`); stores what the forensics found."""

    def __init__(self, ctx: MonitorContext) -> None:
        self.ctx = ctx
        if ctx.spec.run.flight_recorder:  # where NCCL's watchdog writes its dump on a timeout
            probe.folder(ctx.run.path).mkdir(parents=True, exist_ok=True)
        c = ctx.spec.cluster
        self.world = list(range(c.nproc_per_node)) if c.nnodes == 1 else None
        self.thread: threading.Thread | None = None
        self.found: list[Finding] = []
        self.lock = threading.Lock()

    def trigger(self, now: float) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        self.thread = threading.Thread(target=self._run, name="tunedeck-hang", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            found = forensics(self.ctx.run.path, self.world)
        except Exception:
            log.exception("hang forensics failed")
            return
        with self.lock:
            self.found.extend(found)

    def tick(self, now: float, new_events: list[dict]) -> None:
        with self.lock:
            found, self.found = self.found, []
        for f in found:
            f.node = self.ctx.finding_node
            if self.ctx.store.save_finding(f):
                log.warning("finding %s: %s", f.category, f.summary)

    def close(self, new_events: list[dict]) -> None:
        self.tick(time.time(), new_events)


def forensics(run_dir, world: list[int] | None) -> list[Finding]:
    """Dumps and stacks of every rank now; the findings they support."""
    # the stacks first: what the ranks do now, before the flight recorder's dumps below
    try:
        stacks = dump_stacks(run_dir)
    except ValueError as e:  # no live rank (it ended meanwhile), or not this user's run
        log.warning("no stacks: %s", e)
        stacks = []
    t0 = probe.request(run_dir)
    folder = probe.folder(run_dir)
    kept = RunDir(run_dir).stack_file(0).parent / f"hang-{int(t0)}.json"
    kept.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(kept, [d.to_json() for d in stacks])
    want = set(world) if world is not None else {d.rank for d in stacks if d.rank is not None}
    deadline = time.monotonic() + DUMP_WAIT_S
    while True:
        fresh = {
            reader.rank_of(p)
            for p in folder.glob("rank*")
            if p.suffix == "" and p.stat().st_mtime >= t0
        }
        if want <= fresh or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    dumps, bad = reader.read_folder(folder)
    dumps = {r: d for r, d in dumps.items() if r in fresh}
    for b in bad:
        log.warning("flight recorder: %s", b)
    where = {d.rank: innermost(d) for d in stacks if d.rank is not None}
    src = str(folder)
    return [reader.finding(v, t=t0, source=src, stacks=where) for v in reader.analyze(dumps, world)]
