"""What the front ends use of the core: one module to import from (`tunedeck.core.api`).

The command line (`tunedeck.cli`) imports from the core only this module, `tunedeck.core.spec`
(the RunSpec and its loading) and `tunedeck.core.rundir` (the run-directory layout); an
import-linter contract in pyproject.toml holds it. The functions here are the core's own,
re-exported, or thin wrappers that import their module when first called: the diagnosis, the
preflight checklist, run.db and the metrics stream cost tenths of a second to import, and
`tunedeck ls` answers without them.

Nothing here is new logic but `diagnose`, the merge of a run's log findings with those its
agent stored (the `tunedeck diagnose` verb's, asked by tests too); each other name's owner is
in docs/architecture.md ("Who owns what").
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

# -- where things live, text for a terminal ------------------------------------------------
from tunedeck.core.paths import PRESETS_DIR, runs_root
from tunedeck.core.text import clean, fmt_age, fmt_duration, fmt_loss, fmt_rate, print_json

# -- runs: find, launch, stop, resume, clone, delete ----------------------------------------
from tunedeck.core.views.registry import (
    Registry,
    RunInfo,
    RunNotFound,
    find_run,
    list_runs,
    log_tail,
)
from tunedeck.core.store.state import TERMINAL
from tunedeck.core.supervisor.launch import LaunchError, launch, shared_with
from tunedeck.core.supervisor.control import ForeignRun, request_stop, stop, wait_settled
from tunedeck.core.views.manage import (
    ManageError,
    clone_spec,
    delete_run,
    plan_delete,
    resume_spec,
)

# -- a spec's plan: preview, export, import (the backends) -----------------------------------
from tunedeck.core.preflight.preview import is_default, preview, setting_value, settings_lines
from tunedeck.core.preflight.inputs import length_report
from tunedeck.core.backends.export import (
    FORMATS as EXPORT_FORMATS,
    ExportError,
    export,
    vllm_for_run,
)
from tunedeck.core.backends.importer import CommandImportError, import_command
from tunedeck.core.backends.swift.flags import FlagTableError
from tunedeck.core.estimate.resolve import free_port, pin_port, resolve
from tunedeck.core.estimate.batch import effective_batch, rescale_grad_accum
from tunedeck.core.estimate.arch import ArchError
from tunedeck.core.telemetry.gpus import GpuFacts, probe_gpus

__all__ = [
    "EXPORT_FORMATS",
    "create_sweep",
    "parse_grid",
    "sweep_rows",
    "sweep_of",
    "newest_sweep",
    "queue_rows",
    "alert_test",
    "alert_feed",
    "PRESETS_DIR",
    "ArchError",
    "GpuFacts",
    "is_default",
    "length_report",
    "setting_value",
    "advice_for",
    "estimate_run",
    "length_unless_steps",
    "own_keys",
    "probe_gpus",
    "reads_spec_toml",
    "speed_flag_lines",
    "warm_backend",
    "warm_note",
    "TERMINAL",
    "Answer",
    "Chat",
    "ModelOutError",
    "ModelSource",
    "export_model",
    "pick_checkpoint",
    "tracking_dir",
    "tensorboard_logdir",
    "CommandImportError",
    "ExportError",
    "FlagTableError",
    "ForeignRun",
    "LaunchError",
    "ManageError",
    "Registry",
    "RunInfo",
    "RunNotFound",
    "check_run",
    "clean",
    "clone_spec",
    "delete_run",
    "diagnose",
    "dump_stacks",
    "export",
    "failures",
    "find_run",
    "fmt_age",
    "fmt_duration",
    "fmt_loss",
    "fmt_rate",
    "follow",
    "format_node_rows",
    "free_port",
    "gate_record",
    "import_command",
    "iter_records",
    "launch",
    "list_runs",
    "log_tail",
    "make_context",
    "node_rows",
    "plan_delete",
    "pin_port",
    "preview",
    "settings_lines",
    "print_json",
    "problems",
    "ordered",
    "read_findings",
    "request_stop",
    "effective_batch",
    "rescale_grad_accum",
    "resolve",
    "resume_spec",
    "run_checks",
    "runs_root",
    "shared_with",
    "smoke_run",
    "stack_suspects",
    "stack_where",
    "stop",
    "summary",
    "summary_line",
    "write_json",
    "vllm_for_run",
    "wait_settled",
]


# -- the trained model out: which checkpoint, export, chat, the trackers' folder ------------
from tunedeck.core.modelout import ModelOutError, Source as ModelSource, pick as pick_checkpoint
from tunedeck.core.modelout.chat import Answer, Chat
from tunedeck.core.trackers import tensorboard_logdir, tracking_dir


def export_model(src: ModelSource, out: Path, **kw: Any) -> Path:
    """The checkpoint as a transformers folder (merged, or the adapter alone) with a model card."""
    from tunedeck.core.modelout.export import export_model as _export

    return _export(src, out, **kw)


def __getattr__(name: str) -> Any:
    """The viewers' types (what the TUI's monitor and loss plot hold: RunWatcher, Snapshot,
    LogState, RankLog, Literal, Store, RankNccl, STACK_SUSPECT, STACK_WAITING), imported when
    first asked for: run.db's Store and the watcher cost a tenth of a second the CLI's `ls` never
    spends. Plain imports, so the import-linter graph has them."""
    if name in ("RunWatcher", "Snapshot", "LogState", "RankLog", "Literal"):
        from tunedeck.core.views import watch

        return getattr(watch, name)
    if name == "Store":
        from tunedeck.core.store.store import Store

        return Store
    if name == "RankNccl":
        from tunedeck.core.views.nccl import RankNccl

        return RankNccl
    if name in ("STACK_SUSPECT", "STACK_WAITING"):
        from tunedeck.core.supervisor import stacks

        return getattr(stacks, name.removeprefix("STACK_"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- preflight: the checklist a launch is gated on -------------------------------------------


def make_context(*args: Any, **kw: Any) -> Any:
    """The preflight context of a spec file (with `--set` overrides) or of `spec=`."""
    from tunedeck.core.preflight import make_context as _make

    return _make(*args, **kw)


def run_checks(ctx: Any, only: list[str] | None = None) -> Any:
    """The checks' results, one at a time (a UI shows them as they come)."""
    from tunedeck.core.preflight import run_checks as _run

    return _run(ctx, only)


