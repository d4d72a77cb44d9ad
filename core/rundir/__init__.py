"""The run directory: every path of one run, who wrote it, and the JSON helpers for its files.

This module is the only place that knows the layout (docs/run-directory.md):

    runs/<run-id>/
      spec.toml            resolved RunSpec, frozen at launch (secrets masked)
      plan.json, launch.sh per-node argv/env (secrets masked), a script that reproduces it
      secrets.json         the real values of what those mask (tunedeck.core.rundir.secrets)
      state.json           status, pids, attempts (atomic writes; the agent's)
      stop.json            a stop request (the CLI's or the TUI's)
      run.db               SQLite: events, telemetry, findings (tunedeck.core.store.store)
      logs/agent.log, logs/torchrun-node<k>.log
      logs/node<k>/<id>_<x>/attempt_<n>/<local rank>/{stdout,stderr}.log, error.json
      events/rank<r>.jsonl, events/probe_rank<r>.jsonl
      stacks/rank<r>.txt   stack dumps the built-in trainer writes when asked (`tunedeck stacks`)
      output/              the default output_dir (checkpoints, ms-swift's logging.jsonl)

It reads and lists files; it never parses logs (tunedeck.core.ingest) nor opens run.db.

Only the run's owner reads a run: its folders are 0700 and the files written here 0600
(`RunDir.create`, `write_json_atomic`, `write_text_private`); the agent runs with umask 077, so
what it and the ranks write inside is private too.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunedeck.core.spec import RunSpec


# state.json statuses of a run that ended: one list for every layer that asks (runs, nodes,
# preflight's port check), declared with the rest of state.json's shape
from tunedeck.core.rundir.records import TERMINAL  # noqa: E402, F401  (re-exported)

FILE_MODE = 0o600  # a run's files: its owner only (they hold commands, paths, secrets)
DIR_MODE = 0o700


def write_json_atomic(path: Path, data: Any) -> None:
    """Readers never see a half-written file: temp file (0600), fsync, rename. Strict JSON:
    a NaN or infinity (which other JSON readers refuse) is written as null."""
    write_text_private(
        path, json.dumps(strict_json(data), indent=2, sort_keys=True, allow_nan=False) + "\n"
    )


def strict_json(data: Any) -> Any:
    """`data` with every float that is not finite replaced by None (containers copied only
    when they hold one)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        vals = {k: strict_json(v) for k, v in data.items()}
        return data if all(vals[k] is v for k, v in data.items()) else vals
    if isinstance(data, (list, tuple)):
        items = [strict_json(v) for v in data]
        return data if all(a is b for a, b in zip(items, data)) else items
    return data


def write_text_private(path: Path, text: str, mode: int = FILE_MODE) -> None:
    """Write `text` atomically (temp file, fsync, rename) with `mode` whatever the umask; a file
    replaced this way takes the new mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # created 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if mode != FILE_MODE:
                os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path, default: Any = None) -> Any:
    """The file's JSON, or `default` when it is missing or damaged (`json_problem` says why)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON or not UTF-8
        return default


