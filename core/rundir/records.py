"""state.json as typed records: the one declaration of its shape.

`RunState` (with `Progress`, `Launch`, `Attempt` and the `Status` enum) is the schema: the
agent's new state, the readers' checks (core/store/state.py) and docs/run-directory.md's table
all come from these fields, so a key the code writes is a field here or it is not written.
`from_json` reads any dict: a field whose value is not of its type is left at its default and
named in `problems`; keys this version does not know are kept in `extra` and written back by
`to_json`, so an older tunedeck reading a newer run loses nothing.
"""

from __future__ import annotations

import math
import os
import time
import typing
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, Union

INT_LIMIT = 1 << 63  # SQLite's integers, and every other reader's


class Status(str, Enum):
    """What the agent writes; readers add `lost`, `damaged`, `foreign`."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    QUEUED = "queued"  # waiting in the home's GPU queue (core/queue), before pending

    def __str__(self) -> str:
        return self.value


TERMINAL = (Status.SUCCEEDED.value, Status.FAILED.value, Status.STOPPED.value)
STATUSES = tuple(s.value for s in Status)
# A run that ended stopped or failed never records exit code 0, even where torchrun exited 0
# (its ranks heard a stop, checkpointed and ended cleanly): 0 says "succeeded" to every shell,
# scheduler and script. Such a run records 143, a SIGTERM's 128 + 15; the attempt keeps
# torchrun's own code (`attempts[-1].exit_code`).
STOPPED_EXIT = 143


def run_exit_code(status: str, torchrun_rc: int | None) -> int | None:
    """The exit code state.json records for a run that ended `status` with torchrun's code."""
    return STOPPED_EXIT if torchrun_rc == 0 and status != Status.SUCCEEDED.value else torchrun_rc


def number_or_none(v: Any) -> int | float | None:
    """`v` when it is a finite number a reader can use (not a bool), else None."""
    if type(v) is float:
        return v if math.isfinite(v) else None
    return v if type(v) is int and abs(v) < 1e308 else None