def ordered(results: list) -> list:
    """The checklist's order: failures first."""
    from tunedeck.core.preflight import ordered as _ordered

    return _ordered(results)


def failures(results: list) -> list:
    from tunedeck.core.preflight import failures as _failures

    return _failures(results)


def gate_record(results: list | None, **kw: Any) -> dict:
    """What a run keeps of its gate (passed, overridden, skipped)."""
    from tunedeck.core.preflight import gate_record as _record

    return _record(results, **kw)


def summary(results: list) -> dict[str, int]:
    from tunedeck.core.preflight import summary as _summary

    return _summary(results)


def summary_line(counts: dict[str, int]) -> str:
    from tunedeck.core.preflight import summary_line as _line

    return _line(counts)


def smoke_run(spec: Any, **kw: Any) -> Any:
    """The real run for a few steps, waited for; a check result."""
    from tunedeck.core.supervisor.smoke import smoke_run as _smoke

    return _smoke(spec, **kw)


# -- a run's records: metrics, logs, findings, files, nodes, stacks --------------------------


def iter_records(ref: str | Path, **kw: Any) -> Any:
    """A run's (or a log file's) metric records, streamed; `since`, `every`, `last` narrow."""
    from tunedeck.core.views.metrics import iter_records as _iter

    return _iter(ref, **kw)


def write_json(recs: Any, out: Any, **kw: Any) -> None:
    from tunedeck.core.views.metrics import write_json as _write

    _write(recs, out, **kw)


def follow(files: list[Path], **kw: Any) -> Any:
    """The lines a rank's log files gain, until `stop()` says so."""
    from tunedeck.core.ingest.tail import follow as _follow

    return _follow(files, **kw)


def read_findings(run_dir: str | Path) -> list[dict[str, Any]]:
    """The findings the agent stored in run.db."""
    from tunedeck.core.store.store import read_findings as _read

    return _read(run_dir)


