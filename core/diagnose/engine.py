"""From scanned evidence to findings, with one root cause.

    diagnose_run(run_dir)   every file of a tunedeck run directory
    diagnose_files(paths)   log files (or run directories) given by the user

Ordering: the first failure in time is the root cause. Times come from the glog headers torch
prints and from torchrun's failure report; a failure without its own time takes the time
torchrun recorded for its rank. What follows (SIGTERMs torchrun sent to the other ranks, the
abort after a watchdog timeout, peers that lost their connection) is kept as consequence
(`root_cause=False`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from collections.abc import Iterable

from tunedeck.core.diagnose.chain import refine
from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.diagnose.loss import LossWatch, loss_findings, loss_record
from tunedeck.core.diagnose.exits import asked_stop, handled_port, port_moves, recorded_exits
from tunedeck.core.diagnose.rules import (
    CHECKPOINT_FULL_CAUSE,
    CHECKPOINT_FULL_FIX,
    CHECKPOINT_FULL_SUMMARY,
    CONSEQUENCE_PATTERNS,
    RULES,
    SIGKILL_CAUSE,
    SIGKILL_FIX,
    WRITE_FAILED,
    flag_advice,
    saving_checkpoint,
)
from tunedeck.core.diagnose.scan import FileScanner, Hit, Traceback, read_error_json
from tunedeck.core.diagnose.sources import run_sources
from tunedeck.core.rundir import Source, source_for_file
from tunedeck.core.ingest.metrics import merge_by_step
from tunedeck.core.ingest.tail import Tail
from tunedeck.core.ingest.parsers.nccl import NcclSummary
from tunedeck.core.ingest.parsers.torchrun import Failure

MAX_EVIDENCE = 12
GENERIC = ("rank_crashed", "worker_sigkill", "worker_sigabrt", "worker_segfault")
_SIGNAL_CATEGORY = {
    "SIGKILL": "worker_sigkill",
    "SIGABRT": "worker_sigabrt",
    "SIGSEGV": "worker_segfault",
    "SIGBUS": "worker_segfault",
    "SIGTERM": "worker_sigterm",
}
_NCCL_SEQ = re.compile(r"SeqNum=(\d+), OpType=(\w+).*?Timeout\(ms\)=(\d+)")
# A DataLoader worker killed while its batches were in flight: the rank fails fetching the
# batch's shared tensor from the dead worker (multiprocessing's resource sharer). torch wraps
# that as "DataLoader worker (pid(s) N) exited unexpectedly" when it already sees the worker
# dead (a form the line rule's `\(pid[^)]*\)` misses), or lets the bare connection error
# through when it does not yet (seen on CPU: the run then had no root cause at all).
_LOADER_FETCH = re.compile(r"torch/utils/data/(?:dataloader|_utils/pin_memory)\.py")
_FD_SHARING = re.compile(r"resource_sharer\.py|rebuild_storage_fd")
_LOADER_DEATH = re.compile(
    r"^(?:ConnectionResetError|ConnectionRefusedError|EOFError"
    r"|FileNotFoundError|BrokenPipeError)\b"
)
_LOADER_EXITED = re.compile(r"DataLoader worker \(pid\(s\) [^)]*\) exited unexpectedly")


class Diagnosis:
    """Scanners for a set of sources; `poll()` reads what is new and rebuilds findings.

    `metrics=False` leaves loss anomalies out and keeps no metric records: the live agent
    watches the loss on the event stream (tunedeck.core.supervisor.monitors.LossMonitor) instead,
    so a poll costs what was appended, not what the run has logged so far.

    Event files (kind "events") are data, not logs: no line of theirs goes through the log
    rules but the `error` an event carries (a failed `end`), and the loss anomalies come from
    the lowest rank's step events fed to a LossWatch as they are read (a few numbers kept,
    never a record per step).

    `runs`: run directories whose state.json records how torchrun ended (a signal that
    killed it leaves no log line: core/diagnose/exits.py); read at each poll."""

    def __init__(
        self,
        sources: list[Source],
        metrics: bool = True,
        runs: list[Path] | None = None,
        moves_of: Path | None = None,
    ) -> None:
        self.runs = list(runs or [])
        # where a port clash the agent answered is read (the run's moves: exits.port_moves)
        self.moves_of = [*self.runs, *([moves_of] if moves_of else [])]
        # error.json files are read where torchrun's report names them (_apply_failures)
        self.scanners = [
            FileScanner(s, metrics=metrics and s.kind != "events")
            for s in sources
            if s.kind != "error_json"
        ]
        self.events = {
            id(sc): _EventErrors(sc) for sc in self.scanners if sc.source.kind == "events"
        }
        lead = min(
            (sc.source for sc in self.scanners if sc.source.kind == "events"),
            key=lambda s: (s.rank is None, s.rank or 0),
            default=None,
        )
        self.loss = _EventLoss(lead) if lead is not None and metrics else None
        self.metrics = metrics

    def poll(self, final: bool = True) -> list[Finding]:
        for sc in self.scanners:
            ev = self.events.get(id(sc))
            if ev is not None:
                ev.poll()
            else:
                sc.poll(final=final)
        if self.loss is not None:
            self.loss.poll()
        return build_findings(
            self.scanners,
            loss=self.metrics,
            watch=self.loss.watch if self.loss is not None else None,
            recorded=[f for r in self.runs for f in recorded_exits(r)]
            + [f for r in self.runs if (f := asked_stop(r)) is not None],
            moves={k: v for r in self.moves_of for k, v in port_moves(r).items()},
        )


class _EventErrors:
    """An event file read as data: only lines carrying an `error` (a rank's failed end) go
    to its scanner's line rules, with their line numbers; the rest is searched a megabyte
    at a time (C byte searches), never split into lines."""

    def __init__(self, sc: FileScanner) -> None:
        self.sc = sc
        self.tail = Tail(sc.source.path)

    def poll(self) -> None:
        for base, chunk in self.tail.chunks(count_lines=False):
            counted, lineno = 0, base  # lines before `counted` are in `lineno`
            at = chunk.find(b'"error"')
            while at >= 0:
                start = chunk.rfind(b"\n", 0, at) + 1
                end = chunk.find(b"\n", at)
                lineno += chunk.count(b"\n", counted, start)
                counted = start
                line = chunk[start:end]
                try:
                    e = json.loads(line)
                except ValueError:
                    e = None
                if isinstance(e, dict) and isinstance(e.get("error"), str):
                    self.sc._line(lineno + 1, line.decode("utf-8", errors="replace"))
                at = chunk.find(b'"error"', end)
            # the next chunk's first line number (chunks() reads it when it resumes)
            self.tail.lineno = base + chunk.count(b"\n")


class _EventLoss:
    """The loss watch over one event file's step events, read in file order, a megabyte at
    a time: the few fields the watch looks at, no record kept."""

    def __init__(self, source: Source) -> None:
        self.tail = Tail(source.path)
        self.watch = LossWatch(str(source.path))

    def poll(self) -> None:
        feed = self.watch.feed
        while True:
            before = self.tail.offset
            feed(
                [
                    r
                    for _, e in self.tail.json_lines(1 << 20)
                    if e.get("kind") == "step" and (r := loss_record(e)) is not None
                ]
            )
            if self.tail.offset == before:
                return


def diagnose_run(run_dir: str | Path) -> list[Finding]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no such run directory: {run_dir}")
    return Diagnosis(run_sources(run_dir), runs=[run_dir]).poll()


def diagnose_files(paths: Iterable[str | Path]) -> list[Finding]:
    sources: list[Source] = []
    runs: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            sources += run_sources(p)
            runs.append(p)
        elif p.is_file():
            sources.append(source_for_file(p))
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    return Diagnosis(sources, runs=runs).poll()


# -- building findings ----------------------------------------------------------------------


def build_findings(
    scanners: list[FileScanner],
    loss: bool = True,
    watch: LossWatch | None = None,
    recorded: list[Finding] | None = None,
    moves: dict[int, int] | None = None,
) -> list[Finding]:
    """`recorded`: findings from what the run recorded rather than logged (a launcher a
    signal ended, exits.py); they take part in choosing the root cause like the rest.
    `moves`: the ports the agent moved the run off (exits.port_moves): their clash is told
    as handled, never the root cause."""
    found: list[Finding] = []
    by_key: dict[tuple, Finding] = {}
    order: dict[int, int] = {}

    def add(f: Finding, seq: int) -> Finding:
        if moves:
            f = handled_port(f, moves)
        key = (f.category, f.rank, f.severity)
        if f.category == "loss_anomaly":  # NaN, zero collapse and frozen norm are distinct
            key += (f.summary.split(" ")[0],)
        cur = by_key.get(key)
        if cur is not None:
            for e in f.evidence:
                if len(cur.evidence) < MAX_EVIDENCE and e not in cur.evidence:
                    cur.evidence.append(e)
            if cur.t is None or (f.t is not None and f.t < cur.t):
                cur.t = f.t
            return cur
        by_key[key] = f
        order[id(f)] = seq
        found.append(f)
        return f

    seq = 0
    failures: list[tuple[FileScanner, Failure, int]] = []
    for sc in scanners:
        explained: set[int] = set()
        for hit in sc.hits:
            seq += 1
            tb = _traceback_of(sc, hit)
            f = _from_hit(sc, hit, tb)
            if tb is not None:
                explained.add(id(tb))
                frames = [ln for ln in tb.lines[1:] if ln.strip() and ln != hit.text]
                f.evidence = (
                    [f"{sc.ref(tb.start)}: Traceback (most recent call last):"]
                    + frames[-(MAX_EVIDENCE - 2) :]
                    + [f"{sc.ref(hit.lineno)}: {hit.text.strip()}"]
                )
            add(f, seq)
        for tb in sc.tracebacks:
            if id(tb) in explained:
                continue
            seq += 1
            f = _from_traceback(sc, tb)
            if f is not None:
                add(f, seq)
        for rep in sc.reports:
            for fl in rep.failures:
                failures.append((sc, fl, rep.first_line))

    seq = _apply_failures(failures, found, add, seq)
    for f in recorded or []:
        if f.category == "launcher_killed" and f.severity == "error":
            said = next((g for g in found if g.category == "launcher_signal"), None)
            if said is not None:  # torchrun's log names the signal: the record backs it
                said.evidence += [e for e in f.evidence if e not in said.evidence]
                continue
        seq += 1
        add(f, seq)
    for f in _nccl_findings(scanners):
        seq += 1
        add(f, seq)
    if watch is not None:  # the run's event stream: the loss watch read it as it went
        for f in watch.findings():
            seq += 1
            add(f, seq)
    elif loss:
        recs = merge_by_step(sc.metrics.records() for sc in scanners if sc.metrics.by_step)
        src = next((sc.name for sc in scanners if sc.metrics.by_step), "")
        for f in loss_findings(recs, src):
            seq += 1
            add(f, seq)
    enq: dict[int, int] = {}
    for sc in scanners:
        enq.update(sc.enqueued)
    missing = _name_stuck_rank(found, enq)
    if missing is not None:
        add(missing, seq + 1)
    _mark_root_cause(found, failures, order)
    rank_sev = {"error": 0, "warning": 1, "info": 2}
    found.sort(
        key=lambda f: (
            not f.root_cause,
            rank_sev.get(f.severity, 3),
            f.t if f.t is not None else math.inf,
            order[id(f)],
        )
    )
    return refine(found, scanners)  # the causal chain across files (diagnose/chain.py)


def _from_hit(sc: FileScanner, hit: Hit, tb: Traceback | None) -> Finding:
    rule = hit.rule
    category = rule.category
    summary, cause, fix = rule.summary, rule.cause, rule.fix
    if rule.category == "flag_error":
        flags, advice = flag_advice(hit.text)
        summary = f"flag rejected: {' '.join(flags) or hit.text.strip()[:80]}"
        fix = (advice + ". " if advice else "") + rule.fix
    elif rule.category == "oom_gpu":
        m = re.search(r"Tried to allocate ([\d.]+ \w+)\. GPU (\d+)", hit.text)
        if m:
            summary = f"GPU out of memory on GPU {m[2]} (tried to allocate {m[1]})"
    elif rule.category == "nccl_timeout":
        m = _NCCL_SEQ.search(hit.text)
        if m:
            summary = f"{m[2]} #{m[1]} timed out after {int(m[3]) / 1000:g} s"
    elif rule.category == "dataloader_worker_killed":
        if tb is not None and _in_flight(tb):
            cause = rule.cause + _IN_FLIGHT_CAUSE
    elif rule.category in ("disk_full", "checkpoint_write_failed"):
        if rule.category == "disk_full" and tb is not None and saving_checkpoint(tb.lines):
            category = "checkpoint_write_failed"
            summary, cause, fix = (
                CHECKPOINT_FULL_SUMMARY,
                CHECKPOINT_FULL_CAUSE,
                CHECKPOINT_FULL_FIX,
            )
        m = re.search(r"writing file (\S+?):? file write failed|writing file (\S+)", hit.text)
        if m and summary == CHECKPOINT_FULL_SUMMARY:
            summary += f" (writing {m[1] or m[2]})"
    elif rule.category == "port_in_use":
        m = re.search(r"port: (\d+)", hit.text)
        if m:
            summary = f"rendezvous port {m[1]} already in use"
    elif "{" in summary:  # a rule's summary names what its groups caught
        summary = summary.format_map(
            {k: "" for k in re.findall(r"\{(\w+)\}", summary)} | hit.groups
        ).replace(" ()", "")
    if hit.rank is not None:
        summary += f" (rank {hit.rank})"
    return Finding(
        category=category,
        severity=rule.severity,
        summary=summary,
        cause=cause,
        fix=fix,
        rank=hit.rank,
        node=sc.source.node,
        evidence=[f"{sc.ref(hit.lineno)}: {hit.text.strip()}"],
        t=hit.t,
        source=sc.ref(hit.lineno),
    )


def _traceback_of(sc: FileScanner, hit: Hit) -> Traceback | None:
    for tb in sc.tracebacks:
        if tb.rank == hit.rank and tb.start <= hit.lineno <= tb.end + 1:
            return tb
    return None


def _from_traceback(sc: FileScanner, tb: Traceback) -> Finding | None:
    exc = tb.exc_line
    if not exc or "ChildFailedError" in exc or "SystemExit" in exc or "KeyboardInterrupt" in exc:
        return None
    who = f"rank {tb.rank}" if tb.rank is not None else "the program"
    in_flight = _in_flight(tb)
    if _LOADER_EXITED.search(exc) or (in_flight and _LOADER_DEATH.search(exc)):
        return _loader_worker_death(sc, tb, who, in_flight)
    if WRITE_FAILED.search(exc) and saving_checkpoint(tb.lines):
        # an I/O failure inside a checkpoint save that no line rule names (the C++ stream
        # error torch's zip writer raises first on a full disk)
        return Finding(
            category="checkpoint_write_failed",
            severity="error",
            summary=f"{CHECKPOINT_FULL_SUMMARY}"
            + (f" (rank {tb.rank})" if tb.rank is not None else ""),
            cause=CHECKPOINT_FULL_CAUSE,
            fix=CHECKPOINT_FULL_FIX,
            rank=tb.rank,
            node=sc.source.node,
            evidence=[f"{sc.ref(tb.start)}: Traceback (most recent call last):"]
            + [ln for ln in tb.lines[1:] if ln.strip()][-MAX_EVIDENCE + 1 :],
            t=None,
            source=sc.ref(tb.start),
        )
    consequence = bool(CONSEQUENCE_PATTERNS.search(exc))
    return Finding(
        category="rank_crashed",
        severity="error",
        summary=f"{who} crashed: {exc[:160]}",
        cause=(
            "The connection to another rank broke, usually because that rank died first."
            if consequence
            else f"An exception ended {who}; the traceback shows where."
        ),
        fix=(
            "Look at the rank that failed first."
            if consequence
            else "Fix the error at the innermost frame of the traceback (your script, data or "
            "config); re-run a single rank to reproduce it quickly."
        ),
        rank=tb.rank,
        node=sc.source.node,
        evidence=[f"{sc.ref(tb.start)}: Traceback (most recent call last):"]
        + [ln for ln in tb.lines[1:] if ln.strip()][-MAX_EVIDENCE + 1 :],
        t=None,
        source=sc.ref(tb.start),
        root_cause=not consequence,
    )


_IN_FLIGHT_CAUSE = (
    " It died with batches still queued for the rank, which then failed fetching one from it."
)


def _in_flight(tb: Traceback) -> bool:
    """The rank failed fetching a batch's shared tensor from a worker that is gone."""
    return any(_LOADER_FETCH.search(ln) for ln in tb.lines) and any(
        _FD_SHARING.search(ln) for ln in tb.lines
    )


def _loader_worker_death(sc: FileScanner, tb: Traceback, who: str, in_flight: bool) -> Finding:
    rule = next(r for r in RULES if r.category == "dataloader_worker_killed")
    return Finding(
        category=rule.category,
        severity=rule.severity,
        summary=f"{rule.summary} ({who}): {tb.exc_line[:120]}",
        cause=rule.cause + (_IN_FLIGHT_CAUSE if in_flight else ""),
        fix=rule.fix,
        rank=tb.rank,
        node=sc.source.node,
        evidence=[f"{sc.ref(tb.start)}: Traceback (most recent call last):"]
        + [ln for ln in tb.lines[1:] if ln.strip()][-MAX_EVIDENCE + 1 :],
        t=None,
        source=sc.ref(tb.start),
    )


def _apply_failures(failures, found: list[Finding], add, seq: int) -> int:
    """torchrun's report: name the failing rank's finding, or make one from its exit.
    Returns the last sequence number used."""
    for sc, fl, first in failures:
        seq += 1
        if fl.rank is None:
            continue
        mine = [f for f in found if f.rank == fl.rank and f.severity == "error"]
        for f in mine:
            if f.t is None:
                f.t = fl.time
            if f.node is None:
                f.node = sc.source.node
        sig = fl.signal or ""
        cat = (
            _SIGNAL_CATEGORY.get(sig)
            if fl.exitcode is not None and fl.exitcode < 0
            else "rank_crashed"
        )
        ev_head = (
            f"{sc.ref(first)}: torchrun: rank {fl.rank} exitcode {fl.exitcode}"
            + (f" ({sig})" if sig else "")
            + (f" on {fl.host}" if fl.host else "")
        )
        evidence = [ev_head] + fl.traceback[: MAX_EVIDENCE - 1]
        err = read_error_json(Path(fl.error_file)) if fl.error_file else None
        if err and err["traceback"]:
            evidence += [ln for ln in err["traceback"].splitlines() if ln.strip()][-3:]
        specific = [f for f in mine if f.category not in GENERIC and f.root_cause]
        if cat == "rank_crashed" and (specific or any(f.category == "rank_crashed" for f in mine)):
            for f in mine[:1]:
                if ev_head not in f.evidence:
                    f.evidence.append(ev_head)
            continue
        if cat == "worker_sigabrt" and any(f.category == "nccl_timeout" for f in mine):
            cat_f = _signal_finding(cat, fl, sc, evidence)
            cat_f.root_cause = False
            cat_f.cause += " It aborted itself after the collective timeout above."
            add(cat_f, seq)
            continue
        add(_signal_finding(cat or "rank_crashed", fl, sc, evidence, err), seq)
    return seq


def _signal_finding(
    cat: str, fl: Failure, sc: FileScanner, evidence: list[str], err: dict | None = None
) -> Finding:
    texts = {
        "worker_sigkill": (
            "rank {r} was killed (SIGKILL): the OOM killer or a kill -9",
            SIGKILL_CAUSE,
            SIGKILL_FIX,
        ),
        "worker_sigabrt": (
            "rank {r} aborted (SIGABRT)",
            "The rank aborted itself: a C++ exception or an assertion in "
            "torch/NCCL/CUDA (for example after a collective timeout).",
            "Read the rank's stderr just before the abort for the C++ error.",
        ),
        "worker_segfault": (
            "rank {r} crashed with a segmentation fault",
            "Native code crashed (a CUDA extension, a mismatched library "
            "build, or corrupted memory).",
            "Run with PYTHONFAULTHANDLER=1 to get the Python stack; check that "
            "compiled extensions (flash-attn, bitsandbytes, deepspeed ops) "
            "match the installed torch/CUDA.",
        ),
        "worker_sigterm": (
            "rank {r} was stopped by torchrun (SIGTERM)",
            "torchrun stops the other ranks once one fails.",
            "Nothing to fix here: see the root cause.",
        ),
        "rank_crashed": (
            "rank {r} exited with code {c}",
            "The rank's program failed.",
            "Read the rank's stderr (tunedeck logs RUN --rank {r}).",
        ),
    }
    summary, cause, fix = texts.get(cat, texts["rank_crashed"])
    if cat == "rank_crashed" and err and err.get("message"):
        summary = "rank {r} crashed: " + err["message"][:160].replace("{", "(").replace("}", ")")
    sev = "warning" if cat == "worker_sigterm" else "error"
    return Finding(
        category=cat,
        severity=sev,
        summary=summary.format(r=fl.rank, c=fl.exitcode),
        cause=cause,
        fix=fix.format(r=fl.rank),
        rank=fl.rank,
        node=sc.source.node,
        evidence=evidence,
        t=fl.time,
        source=evidence[0].split(": torchrun")[0],
        root_cause=cat != "worker_sigterm",
    )


def _nccl_findings(scanners: list[FileScanner]) -> list[Finding]:
    out: list[Finding] = []
    src = next((sc.name for sc in scanners if sc.nccl.lines), None)
    if src is None:
        return out
    s = NcclSummary()
    for sc in scanners:  # fold every file's summary into one
        s.merge(sc.nccl)
    if s.transports or s.versions:
        out.append(
            Finding(
                category="nccl_transport",
                severity="info",
                summary=s.describe() or "NCCL initialised",
                cause="What NCCL chose when it set up its communicators.",
                fix="Nothing to do. P2P between GPUs of one node means NVLink or "
                "PCIe; Socket between nodes is much slower than IB/RoCE.",
                evidence=[f"{k}: {v} channel links" for k, v in s.transports.items()],
                source=src,
                ident="nccl",  # one per run: the ranks, nodes and channels grow as they start
            )
        )
    versions = set(s.versions.values())
    if len(versions) > 1:
        out.append(
            Finding(
                category="nccl_version_mismatch",
                severity="error",
                summary="ranks use different NCCL versions: " + ", ".join(sorted(versions)),
                cause="Ranks loaded different NCCL libraries.",
                fix="Use the same torch/NCCL build on every node.",
                evidence=[f"pid {p}: NCCL {v}" for p, v in s.versions.items()],
                source=src,
                ident="versions",  # the list grows as more ranks start
            )
        )
    if s.ib_missing and not s.ib_devices:
        multi = (s.nnodes or 1) > 1
        out.append(
            Finding(
                category="ib_missing",
                severity="warning" if multi else "info",
                summary="no InfiniBand device: NCCL uses TCP sockets between nodes"
                if multi
                else "no InfiniBand device (fine on one node)",
                cause="NCCL found no IB/RoCE device (NET/IB : No device found).",
                fix="On one node nothing to do. Across nodes, install the RDMA driver "
                "(rdma-core / MOFED) and expose /dev/infiniband to the job, or expect "
                "inter-node all-reduce at TCP speed.",
                evidence=["NET/IB : No device found"],
                source=src,
            )
        )
    return out


def _mark_root_cause(found: list[Finding], failures, order: dict[int, int]) -> None:
    """Exactly one error is the root cause: the earliest in time; the rest are consequences."""
    torchrun_root = {fl.rank for _, fl, _ in failures if fl.root_cause}
    errors = [f for f in found if f.severity == "error" and f.root_cause]
    if not errors:
        return

    def key(f: Finding):
        generic = f.category in GENERIC
        return (
            f.t if f.t is not None else math.inf,
            0 if f.rank in torchrun_root else 1,
            generic,
            order[id(f)],
        )

    errors.sort(key=key)
    root = errors[0]
    for f in errors[1:]:
        if f.category == "flag_error" and root.category == "flag_error":
            continue  # several rejected flags are all root causes
        f.root_cause = False


def _name_stuck_rank(found: list[Finding], last_enq: dict[int, int]) -> Finding | None:
    """For a collective timeout, name the rank(s) that never enqueued the collective: a
    finding of its own, returned."""
    timeouts = [f for f in found if f.category == "nccl_timeout"]
    if not timeouts:
        return None
    seq = None
    for f in timeouts:
        for e in f.evidence:
            m = _NCCL_SEQ.search(e)
            if m and seq is None:
                seq = int(m[1])
    if seq is None:
        return None
    stuck = sorted(r for r, n in last_enq.items() if n < seq)
    if not stuck:
        return None
    names = ", ".join(map(str, stuck))
    # the ranks that report the timeout only waited, whatever order their reports came in:
    # the rank that never entered the collective is the cause (it outranks their timeouts)
    first = timeouts[0]
    waiting = sorted({f.rank for f in timeouts if f.rank not in stuck and f.rank is not None})
    missing = Finding(
        category="rank_missing_from_collective",
        severity="error",
        summary=f"rank {names} never entered collective #{seq}"
        + (f"; rank {', '.join(map(str, waiting))} timed out waiting for it" if waiting else ""),
        cause=f"Rank {names} last enqueued an earlier collective than #{seq} (the watchdog's "
        "`last enqueued` count), so the ranks that report the timeout were waiting for it.",
        fix="Look at what rank " + names + " was doing instead: its own log above the "
        "timeout, `tunedeck stacks` on a live run (the stall detector takes them, and the "
        "Flight Recorder dumps, by itself): data loading, a save on one rank only, an "
        "uneven number of batches, a rank-dependent branch before the collective.",
        rank=stuck[0] if len(stuck) == 1 else None,
        node=first.node,
        evidence=[*first.evidence, *(f"rank {r}: last enqueued #{last_enq[r]}" for r in stuck)],
        t=first.t,
        source=first.source,
    )
    for f in timeouts:
        if f.rank not in stuck:
            f.summary += f"; rank {names} never started it (stuck or on another code path)"
            f.cause += f" Rank {names} last enqueued an earlier collective than #{seq}."
    return missing