class Record:
    """from/to JSON driven by the dataclass fields and their annotations."""

    extra: dict[str, Any]
    VITAL: ClassVar[tuple[str, ...]] = ()
    OMIT_NONE: ClassVar[bool] = False  # to_json leaves out optional fields that are None

    @classmethod
    def keys(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls) if f.name != "extra")  # type: ignore

    @classmethod
    def from_json(cls, data: Any) -> "Record":
        rec, _ = cls.parse(data)
        return rec

    @classmethod
    def parse(cls, data: Any) -> tuple["Record", list[str]]:
        """The record and what was wrong ('key: expected a number, got 'x'')."""
        if not isinstance(data, dict):
            return cls._blank(), ["not a JSON object"]
        hints = _hints(cls)
        values: dict[str, Any] = {}
        problems: list[str] = []
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name == "extra":
                continue
            if f.name not in data:
                continue
            tp, raw = hints[f.name], data[f.name]
            sub = _record_type(tp)
            if sub is not None and type(raw) is dict:  # named inside: progress.step: ...
                values[f.name], inner = sub.parse(raw)
                problems += [f"{f.name}.{x}" for x in inner]
                continue
            item = _list_record_type(tp)
            if item is not None and type(raw) is list:  # launches[0].after: ...
                values[f.name] = []
                for i, x in enumerate(raw):
                    if type(x) is not dict:
                        problems.append(f"{f.name}[{i}]: expected an object, got {_shown(x)}")
                        continue
                    rec, inner = item.parse(x)
                    values[f.name].append(rec)
                    problems += [f"{f.name}[{i}].{y}" for y in inner]
                continue
            v, why = _coerce(tp, raw)
            if why is None:
                values[f.name] = v
            else:
                problems.append(f"{f.name}: {why}")
        extra = {k: v for k, v in data.items() if k not in hints}
        blank = cls._blank()
        for name, v in values.items():
            setattr(blank, name, v)
        blank.extra = extra
        return blank, problems

    @classmethod
    def _blank(cls) -> "Record":
        kw = {f.name: _default(f) for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            if f.name == "extra":
                continue
            v = getattr(self, f.name)
            if v is None and self.OMIT_NONE:
                continue
            out[f.name] = _plain(v)
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out


@dataclass
class Progress(Record):
    """Rank 0's newest step as the agent copied it (each value checked)."""

    step: int = 0
    max_steps: int = 0
    loss: float | None = None
    lr: float | None = None
    tokens_per_s: float | None = None
    t: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Launch(Record):
    """A torchrun the agent started: its processes carry `id` (core/supervisor/procs.py)."""

    id: str = ""
    attempt: int = 0
    boot: str = ""
    after: int = 0  # the agent's start time in clock ticks: its processes are later
    t: float = 0.0
    torchrun_pid: int | None = None
    from_step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    OMIT_NONE: ClassVar[bool] = True  # "torchrun_pid" absent: died before starting it


@dataclass
class Attempt(Record):
    """How one torchrun ended."""

    attempt: int = 0
    exit_code: int | None = None  # negative: the signal that ended it
    ended: float | None = None
    exit_code_from: str | None = None  # an adopted attempt: what its code was read from
    extra: dict[str, Any] = field(default_factory=dict)

    OMIT_NONE: ClassVar[bool] = True


@dataclass
class RunState(Record):
    """state.json."""

    run_id: str
    name: str = ""
    status: Status = Status.PENDING
    message: str = ""
    created: float = 0.0
    started: float | None = None
    ended: float | None = None
    host: str | None = None
    agent_pid: int | None = None
    agent_pgid: int | None = None
    agent_create_time: float | None = None
    torchrun_pid: int | None = None
    worker_pids: list[int] = field(default_factory=list)
    pgids: list[int] = field(default_factory=list)
    pid_identity: dict[str, dict] = field(default_factory=dict)
    rank_pids: dict[str, int] = field(default_factory=dict)
    launches: list[Launch] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    master_port: int | None = None
    port_moves: list[dict] = field(default_factory=list)  # core/supervisor/portmove
    launcher: dict | None = None  # the process that wrote the run and starts its agent next
    attempt: int = 0
    exit_code: int | None = None
    stop_requested: str | None = None
    preflight: dict | None = None
    progress: Progress = field(default_factory=Progress)
    agent_crashes: int = 0
    io_pauses: list[dict] = field(default_factory=list)
    adopted: list[dict] = field(default_factory=list)
    slurm_job: str | int | None = None
    net: dict | None = None  # a multi-node run's node: where its ranks talk from (nodes/iface.py)
    beat: float | None = None
    survivors: list[int] = field(default_factory=list)
    forced_stop: dict | None = None
    db_restored: list[dict] = field(default_factory=list)
    output_shared_with: list[str] | None = None
    queue: dict | None = None
    sweep: dict | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    VITAL: ClassVar[tuple[str, ...]] = ("run_id", "status")

    @classmethod
    def new(cls, run_id: str, name: str, max_steps: int) -> "RunState":
        return cls(
            run_id=run_id,
            name=name,
            message="",
            created=time.time(),
            host=os.uname().nodename,
            progress=Progress(max_steps=max_steps),
        )

    @classmethod
    def _blank(cls) -> "RunState":
        return cls(run_id="")


# -- types ------------------------------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: hints[f.name] for f in fields(cls)}  # type: ignore[arg-type]
    return _HINTS[cls]


def _record_type(tp: Any) -> type[Record] | None:
    """The Record class a field holds (itself or optional), else None."""
    for t in (tp, *typing.get_args(tp)):
        if isinstance(t, type) and issubclass(t, Record):
            return t
    return None


def _list_record_type(tp: Any) -> type[Record] | None:
    """The Record class of a list field's items, else None."""
    if typing.get_origin(tp) is list:
        return _record_type(typing.get_args(tp)[0])
    return None


def _default(f) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def words(tp: Any) -> str:
    """A type as the errors name it ('an integer', 'a list of integers', ...)."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin is Union:
        inner = [a for a in args if a is not type(None)]
        return words(inner[0]) if len(inner) == 1 else " or ".join(map(words, inner))
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is Status:
        return f"one of {', '.join(STATUSES)}"
    if origin is list:
        if args and args[0] is int:
            return "a list of integers"
        return "a list"
    return "an object"


def _coerce(tp: Any, v: Any) -> tuple[Any, str | None]:
    """(value as the field holds it, None) or (None, why it is not of type `tp`)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union or (origin is not None and type(None) in args):
        if v is None:
            return None, None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0] if len(inner) == 1 else Any, v)
    if tp is Any:
        return v, None
    if v is None:
        return None, f"expected {words(tp)}, got None"
    ok: bool
    if tp is int:
        ok = type(v) is int and -INT_LIMIT <= v < INT_LIMIT
    elif tp is float:
        ok = number_or_none(v) is not None
    elif tp is str:
        ok = type(v) is str
    elif tp is Status:
        if v in STATUSES:
            return Status(v), None
        ok = False
    elif origin is list:
        if type(v) is not list:
            ok = False
        elif args and isinstance(args[0], type) and issubclass(args[0], Record):
            return [args[0].from_json(x) for x in v if isinstance(x, dict)], None
        elif args and args[0] in (int, str):
            ok = all(_coerce(args[0], x)[1] is None for x in v)
        else:
            ok = True
    elif isinstance(tp, type) and issubclass(tp, Record):
        if type(v) is not dict:
            ok = False
        else:
            return tp.from_json(v), None
    elif origin is dict or tp is dict:
        ok = type(v) is dict
    else:
        ok = True
    if ok:
        return v, None
    return None, f"expected {words(tp)}, got {_shown(v)}"


def _plain(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_json()
    if isinstance(v, Status):
        return v.value
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
