"""The causal chain over a whole diagnosis: one root cause first, its consequences marked.

`refine(found, scanners)` runs last in `engine.build_findings`. It adds what the scanners
worked out beyond single lines (signal exits without torchrun's table, a launcher stopped from
outside, NCCL plugin probes, the loss and data-time signs of a printed log), puts the host each
line's prefix or torchrun's table named on its finding, and picks the root cause by what
explains what, then by time:

    specific causes (an exception, OOM, a CUDA fault, a port, a flag, the launcher's signal)
      > a rank ended by a signal (SIGKILL/SIGSEGV/SIGABRT)
      > hangs and collective timeouts
      > broken connections, bare exit codes
      > torchrun stopping the other ranks, torchrun's own traceback

A SIGABRT right after a watchdog timeout or a CUDA fault is that failure's abort, a SIGKILL
after host-memory signs (a model that finished loading its shards, no Python error) is the
OOM killer, exit code 1 everywhere with no traceback says where the error went.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from tunedeck.core.diagnose.exits import ASKED_STOP
from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.diagnose.rules import (
    CHECKPOINT_FULL_CAUSE,
    CHECKPOINT_FULL_FIX,
    CHECKPOINT_FULL_SUMMARY,
    CONSEQUENCE_PATTERNS,
    SIGKILL_CAUSE,
    SIGKILL_FIX,
    WRITE_FAILED,
    match_line,
    saving_checkpoint,
)
from tunedeck.core.ingest.parsers.torchrun import signal_name

if TYPE_CHECKING:
    from tunedeck.core.diagnose.scan import FileScanner

SIGNALS = {
    "SIGKILL": "worker_sigkill",
    "SIGSEGV": "worker_segfault",
    "SIGBUS": "worker_segfault",
    "SIGABRT": "worker_sigabrt",
    "SIGTERM": "worker_sigterm",
    "SIGHUP": "worker_sigterm",
    "SIGINT": "worker_sigterm",
}
_TIER_SIGNAL = {"worker_sigkill", "worker_segfault", "worker_sigabrt"}
_TIER_HANG = {"stall", "nccl_timeout"}
_TIER_LINK = {"nccl_network"}
_TIER_AFTER = {"worker_sigterm"}
_LAUNCHER_FRAMES = re.compile(
    r"torch/distributed/(?:run|launch)\.py|elastic/agent/server"
    r"|launcher/api\.py|deepspeed/launcher|accelerate/commands"
    r"|bin/(?:torchrun|deepspeed|accelerate)\b"
)
_LAUNCHER_EXC = re.compile(r"ChildFailedError|SignalException|CalledProcessError")
_SOURCE_LINE = re.compile(r":(\d+)$")


def refine(found: list[Finding], scanners: "list[FileScanner]") -> list[Finding]:
    _hosts_from_lines(found, scanners)
    found = found + _table_tracebacks(found, scanners) + _exit_lines(found, scanners)
    _fold_unranked(found)
    _fold_exit_abort(found)
    _launcher_signal(found)
    _name_cuda_fault(found)
    _host_memory(found, scanners)
    _silent_exit_codes(found, scanners)
    found = _nccl_probes(found, scanners)
    found += _loss_zero_nan(found, scanners)
    found += _starvation(found, scanners)
    _mark_chain(found, scanners)
    return causes_first(found)


def causes_first(found: list[Finding]) -> list[Finding]:
    """What explains the rest, from records rather than one log line, then the sort: a stop
    that was asked for (its signals are its consequences) and a node lost as a whole (the
    other nodes' rank failures are its consequences). Also applied to the findings a run's
    agent stored, once merged with the logs' (core/api.py, the agent's DiagnosisMonitor)."""
    found = node_lost_first(asked_stop_first(found))
    sev = {"error": 0, "warning": 1, "info": 2}
    found.sort(key=lambda f: (not f.root_cause, sev.get(f.severity, 3), _tier(f)))
    return found


# -- where: hosts ---------------------------------------------------------------------------


def _hosts_from_lines(found: list[Finding], scanners) -> None:
    by_ref = {}
    for sc in scanners:
        for h in sc.hits:
            if h.host:
                by_ref[sc.ref(h.lineno)] = h.host
        for rep in sc.reports:
            for fl in rep.failures:
                if fl.host and fl.rank is not None:
                    by_ref[("rank", fl.rank)] = fl.host
    for f in found:
        if f.host is None:
            f.host = by_ref.get(f.source) or by_ref.get(("rank", f.rank))
        if f.host and f.host != "localhost" and f.severity == "error" and f.host not in f.summary:
            f.summary += f" on {f.host}"


# -- the error a rank wrote into torchrun's table (its error_file, shown by @record) ---------

_EXC_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b:? ?(.*)")


def _table_tracebacks(found: list[Finding], scanners) -> list[Finding]:
    have = {(f.category, f.rank) for f in found}
    out: list[Finding] = []
    for sc in scanners:
        for rep in sc.reports:
            for fl in rep.failures:
                lines = [ln for ln in fl.traceback if ln.strip()]
                if fl.rank is None or not lines or lines[0].startswith(("Signal ", "To enable")):
                    continue
                hit = next((m for m in map(match_line, lines) if m is not None), None)
                if hit is not None:
                    rule = hit[0]
                    cat, summary = rule.category, f"{rule.summary} (rank {fl.rank})"
                    cause, fix, sev = rule.cause, rule.fix, rule.severity
                    if cat == "disk_full" and saving_checkpoint(lines):
                        cat, summary = (
                            "checkpoint_write_failed",
                            f"{CHECKPOINT_FULL_SUMMARY} (rank {fl.rank})",
                        )
                        cause, fix = CHECKPOINT_FULL_CAUSE, CHECKPOINT_FULL_FIX
                else:
                    exc = next((ln for ln in reversed(lines) if _EXC_LINE.match(ln)), None)
                    if exc is None:
                        continue
                    cat, summary, sev = (
                        "rank_crashed",
                        f"rank {fl.rank} crashed: {exc[:160]}",
                        "error",
                    )
                    cause = f"An exception ended rank {fl.rank}; torchrun's report quotes it."
                    fix = (
                        "Fix the error at the innermost frame of the traceback (your script, "
                        "data or config); re-run a single rank to reproduce it quickly."
                    )
                    if WRITE_FAILED.search(exc) and saving_checkpoint(lines):
                        cat, summary = (
                            "checkpoint_write_failed",
                            f"{CHECKPOINT_FULL_SUMMARY} (rank {fl.rank})",
                        )
                        cause, fix = CHECKPOINT_FULL_CAUSE, CHECKPOINT_FULL_FIX
                if (cat, fl.rank) in have:
                    continue
                have.add((cat, fl.rank))
                out.append(
                    Finding(
                        category=cat,
                        severity=sev,
                        summary=summary,
                        cause=cause,
                        fix=fix,
                        rank=fl.rank,
                        node=sc.source.node,
                        evidence=[f"{sc.ref(rep.first_line)}: torchrun: rank {fl.rank}:"]
                        + lines[-8:],
                        t=fl.time,
                        source=sc.ref(rep.first_line),
                        host=fl.host,
                    )
                )
    return out


# -- exits torchrun (or DeepSpeed's launcher) reported without a failure table --------------


def _exit_lines(found: list[Finding], scanners) -> list[Finding]:
    covered = {(f.rank, f.category) for f in found}
    tabled = {fl.rank for sc in scanners for rep in sc.reports for fl in rep.failures}
    out: list[Finding] = []
    for sc in scanners:
        for lineno, rec, t in sc.torchrun_lines:
            if rec.get("kind") != "failed":
                continue
            rank, code = rec.get("local_rank"), rec["exitcode"]
            if rank in tabled:
                continue
            who = f"rank {rank}" if rank is not None else "a rank"
            launcher = "DeepSpeed's launcher" if rec.get("launcher") else "torchrun"
            ev = [f"{sc.ref(lineno)}: {launcher}: {who} exit code {code}"]
            if code < 0:
                sig = signal_name(-code)
                cat = SIGNALS.get(sig, "rank_crashed")
                summary = f"{who} was ended by {sig} (exit code {code})"
            else:
                sig, cat = None, "rank_crashed"
                summary = f"{who} exited with code {code}"
            if (rank, cat) in covered:
                continue
            covered.add((rank, cat))
            cause, fix = _SIGNAL_TEXT.get(cat, _SIGNAL_TEXT["rank_crashed"])
            out.append(
                Finding(
                    category=cat,
                    severity="warning" if cat == "worker_sigterm" else "error",
                    summary=summary,
                    cause=cause,
                    fix=fix,
                    rank=rank,
                    node=sc.source.node,
                    evidence=ev,
                    t=t,
                    source=sc.ref(lineno),
                    root_cause=cat != "worker_sigterm",
                )
            )
    return out


_SIGNAL_TEXT = {
    "worker_sigkill": (SIGKILL_CAUSE, SIGKILL_FIX),
    "worker_segfault": (
        "Native code crashed (a CUDA extension, a mismatched library build, or corrupted memory).",
        "Run with PYTHONFAULTHANDLER=1 to get the Python stack; check that "
        "compiled extensions (flash-attn, bitsandbytes, deepspeed ops) match "
        "the installed torch/CUDA.",
    ),
    "worker_sigabrt": (
        "The rank aborted itself: a C++ exception or an assertion in "
        "torch/NCCL/CUDA (for example after a collective timeout).",
        "Read the rank's stderr just before the abort for the C++ error.",
    ),
    "worker_sigterm": (
        "The launcher stops the other ranks once one fails.",
        "Nothing to fix here: see the root cause.",
    ),
    "rank_crashed": (
        "The rank's program failed.",
        "Read the rank's own output for its error (torchrun --log_dir / "
        "--redirects 3 keep one file per rank).",
    ),
}


def _fold_unranked(found: list[Finding]) -> None:
    """A signal seen once without a rank (`Fatal Python error: Aborted` with no prefix) and
    again with one (torchrun's table) is one finding: keep the ranked one."""
    for f in list(found):
        if f.rank is not None or f.category not in (_TIER_SIGNAL | {"rank_crashed"}):
            continue
        twins = [g for g in found if g is not f and g.category == f.category and g.rank is not None]
        if len(twins) == 1:
            _absorb(twins[0], f, found)


def _absorb(keep: Finding, other: Finding, found: list[Finding]) -> None:
    """`other` said the same failure as `keep`: its evidence, time and place join `keep`."""
    keep.evidence += [e for e in other.evidence if e not in keep.evidence]
    keep.t = keep.t if keep.t is not None else other.t
    keep.rank = keep.rank if keep.rank is not None else other.rank
    keep.node = keep.node if keep.node is not None else other.node
    keep.host = keep.host or other.host
    found.remove(other)


def _fold_exit_abort(found: list[Finding]) -> None:
    """The runtime's abort at exit and the SIGABRT the launcher reports for it are one
    failure: the rank's SIGABRT (its exit code, its host) joins the finding that says why."""
    for f in [f for f in found if f.category == "exit_abort"]:
        aborts = [g for g in found if g.category == "worker_sigabrt" and g.rank is not None]
        twin = next((g for g in aborts if g.rank == f.rank), None)
        if twin is None and f.rank is None and len(aborts) == 1:
            twin = aborts[0]  # printed without a rank prefix: the one rank that aborted
        if twin is not None:
            _absorb(f, twin, found)


# -- the launcher was stopped from outside ---------------------------------------------------

_LAUNCHER_WORDS = {
    "SIGHUP": (
        "torchrun was hung up (SIGHUP): the terminal or SSH session it ran in closed; "
        "no rank failed",
        "The launcher got SIGHUP, which a shell sends to its jobs when the terminal or "
        "SSH connection closes (nohup does not protect torchrun's workers), and passed "
        "it on to every rank.",
        "Start the run detached: `tunedeck launch` (its agent outlives the session), or "
        "inside tmux/screen, or with setsid; then reconnect and attach.",
    ),
    "SIGTERM": (
        "torchrun was sent SIGTERM from outside (a scheduler time limit or "
        "preemption, or a kill); no rank failed",
        "The launcher received SIGTERM and shut its workers down.",
        "Check the scheduler's log (time limit, preemption) or who sent the kill; "
        "resume from the last checkpoint.",
    ),
    "SIGINT": (
        "torchrun was interrupted (Ctrl-C); no rank failed",
        "The launcher received SIGINT and shut its workers down.",
        "Nothing failed; resume from the last checkpoint.",
    ),
}


def _launcher_signal(found: list[Finding]) -> None:
    for f in found:
        if f.category != "launcher_signal":
            continue
        text = " ".join(f.evidence)
        slurm = re.search(
            r"(JOB|STEP) [\d.]+ ON (\S+) CANCELLED AT \S+(?: DUE TO ([A-Z ]+))?", text
        )
        if slurm:  # the scheduler ended the job: every task got SIGTERM, then SIGKILL
            why = (slurm.group(3) or "").strip().lower()
            f.summary = (
                f"Slurm cancelled the {slurm.group(1).lower()} on {slurm.group(2)}"
                + (f" ({why})" if why else " (scancel or the scheduler)")
                + "; no rank failed on its own"
            )
            f.cause = (
                "Slurm ended the job: its time limit, a preemption, a node failure, or "
                "an scancel by a user or an admin. The tasks' ends follow from it."
            )
            f.fix = (
                "Check `sacct -j <job> -o JobID,State,ExitCode,Elapsed,Timelimit`; for a "
                "time limit raise --time or save checkpoints often enough to resume; for "
                "preemption use a requeue-able partition and resume from a checkpoint."
            )
            f.rank = None
            for g in found:
                if g is not f and g.category in (_TIER_SIGNAL | _TIER_AFTER | {"rank_crashed"}):
                    g.root_cause = False
            continue
        m = re.search(r"Received (?:Signals\.)?(\w+) death signal|got signal: (\d+)", text)
        sig = None
        if m:
            raw = m.group(1) or m.group(2)
            sig = raw if raw.startswith("SIG") else signal_name(int(raw))
        summary, cause, fix = _LAUNCHER_WORDS.get(
            sig or "",
            (
                f"torchrun was stopped by {sig or 'a signal'} from outside; no rank failed",
                "The launcher received a signal and shut its workers down.",
                "Find out who sent the signal.",
            ),
        )
        f.summary, f.cause, f.fix, f.rank = summary, cause, fix, None
        for g in found:  # the ranks it stopped, and its own traceback, follow from it
            if g is not f and g.category in (_TIER_SIGNAL | _TIER_AFTER | {"rank_crashed"}):
                g.root_cause = False


# -- a stop someone asked for ----------------------------------------------------------------

# what a stop sends: torchrun's death signal (a Slurm job's cancel line too), the ranks' SIGTERM
_STOP_SIGNS = {"launcher_signal", "worker_sigterm"}
_SLACK_S = 1.0  # a log line's time and stop.json's come from different clocks' roundings


def asked_stop_first(found: list[Finding]) -> list[Finding]:
    """A run stopped on request (exits.asked_stop's finding): the signals the stop sent are
    no launcher signal from outside (a time limit, a preemption) but the stop itself, whose
    finding takes their evidence; what failed after the stop and follows from signals or
    broken peers is its consequence. A failure before the stop keeps the root cause (a hang
    the user stopped is still the hang)."""
    stop = next((f for f in found if f.category == ASKED_STOP), None)
    if stop is None:
        return found

    def after(f: Finding) -> bool:
        return stop.t is None or f.t is None or f.t >= stop.t - _SLACK_S

    out: list[Finding] = []
    for f in found:
        if f is not stop and f.category == ASKED_STOP:
            continue  # the same stop, stored by the agent and read again
        if f is not stop and f.category in _STOP_SIGNS and after(f):
            for e in f.evidence:
                if e not in stop.evidence and len(stop.evidence) < 12:
                    stop.evidence.append(e)
            continue
        out.append(f)

    errors = [f for f in out if f is not stop and f.severity == "error"]
    for f in errors:
        if after(f) and (_tier(f) >= 1 or f.category in ("launcher_killed", "node_not_stopped")):
            f.root_cause = False
    if not any(f.root_cause for f in errors):
        # the root the chain picked was one of the stop's signals: a failure before the
        # stop, if any, is what the run ended for (the chain's order: tier, then time)
        before = [f for f in errors if not after(f)]
        if before:
            min(
                before, key=lambda f: (_tier(f), f.t if f.t is not None else math.inf)
            ).root_cause = True
    stop.root_cause = not any(f.root_cause for f in errors)
    return out


# -- a node lost as a whole ------------------------------------------------------------------


_LOSS_WINDOW_S = 60.0  # the other nodes' ranks fail within this of the loss being seen


def node_lost_first(found: list[Finding]) -> list[Finding]:
    """A node lost as a whole (its agent died, its link and its ranks went silent, its run
    ended failed: core/nodes/link.py, slurm.py) is the root cause of what the other nodes'
    ranks did next: their collectives broke (a peer's closed connection, a timeout, the
    SIGKILL that ended the head's attempt), so their crashes are its consequences, whatever
    their time (they often fail before the head's agent notices the loss). Only an error of
    the lost node's own ranks (an exception, an OOM: what made it leave) explains the loss
    itself, and stays first. A loss with a restart left was a warning when it happened; a
    run whose ranks failed for it says so as an error."""
    lost = [f for f in found if f.category == "node_lost" and f.node is not None]
    if not lost:
        return found
    root = min(lost, key=lambda f: (f.severity != "error", f.t if f.t is not None else math.inf))
    k = root.node
    own = [
        f
        for f in found
        if f.severity == "error"
        and f.node == k
        and f.category != "node_lost"
        and _tier(f) == 0
        and (f.t is None or root.t is None or f.t <= root.t)
    ]
    # a failure long after the loss (the node came back, the run restarted and failed
    # again for its own reason) is not the loss's, and keeps the root the chain gave it
    last = max((f.t for f in lost if f.t is not None), default=None)
    late = [
        f
        for f in found
        if f.severity == "error"
        and f not in lost
        and f.root_cause
        and last is not None
        and f.t is not None
        and f.t > last + _LOSS_WINDOW_S
    ]
    if own or late:  # node k failed first, on its own (the loss follows), or later anew
        for f in lost:
            f.root_cause = False
        return found
    others = [f for f in found if f.severity == "error" and f not in lost]
    if others:
        root.severity = "error"
    for f in found:
        if f is root:
            f.root_cause = True
        elif f.severity == "error" or f in lost:
            f.root_cause = False
    return found


# -- which CUDA fault ------------------------------------------------------------------------

_CUDA_KINDS = (
    ("illegal memory access", "an illegal memory access"),
    ("illegal instruction", "an illegal instruction"),
    ("device-side assert", "a device-side assert"),
    ("Assertion `", "a device-side assert"),
    ("Device-side assertion", "a device-side assert"),
    ("ECC", "an uncorrectable ECC error (hardware)"),
    ("Xid", "a GPU Xid error (hardware)"),
    ("fallen off the bus", "the GPU fell off the bus (hardware)"),
    ("misaligned address", "a misaligned address"),
    ("unspecified launch failure", "an unspecified launch failure"),
    ("unhandled cuda error", "a CUDA error inside NCCL"),
)


def _name_cuda_fault(found: list[Finding]) -> None:
    for f in found:
        if f.category != "cuda_fault" or ":" in f.summary.split(" (rank")[0]:
            continue
        text = " ".join(f.evidence)
        kind = next((k for needle, k in _CUDA_KINDS if needle in text), None)
        if kind:
            head, sep, tail = f.summary.partition(" (rank")
            f.summary = f"{head}: {kind}{sep}{tail}"


# -- SIGKILL with host-memory signs is the OOM killer ----------------------------------------


def _host_memory(found: list[Finding], scanners) -> None:
    kills = [f for f in found if f.category == "worker_sigkill" and f.root_cause]
    if not kills:
        return
    own_tbs = [tb for sc in scanners for tb in sc.tracebacks if not _launcher_tb(tb.lines)]
    shards = [sc.shards for sc in scanners if sc.shards is not None]
    oom_line = any(f.category == "oom_host" for f in found)
    if not (shards or oom_line) or own_tbs:
        return
    for f in kills:
        f.category = "oom_host"
        where = (
            "while loading the model"
            if shards and max(shards) < 100
            else "after the model's checkpoint shards were loaded"
        )
        f.summary = (
            f"rank {f.rank} was killed (SIGKILL) {where}: host RAM ran out"
            if f.rank is not None
            else f"a rank was killed (SIGKILL) {where}: host RAM ran out"
        )
        f.cause = (
            "Each rank loads its own copy of the model into host RAM before moving it "
            "to the GPU; with several ranks per node that can exceed the machine's "
            "memory, and the kernel's OOM killer sends SIGKILL (no Python error is "
            "printed)."
        )
        f.fix = (
            "Load with low_cpu_mem_usage=True and the compute dtype (torch_dtype=bf16), "
            "shard the load (FSDP/ZeRO-3 with cpu_ram_efficient_loading), run fewer ranks "
            "per node, or add swap/RAM; `dmesg | grep -i oom` confirms it."
        )


def _launcher_tb(lines: list[str]) -> bool:
    return any(_LAUNCHER_FRAMES.search(ln) for ln in lines) or any(
        _LAUNCHER_EXC.search(ln) for ln in lines[-2:]
    )


# -- exit code 1 everywhere, and no traceback in sight ----------------------------------------


def exit_code_only(f: Finding) -> bool:
    """A rank's failure known from its exit code alone (the launcher's report), with no
    traceback of the rank's own behind it yet."""
    return f.category == "rank_crashed" and "exit" in f.summary and " crashed:" not in f.summary


def _silent_exit_codes(found: list[Finding], scanners) -> None:
    generic = [f for f in found if exit_code_only(f)]
    if not generic:
        return
    own_tbs = [tb for sc in scanners for tb in sc.tracebacks if not _launcher_tb(tb.lines)]
    specific = [
        f
        for f in found
        if f.severity == "error" and f.category != "rank_crashed" and f.category not in _TIER_AFTER
    ]
    if own_tbs or specific:
        return
    ranks = sorted({f.rank for f in generic if f.rank is not None})
    for f in generic:
        f.cause = (
            "The rank exited with an error code, and the log shown holds no Python "
            "traceback: the error went to a file not shown here (each rank's own "
            "stdout/stderr under torchrun's --log_dir, or a stderr that was not "
            "captured)."
        )
        f.fix = (
            "Run again with `torchrun --redirects 3 --log_dir DIR` (or `--tee 3`) and "
            "read the failing rank's file; with `tunedeck launch` every rank's output is "
            "kept (`tunedeck logs RUN --rank N`)."
        )
    if len(ranks) > 1:
        generic[0].summary = (
            f"ranks {', '.join(map(str, ranks))} all exited with an error "
            f"code and no traceback is in this log"
        )


# -- NCCL probing its plugins --------------------------------------------------------------


def _nccl_probes(found: list[Finding], scanners) -> list[Finding]:
    probes = [f for f in found if f.category in ("nccl_socket_fallback", "ib_missing")]
    if not probes:
        return found
    hosts, nnodes = set(), 0
    for sc in scanners:
        hosts |= sc.nccl.hosts
        nnodes = max(nnodes, sc.nccl.nnodes or 0)
        hosts |= sc.hosts
    multi = nnodes > 1 or len(hosts) > 1
    keep = probes[0]
    for f in probes[1:]:
        for e in f.evidence:
            if e not in keep.evidence and len(keep.evidence) < 12:
                keep.evidence.append(e)
    keep.category, keep.rank = "nccl_socket_fallback", None
    if multi:
        keep.severity = "warning"
        keep.summary = (
            "NCCL found no InfiniBand/EFA network and uses TCP sockets between "
            "nodes: inter-node all-reduce will be slow"
        )
    else:
        keep.severity = "info"
        keep.summary = "NCCL probed for IB/EFA network plugins and found none (fine on one node)"
    keep.root_cause = True
    return [f for f in found if f not in probes or f is keep]


# -- static signs in a printed log --------------------------------------------------------


def _loss_zero_nan(found: list[Finding], scanners) -> list[Finding]:
    """loss printed as 0.0 after real losses while grad_norm is nan: the loss is not zero,
    the gradients overflowed (fp16) or the data produced NaN, and the steps do nothing."""
    if any(f.category == "loss_anomaly" and "nan" in f.summary for f in found):
        return []
    for sc in scanners:
        recs = sc.metrics.records() if sc.metrics.by_step or sc.metrics.batches else []
        seen_loss = False
        for r in recs:
            loss, gn = r.get("loss"), r.get("grad_norm")
            if isinstance(loss, (int, float)) and loss > 0:
                seen_loss = True
            if seen_loss and loss == 0.0 and isinstance(gn, float) and math.isnan(gn):
                n = sum(1 for x in recs if x.get("loss") == 0.0)
                return [
                    Finding(
                        category="loss_anomaly",
                        severity="error",
                        summary=f"loss 0.0 with grad_norm nan from step {r['step']} "
                        f"({n} steps at 0.0)",
                        cause="The loss drops to exactly 0 while the gradient norm is NaN: the "
                        "gradients overflowed (fp16 / a too high learning rate) or a batch "
                        "produced NaN, and the trainer reports 0 for skipped or corrupted "
                        "steps. The weights may already be NaN; nothing is being learned.",
                        fix="Train in bf16 instead of fp16, lower the learning rate, clip gradients "
                        "(max_grad_norm), and check the data for empty or all-masked samples; "
                        "resume from a checkpoint before the step named.",
                        rank=sc.source.rank,
                        node=sc.source.node,
                        evidence=[f"step={r['step']} loss={loss} grad_norm=nan"],
                        source=sc.name,
                        ident=f"loss_zero_grad_nan@{r['step']}",  # the count grows
                    )
                ]
    return []


def _starvation(found: list[Finding], scanners) -> list[Finding]:
    if any(f.category == "dataloader_starvation" for f in found):
        return []
    for sc in scanners:
        rows = sc.data_time[-50:]
        if len(rows) < 3:
            continue
        data = sum(d for _, d, _ in rows)
        step = sum(s for _, _, s in rows)
        if step <= 0 or data / step < 0.5:
            continue
        share = data / step
        return [
            Finding(
                category="dataloader_starvation",
                severity="warning",
                summary=f"waiting for data takes {share:.0%} of each step",
                cause="The logged data time is most of the step time: the GPUs wait for the "
                "DataLoader, so the run is as fast as the input pipeline, not the model.",
                fix="Raise the DataLoader's num_workers, set pin_memory=True, persistent_workers="
                "True and a prefetch_factor, move decoding/augmentation or tokenization "
                "offline, or read from faster storage.",
                rank=sc.source.rank,
                node=sc.source.node,
                evidence=[f"{sc.ref(ln)}: data {d:g} s of {s:g} s" for ln, d, s in rows[-4:]],
                source=sc.ref(rows[-1][0]),
                ident="data_time",  # the share moves with the log's last 50 lines
            )
        ]
    return []


# -- the chain -------------------------------------------------------------------------------


def _tier(f: Finding) -> int:
    c = f.category
    if c in _TIER_AFTER:
        return 4
    if c == "rank_crashed":
        if (
            _LAUNCHER_EXC.search(f.summary)
            or f.summary.endswith("(most recent call last):")
            or any(_LAUNCHER_FRAMES.search(e) for e in f.evidence)
        ):
            return 4  # the launcher's own traceback, or one cut before its exception
        if CONSEQUENCE_PATTERNS.search(f.summary) or " crashed:" not in f.summary:
            return 3  # a peer's broken connection, or only an exit code
        return 0
    if c in _TIER_LINK:
        return 3
    if c in _TIER_HANG:
        return 2
    if c in _TIER_SIGNAL:
        return 1
    return 0


_FOLLOWS_FROM = {
    "dataloader_shm": {"too_many_open_files"},
    "dataloader_worker_killed": {"too_many_open_files", "dataloader_shm", "oom_host"},
    "io_error": {"disk_full", "checkpoint_write_failed"},
    # one full disk: the checkpoint it stopped says more than a bare errno 28 elsewhere
    "disk_full": {"checkpoint_write_failed"},
}


def _line_of(f: Finding, scanners) -> tuple[int, int]:
    for i, sc in enumerate(scanners):
        if f.source.startswith(sc.name):
            m = _SOURCE_LINE.search(f.source)
            return i, int(m.group(1)) if m else 0
    return len(scanners), 0


def _mark_chain(found: list[Finding], scanners) -> None:
    errors = [f for f in found if f.severity == "error"]
    if not errors:
        _stopped_from_outside(found, scanners)
        return
    # consequences whatever the time: an abort after a timeout or a CUDA fault on its rank,
    # the launcher's own traceback, peers that lost their connection
    explained = {f.rank for f in errors if f.category in (_TIER_HANG | {"cuda_fault"})}
    for f in errors:
        if f.category == "worker_sigabrt" and (f.rank in explained or None in explained):
            f.root_cause = False
    tiers = {id(f): _tier(f) for f in errors}
    # the engine's own flags only said "not first in time"; what is a consequence by its
    # nature is decided here (tiers, the abort rule above, the launcher's signal)
    cands = [
        f
        for f in errors
        if f.root_cause or f.category not in (_TIER_SIGNAL | _TIER_AFTER | {"launcher_signal"})
    ]
    cands = [
        f
        for f in cands
        if not (f.category == "worker_sigabrt" and (f.rank in explained or None in explained))
    ] or errors
    # a category that follows from another when both are there (an fd limit makes opening a
    # shared-memory segment fail; a dead worker follows from host OOM or /dev/shm)
    present = {f.category for f in errors}
    cands = [f for f in cands if not present & _FOLLOWS_FROM.get(f.category, set())] or cands
    best = min(tiers[id(f)] for f in cands)
    top = [f for f in cands if tiers[id(f)] == best]
    timed = [f for f in top if f.t is not None]

    def key(f: Finding):
        return (f.t if f.t is not None else math.inf, *_line_of(f, scanners))

    if timed and len(timed) < len(top):
        # mixed: a line with a time and one without; the time of a line cannot be compared
        # with none, so line order in the log decides
        root = min(top, key=lambda f: _line_of(f, scanners))
    else:
        root = min(top, key=key)
    if root.rank is None:  # the rank the log shows for the same failure elsewhere
        twin = next((f for f in errors if f.category == root.category and f.rank is not None), None)
        if twin is not None:
            root.rank = twin.rank
        else:
            _rank_from_exits(root, scanners)
    for f in errors:
        if f is root:
            f.root_cause = True
        elif not (f.category == "flag_error" and root.category == "flag_error"):
            f.root_cause = False


def _stopped_from_outside(found: list[Finding], scanners) -> None:
    """Only SIGTERM exits and nothing that failed first: the rank torchrun names as the first
    failure was stopped from outside (a kill, a scheduler, a preemption); that stopped the run."""
    terms = [f for f in found if f.category == "worker_sigterm"]
    if not terms:
        return
    first = {
        fl.rank for sc in scanners for rep in sc.reports for fl in rep.failures if fl.root_cause
    }
    root = next((f for f in terms if f.rank in first), terms[0])
    root.severity, root.root_cause = "error", True
    who = f"rank {root.rank}" if root.rank is not None else "a rank"
    root.summary = f"{who} was stopped by SIGTERM from outside the run; nothing failed before it"
    root.cause = (
        "torchrun names this rank's SIGTERM as the first failure and no error "
        "precedes it: something outside sent it (a `kill`, a scheduler's time limit "
        "or preemption, a container stop)."
    )
    root.fix = (
        "Check the scheduler's log and who else can signal the job's processes; "
        "resume from the last checkpoint."
    )


def _rank_from_exits(root: Finding, scanners) -> None:
    """An error printed without a rank prefix (torchrun without --tee) belongs to the rank the
    launcher reports as failed first: torchrun's `Root Cause` entry, else the one rank that
    `failed (exitcode: N)` / DeepSpeed's `exits with return code` named with a real failure
    (SIGTERM exits are the launcher stopping the others)."""
    first = [
        (fl.rank, fl.host)
        for sc in scanners
        for rep in sc.reports
        for fl in rep.failures
        if fl.root_cause and fl.rank is not None and fl.exitcode not in (-15, -1)
    ]
    if not first:
        seen = {
            rec.get("local_rank")
            for sc in scanners
            for _, rec, _ in sc.torchrun_lines
            if rec.get("kind") == "failed" and rec.get("exitcode") not in (-15, -1)
        }
        seen.discard(None)
        first = [(r, None) for r in seen]
    if len({r for r, _ in first}) == 1:
        root.rank = first[0][0]
        if root.host is None and first[0][1] and first[0][1] != "localhost":
            root.host = first[0][1]