def diagnose(targets: list[str]) -> list:
    """Findings for runs (id, prefix, name or directory) and log files: a run's come from its
    logs merged with those the agent stored in run.db (live detectors), once per key."""
    from tunedeck.core.diagnose.chain import causes_first
    from tunedeck.core.diagnose.engine import diagnose_files, diagnose_run
    from tunedeck.core.diagnose.finding import Finding
    from tunedeck.core.nodes.loopback import name_interface

    findings: list[Finding] = []
    files: list[Path] = []
    for ref in targets:
        p = Path(ref)
        if p.is_file():
            files.append(p)
            continue
        run_dir = p if p.is_dir() else find_run(ref).run_dir  # RunNotFound: the caller says it
        mine = diagnose_run(run_dir)
        seen = {f.key() for f in mine}  # per run: another run's finding is no duplicate
        for d in read_findings(run_dir):
            f = Finding.from_json(d)
            category, rank, _node, what = key = f.key()
            # one the logs gave too (a refined one by its ident; the logs' names no node where
            # the agent's names the node it ran on, as its LossMonitor's do)
            if key not in seen and (category, rank, None, what) not in seen:
                mine.append(f)
                seen.add(key)
        # a stop asked for and a lost node explain what the agent stored too (chain.py)
        mine = causes_first(mine)
        # ranks on loopback explain what the logs and the live monitors said
        findings += name_interface(mine, [Path(run_dir)])
    if files:
        findings += diagnose_files(files)
    return findings


def check_run(run_dir: Path) -> list:
    """What is wrong with a run directory, file by file (`tunedeck doctor`)."""
    from tunedeck.core.views.doctor import check_run as _check

    return _check(run_dir)


def problems(checks: list) -> list:
    from tunedeck.core.views.doctor import problems as _problems

    return _problems(checks)


def node_rows(run_dir: Path, findings: list) -> list[dict[str, Any]]:
    """The nodes of a run as the head sees them."""
    from tunedeck.core.nodes.view import node_rows as _rows

    return _rows(run_dir, findings)


def format_node_rows(rows: list[dict[str, Any]]) -> list[str]:
    from tunedeck.core.nodes.view import format_rows

    return format_rows(rows)


def dump_stacks(run_dir: Path, **kw: Any) -> list:
    """The Python stack of every rank of a running run."""
    from tunedeck.core.supervisor.stacks import dump_stacks as _dump

    return _dump(run_dir, **kw)


def stack_suspects(dumps: list) -> list:
    from tunedeck.core.supervisor.stacks import suspects

    return suspects(dumps)


def stack_where(dump: Any, odd: list) -> str:
    from tunedeck.core.supervisor.stacks import where

    return where(dump, odd)


# -- the estimate and what the compose form asks of a backend --------------------------------


def estimate_run(spec: Any, **kw: Any) -> Any:
    """Memory, throughput and ETA of the run `spec` starts (the backend's defaults in place of
    unset keys)."""
    from tunedeck.core.backends.run_estimate import estimate_run as _estimate

    return _estimate(spec, **kw)


def length_unless_steps(spec: Any) -> str | None:
    from tunedeck.core.backends.run_estimate import length_unless_steps as _length

    return _length(spec)


def advice_for(est: Any, spec: Any, *, gpus: int, gpu_mem_gib: float) -> tuple:
    from tunedeck.core.backends.advice import advice_for as _advice

    return _advice(est, spec, gpus=gpus, gpu_mem_gib=gpu_mem_gib)


def speed_flag_lines(advice: Any) -> list[str]:
    from tunedeck.core.backends.advice import speed_flag_lines as _lines

    return _lines(advice)


def own_keys(backend: str | None = None) -> frozenset[str]:
    """The spec keys `backend`'s own parser sets (unset: its default applies); None: any
    backend's."""
    from tunedeck.core.backends import BACKENDS

    chosen = [BACKENDS[backend]] if backend in BACKENDS else [] if backend else BACKENDS.values()
    return frozenset().union(*(b.own_keys for b in chosen))


