"""The frames a node's records travel in over ssh: one JSON object per line.

remote → head
  {"k": "hello", "run": <remote run folder>, "pid": <serve pid>, "started": bool}
  {"k": "data", "f": <head-relative path>, "o": <offset>, "d": <base64 bytes>}
  {"k": "state", "data": <the node agent's state.json>}
  {"k": "gone", "why": ...}       the node's agent is dead while its run is not over
  {"k": "end"}                    the node's run is over and every byte was sent
  {"k": "error", "why": ...}
head → remote
  the first line: {"op": "start" | "attach", ...} (tunedeck.core.nodes.remote)
  {"op": "stop", "mode": "graceful" | "hard", "grace_s": <float|None>}

A data frame says where its bytes go, so a frame sent twice (a resume after a dropped
connection) writes the same bytes at the same place: the head's file sizes are the offsets it
resumes from, and nothing is lost or doubled.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

CHUNK = 256 << 10


def frame(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def data_frame(rel: str, offset: int, data: bytes) -> bytes:
    return frame({"k": "data", "f": rel, "o": offset, "d": base64.b64encode(data).decode()})


def parse(line: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None  # ssh's own chatter, a banner: not ours
    return obj if isinstance(obj, dict) else None


def safe_rel(rel: Any) -> str | None:
    """A frame's path, only when it stays inside the run directory."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel:
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return rel


def write_at(root: Path, rel: str, offset: int, data: bytes) -> None:
    """Write `data` at `offset` of root/rel (created 0600): the same frame twice changes
    nothing."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)