def json_problem(path: Path, want: type = dict) -> tuple[Any, str | None]:
    """(content, None), or (None, why it cannot be read as a `want`) in one line, naming what
    a person can check: 'missing', 'empty', 'not UTF-8 (byte 17)', 'not JSON (line 3 column
    5: ...)', 'not a JSON object'."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, "missing"
    except OSError as e:
        return None, f"unreadable ({e.strerror or e})"
    if not raw.strip():
        return None, "empty"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 (byte {e.start})"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not JSON (line {e.lineno} column {e.colno}: {e.msg})"
    except RecursionError:
        return None, "not JSON (nested too deeply)"
    if not isinstance(data, want):
        return None, f"not a JSON {'object' if want is dict else want.__name__}"
    return data, None


@dataclass
class Source:
    """One file of a run and whose it is."""

    path: Path
    rank: int | None = None
    node: int | None = None
    attempt: int | None = None
    kind: str = "log"  # log | torchrun | error_json | events | jsonl


def _number_after(name: str, prefix: str, suffix: str = "") -> int | None:
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return None
    mid = name[len(prefix) : len(name) - len(suffix)]
    return int(mid) if mid.isdigit() else None


def event_rank(path: Path) -> int | None:
    """The rank of events/rank<r>.jsonl or events/probe_rank<r>.jsonl."""
    name = Path(path).name
    r = _number_after(name, "rank", ".jsonl")
    return r if r is not None else _number_after(name, "probe_rank", ".jsonl")


def source_for_file(path: Path) -> Source:
    """A lone file (given on the command line): its kind and rank from the name."""
    path = Path(path)
    name = path.name
    if name == "error.json":
        return Source(path, kind="error_json")
    if _number_after(name, "rank", ".jsonl") is not None:
        return Source(path, event_rank(path), kind="events")
    if name == "logging.jsonl":
        return Source(path, kind="jsonl")
    if name.startswith("torchrun-node"):
        return Source(path, node=_number_after(path.stem, "torchrun-node"), kind="torchrun")
    return Source(path)


class RunDir:
    """Paths of one run directory. Cheap to make; `nproc_per_node` reads plan.json once."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    @property
    def run_id(self) -> str:
        return self.path.name

    # -- files at the top --------------------------------------------------------------
    spec = property(lambda self: self.path / "spec.toml")
    plan = property(lambda self: self.path / "plan.json")
    launch_sh = property(lambda self: self.path / "launch.sh")
    secrets = property(lambda self: self.path / "secrets.json")
    state = property(lambda self: self.path / "state.json")
    stop_request = property(lambda self: self.path / "stop.json")
    db = property(lambda self: self.path / "run.db")
    logs = property(lambda self: self.path / "logs")
    events = property(lambda self: self.path / "events")
    agent_log = property(lambda self: self.path / "logs" / "agent.log")

    def create(self) -> None:
        """A new run's folders, its owner's only (0700); fails if the run directory exists
        already."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(mode=DIR_MODE)
        for d in (self.path, self.logs, self.events):
            d.mkdir(mode=DIR_MODE, exist_ok=True)
            os.chmod(d, DIR_MODE)  # mkdir's mode is cut by the umask, never widened

    def output_dir(self, spec: RunSpec) -> Path:
        """Where a run's checkpoints go: the spec's output_dir, else output/ in the run."""
        return (
            Path(spec.run.output_dir).expanduser() if spec.run.output_dir else self.path / "output"
        )

    # -- JSON files --------------------------------------------------------------------
    def read_state(self) -> dict[str, Any] | None:
        state = read_json(self.state)
        return state if isinstance(state, dict) else None

    def write_state(self, state: dict[str, Any]) -> None:
        write_json_atomic(self.state, state)

    def read_stop(self) -> dict[str, Any] | None:
        req = read_json(self.stop_request)
        return req if isinstance(req, dict) else None

    def read_plan(self) -> dict[str, Any]:
        plan = read_json(self.plan, {})
        return plan if isinstance(plan, dict) else {}

    @cached_property
    def nproc_per_node(self) -> int:
        """Ranks per node from plan.json (0 when unknown); fixed for a run's life."""
        try:
            return int(self.read_plan().get("nproc_per_node") or 0)
        except (TypeError, ValueError):
            return 0

    # -- torchrun's and the agent's logs -----------------------------------------------
    def torchrun_log(self, node: int) -> Path:
        return self.path / "logs" / f"torchrun-node{node}.log"

    def node_log_dir(self, node: int) -> Path:
        """torchrun's --log_dir for one node: <id>_<x>/attempt_<n>/<local rank>/ below it."""
        return self.path / "logs" / f"node{node}"

    def torchrun_logs(self) -> list[Source]:
        return [
            Source(p, node=_number_after(p.stem, "torchrun-node"), kind="torchrun")
            for p in sorted(self.logs.glob("torchrun-node*.log"))
        ]

    def rank_logs(self, latest_only: bool = False) -> list[Source]:
        """stdout/stderr/error.json of every rank, ordered by (attempt, rank)."""
        out: list[Source] = []
        for node_dir in sorted(self.logs.glob("node*")):
            node = _number_after(node_dir.name, "node")
            if node is None or not node_dir.is_dir():
                continue
            nproc = self.nproc_per_node or _dir_nproc(node_dir)
            attempts = _attempt_dirs(node_dir)
            first = 0
            if latest_only and attempts:
                first, attempts = len(attempts) - 1, attempts[-1:]
            for i, att in enumerate(attempts, first):
                for local_dir in sorted(
                    (p for p in att.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
                ):
                    rank = node * nproc + int(local_dir.name)
                    for name, kind in (
                        ("stdout.log", "log"),
                        ("stderr.log", "log"),
                        ("error.json", "error_json"),
                    ):
                        p = local_dir / name
                        if p.exists():
                            out.append(Source(p, rank, node, i, kind))
        out.sort(key=lambda s: (s.attempt or 0, s.rank or 0))
        return out

    def rank_log_files(self, rank: int = 0) -> list[Path]:
        """stdout and stderr of a rank's latest attempt; [] before the rank has started."""
        nproc = self.nproc_per_node
        node, local = divmod(rank, nproc) if nproc else (0, rank)
        attempts = _attempt_dirs(self.node_log_dir(node))
        for att in reversed(attempts):
            d = att / str(local)
            if d.is_dir():
                return [d / "stdout.log", d / "stderr.log"]
        return []

    # -- event streams -----------------------------------------------------------------
    def event_file(self, rank: int) -> Path:
        """events/rank<r>.jsonl: the built-in trainer's stream (the agent's, for other
        backends)."""
        return self.path / "events" / f"rank{rank}.jsonl"

    def stack_file(self, rank: int) -> Path:
        """stacks/rank<r>.txt: where the built-in trainer's faulthandler writes every thread's
        stack when asked (stack_request; appended, one dump after another). A file of its own,
        so dumps never land in the rank's stderr log, where they would read as tracebacks."""
        return self.path / "stacks" / f"rank{rank}.txt"

    def stack_request(self, rank: int) -> Path:
        """stacks/rank<r>.request: touched to ask rank r for a dump into its stack_file."""
        return self.path / "stacks" / f"rank{rank}.request"

    def probe_file(self, rank: int) -> Path:
        """events/probe_rank<r>.jsonl: what the DataLoader probe writes inside a rank."""
        return self.path / "events" / f"probe_rank{rank}.jsonl"

    def event_files(self) -> list[Path]:
        found = [p for p in self.events.glob("rank*.jsonl") if event_rank(p) is not None]
        return sorted(found, key=event_rank)

    def probe_files(self) -> list[Path]:
        found = [p for p in self.events.glob("probe_rank*.jsonl") if event_rank(p) is not None]
        return sorted(found, key=event_rank)

    def logging_jsonl_files(self, max_depth: int = 4) -> list[Path]:
        """ms-swift's logging.jsonl files (output/v0-<date>/logging.jsonl). The agent looks
        every few seconds, so checkpoint folders (hundreds on a long run), logs and events
        are not walked."""
        found = []
        base = len(self.path.parts)
        for root, dirs, files in os.walk(self.path):
            depth = len(Path(root).parts) - base
            dirs[:] = (
                []
                if depth >= max_depth
                else sorted(
                    d
                    for d in dirs
                    if not (
                        d.startswith(("checkpoint-", "."))
                        or (depth == 0 and d in ("logs", "events"))
                    )
                )
            )
            if "logging.jsonl" in files:
                found.append(Path(root) / "logging.jsonl")
        return sorted(found)

    def user_logs(self) -> list[Source]:
        """Logs a user put next to the run (console captures of tools launched by hand)."""
        return [Source(p) for p in sorted(self.path.glob("*.log"))]


def _attempt_dirs(node_dir: Path) -> list[Path]:
    """attempt_<n> folders of one node in time order. Each agent attempt is a torchrun
    invocation with its own <id>_<x>/ folder (torchrun's own restarts, attempt_<n>, inside)."""
    try:
        invocations = sorted(
            (p for p in node_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime
        )
    except OSError:
        return []
    return [
        a
        for inv in invocations
        for a in sorted(inv.glob("attempt_*"), key=lambda p: _number_after(p.name, "attempt_") or 0)
    ]


def _dir_nproc(node_dir: Path) -> int:
    """Without a plan: one more than the highest local rank folder."""
    locals_ = [int(p.name) for p in node_dir.glob("*/attempt_*/*") if p.name.isdigit()]
    return max(locals_) + 1 if locals_ else 1
