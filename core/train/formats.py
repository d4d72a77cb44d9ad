"""Dataset row formats → one conversation (a list of {"role", "content"} messages).

The formats ms-swift users already have:

  messages        {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...]}
  query_response  {"query": str, "response": str, "history": [[q, r], ...]?, "system": str?}
  alpaca          {"instruction": str, "input": str?, "output": str, "system": str?}
  self_cognition  query_response rows whose text holds {{NAME}} / {{AUTHOR}} placeholders,
                  replaced by data.model_name / data.model_author (ms-swift's convention)

`auto` picks the format from the first usable row of each file, then every row of that file
must be in it (a file mixing formats is far more often a mistake than intended).

Every problem is a DataError starting with `file:line:`. With skip_bad_rows the bad rows are
collected instead, and the caller warns about them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

ROLES = ("system", "user", "assistant", "tool")
FORMATS = ("messages", "query_response", "alpaca", "self_cognition")
PLACEHOLDERS = {"{{NAME}}": "model_name", "{{AUTHOR}}": "model_author"}

Conversation = list[dict[str, str]]


class DataError(ValueError):
    """A dataset row (or file) that cannot be used; the message starts with `file:line:`."""


@dataclass
class Rows:
    """Conversations read from one file, plus where each came from and what was skipped."""

    path: Path
    format: str
    conversations: list[Conversation] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "file:line: problem", one per bad row


def detect_format(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return None
    if "messages" in obj:
        return "messages"
    if "query" in obj and "response" in obj:
        text = json.dumps(obj, ensure_ascii=False)
        return "self_cognition" if any(p in text for p in PLACEHOLDERS) else "query_response"
    if "instruction" in obj and "output" in obj:
        return "alpaca"
    return None


def _str(obj: dict, key: str, *, required: bool = True) -> str:
    v = obj.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str):
        raise ValueError(
            f'"{key}" must be a string, got {type(v).__name__}'
            if key in obj
            else f'missing "{key}"'
        )
    return v


def _messages(obj: dict) -> Conversation:
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ValueError('"messages" must be a non-empty list')
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be an object")
        if m.get("role") not in ROLES:
            raise ValueError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.get('role')!r}"
            )
        if not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}].content must be a string")
        out.append({"role": m["role"], "content": m["content"]})
    if "system" in obj and out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": _str(obj, "system")})
    return out


def _system(obj: dict) -> Conversation:
    s = _str(obj, "system", required=False)
    return [{"role": "system", "content": s}] if s else []


def _query_response(obj: dict) -> Conversation:
    out = _system(obj)
    hist = obj.get("history") or []
    if not isinstance(hist, list):
        raise ValueError('"history" must be a list of [query, response] pairs')
    for i, pair in enumerate(hist):
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not all(isinstance(x, str) for x in pair)
        ):
            raise ValueError(f"history[{i}] must be a [query, response] pair of strings")
        out += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    out += [
        {"role": "user", "content": _str(obj, "query")},
        {"role": "assistant", "content": _str(obj, "response")},
    ]
    return out


def _alpaca(obj: dict) -> Conversation:
    instruction = _str(obj, "instruction")
    extra = _str(obj, "input", required=False)
    user = f"{instruction}\n{extra}" if extra else instruction
    return _system(obj) + [
        {"role": "user", "content": user},
        {"role": "assistant", "content": _str(obj, "output")},
    ]


def substitute(conv: Conversation, names: dict[str, str]) -> Conversation:
    """Replace {{NAME}}/{{AUTHOR}}; a placeholder with no value configured is an error."""
    out = []
    for m in conv:
        text = m["content"]
        for ph, key in PLACEHOLDERS.items():
            if ph in text:
                if not names.get(key):
                    raise ValueError(f"uses {ph} but data.{key} is not set")
                text = text.replace(ph, names[key])
        out.append({"role": m["role"], "content": text})
    return out


PARSERS: dict[str, Callable[[dict], Conversation]] = {
    "messages": _messages,
    "query_response": _query_response,
    "alpaca": _alpaca,
    "self_cognition": _query_response,
}


def to_conversation(obj: Any, fmt: str, names: dict[str, str]) -> Conversation:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    conv = PARSERS[fmt](obj)
    if fmt == "self_cognition" or names.get("model_name") or names.get("model_author"):
        conv = substitute(conv, names)
    if not any(m["role"] == "assistant" for m in conv):
        raise ValueError("no assistant message, nothing to learn from")
    return conv


def _objects(path: Path) -> list[tuple[int, Any | Exception]]:
    """(line, parsed object or the JSON error) for a .jsonl file, or a .json array."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            arr = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path}:{e.lineno}: not valid JSON: {e.msg} (column {e.colno})"
            ) from None
        # A JSON array has no per-row lines; report the 1-based row index instead.
        return [(i, obj) for i, obj in enumerate(arr, start=1)]
    out: list[tuple[int, Any | Exception]] = []
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((no, json.loads(line)))
        except json.JSONDecodeError as e:
            out.append((no, ValueError(f"not valid JSON: {e.msg} (column {e.colno})")))
    return out


def read_rows(
    path: str | Path,
    fmt: str = "auto",
    *,
    names: dict[str, str] | None = None,
    skip_bad_rows: bool = False,
) -> Rows:
    """Parse and validate every row up front, so a bad row fails the run at start."""
    path = Path(path)
    names = names or {}
    objs = _objects(path)
    if fmt == "auto":
        fmt = next((f for _, o in objs if (f := detect_format(o))), None) or ""
        if not fmt:
            raise DataError(
                f'{path}: cannot tell the row format (expected "messages", '
                f'"query"/"response" or "instruction"/"output" keys); '
                f"set data.format"
            )
    if fmt not in PARSERS:
        raise DataError(f"{path}: unknown data.format {fmt!r}")
    rows = Rows(path, fmt)
    for no, obj in objs:
        where = f"{path}:{no}"
        try:
            if isinstance(obj, Exception):
                raise obj
            conv = to_conversation(obj, fmt, names)
        except ValueError as e:
            problem = f"{where}: {e}"
            if not skip_bad_rows:
                # Name the format when the row looks like another one: a mixed-up file.
                other = detect_format(obj)
                hint = (
                    f" (the file is {fmt}; this row looks like {other})"
                    if other not in (fmt, None)
                    else ""
                )
                raise DataError(problem + hint) from None
            rows.skipped.append(problem)
            continue
        rows.conversations.append(conv)
        rows.lines.append(no)
    if not rows.conversations:
        raise DataError(
            f"{path}: no usable rows" + (f" ({len(rows.skipped)} skipped)" if rows.skipped else "")
        )
    return rows