def reads_spec_toml(backend: str) -> bool:
    """The trainer reads its settings from the run's spec.toml (tunedeck's own)."""
    from tunedeck.core.backend_traits import traits_of

    return traits_of(backend).own_trainer


_warmed: dict[str, str] = {}
_warm_lock = threading.Lock()


def warm_note(backend: str) -> str:
    """What a first preview of `backend` waits for ('' when nothing, or already read)."""
    from tunedeck.core.backends import BACKENDS

    b = BACKENDS.get(backend)
    return b.warm_note if b and b.warm and backend not in _warmed else ""


def warm_backend(backend: str) -> str:
    """Read what `backend`'s previews need, once per process (blocking: call from a worker):
    '' or why it could not be read (then previews say so instead of retrying)."""
    from tunedeck.core.backends import BACKENDS

    b = BACKENDS.get(backend)
    if b is None or b.warm is None:
        return ""
    with _warm_lock:
        if backend not in _warmed:
            _warmed[backend] = b.warm()
        return _warmed[backend]


def alert_test(spec: Any | None) -> list[tuple[str, str]]:
    """`tunedeck alerts test`: a message through every channel the spec (or, without one,
    the user's alerts.toml) configures; (channel, '' or why it failed)."""
    from tunedeck.core.alerts.config import config_for
    from tunedeck.core.alerts.deliver import send_test
    from tunedeck.core.spec import RunSpec

    spec = spec or RunSpec(name="alerts.toml")
    return send_test(config_for(spec), spec.name)


def alert_feed(root: Path | None = None) -> Any:
    """The TUI's terminal channel: an `AlertFeed` (core/alerts/feed.py) whose `poll(run_id)`
    returns the alerts agents recorded since it was made, each once."""
    from tunedeck.core.alerts.feed import AlertFeed

    return AlertFeed(root)


def queue_rows(root: Path | None = None) -> list[dict[str, Any]]:
    """`tunedeck queue`: the runs of this home waiting for GPUs (position, priority, since,
    why) and the started runs that hold GPUs (core/queue), read through the registry so a
    queued run whose agent was lost is adopted and waits again."""
    from tunedeck.core.queue.gpus import held_by
    from tunedeck.core.queue.wait import order_key

    runs = list_runs(root or runs_root())
    waiting = sorted((r for r in runs if r.status == "queued"), key=lambda r: order_key(r.state))
    rows = []
    for i, r in enumerate(waiting, 1):
        q = r.state.get("queue") or {}
        rows.append(
            dict(
                position=i,
                run_id=r.run_id,
                name=r.name,
                status=r.status,
                priority=q.get("priority", 0),
                since=q.get("since"),
                gpus=None,
                message=r.message,
            )  # fmt: skip
        )
    for r in runs:
        q = r.state.get("queue") or {}
        if r.active and r.status != "queued" and "gpus" in q:
            rows.append(
                dict(
                    position=0,
                    run_id=r.run_id,
                    name=r.name,
                    status=r.status,
                    priority=q.get("priority", 0),
                    since=q.get("since"),
                    started=q.get("started"),
                    gpus=held_by(r.state, ""),
                    message=r.message,
                )  # fmt: skip
            )
    return rows


def create_sweep(*args: Any, **kw: Any) -> dict[str, Any]:
    """`tunedeck sweep SPEC --grid ...` (core/sweep/create.py)."""
    from tunedeck.core.sweep.create import create_sweep as create

    return create(*args, **kw)


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    from tunedeck.core.sweep.create import parse_grid as parse

    return parse(items)


def sweep_rows(sweep_id: str) -> list[dict[str, Any]]:
    """`tunedeck sweep show ID`: one row per point (core/sweep/table.py)."""
    from tunedeck.core.sweep.table import sweep_rows as rows

    return rows(sweep_id)


def sweep_of(run_id: str) -> str | None:
    """The sweep a run is a point of, else None (core/sweep/table.py)."""
    from tunedeck.core.sweep.table import sweep_of as of

    return of(run_id)


def newest_sweep() -> str | None:
    """This home's newest sweep id, else None."""
    from tunedeck.core.sweep.table import newest_sweep as newest

    return newest()
