"""A single-node run whose rendezvous port was taken between its pick and torchrun's bind.

A launch picks a free port (core/estimate/resolve.py) seconds before torchrun listens on it;
on a busy machine another process can bind it meanwhile, and torchrun then fails at once with
EADDRINUSE, before any rank exists. On one node the port is private to the run (only its own
torchrun and ranks use it), so the agent moves the run to another free port and starts the
same attempt again, instead of failing a run that never began. Multi-node ports are every
node's to know, so they stay the user's to change (the diagnosis names the clash).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tunedeck.core.diagnose.rules import RULES
from tunedeck.core.estimate.resolve import free_port
from tunedeck.core.rundir import RunDir, write_json_atomic, write_text_private

MAX_MOVES = 3  # a port that is taken again and again is no race: the run fails as it would
# the diagnosis's own words for a port in use, so the two never disagree on what a clash is
_TAKEN = next(r.pattern for r in RULES if r.category == "port_in_use")
_READ_CAP = 1 << 20  # torchrun's own lines before the clash: far less than this


def port_of(node: dict[str, Any]) -> int | None:
    """The --master_port of a single-node torchrun command (None for c10d rendezvous)."""
    argv = node.get("argv") or []
    for i, a in enumerate(argv[:-1]):
        if a == "--master_port":
            try:
                return int(argv[i + 1])
            except ValueError:
                return None
    return None


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def taken_at_start(log: Path, since: int, port: int) -> bool:
    """torchrun's output from byte `since` on says it could not listen on `port`."""
    try:
        with open(log, "rb") as f:
            f.seek(since)
            text = f.read(_READ_CAP).decode("utf-8", "replace")
    except OSError:
        return False
    word = re.compile(rf"(?<!\d){port}(?!\d)")
    return any(_TAKEN.search(line) and word.search(line) for line in text.splitlines())


def move(rundir: RunDir, plan: dict[str, Any], node: dict[str, Any], old: int) -> int:
    """Point the run at a port free now: the node's command in `plan` (and plan.json, read
    by an agent that adopts the run) and launch.sh (what the user would run by hand)."""
    new = free_port()
    argv = node["argv"]
    i = argv.index("--master_port")
    argv[i + 1] = str(new)
    write_json_atomic(rundir.plan, plan)
    try:
        script = rundir.launch_sh.read_text()
    except OSError:
        return new
    changed = re.sub(rf"--master_port {old}(?!\d)", f"--master_port {new}", script)
    if changed != script:
        write_text_private(rundir.launch_sh, changed, mode=0o700)
    return new
