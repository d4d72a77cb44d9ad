"""Where a restarted attempt of a run on several nodes continues, agreed by all of them.

ms-swift and a user's script are told their checkpoint from outside (a flag, a variable), by
each node's own agent; their rank 0 alone writes checkpoints, into the head's output folder.
So the head decides: the last checkpoint written there when every node sees the head's run
folder (a Slurm allocation, or ssh nodes that read the head's marker file back), else step 0.
It writes the decision to `restart.json` in its run folder; a node's agent reads it there
(through the shared filesystem) before starting its own attempt. A node that does not share
the folder starts from step 0, which is what the head decided too. The built-in trainer needs
none of this: its rank 0 reads the checkpoint and sends it to the other ranks.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tunedeck.core.backends.base import Restart
from tunedeck.core.nodes.link import read_links
from tunedeck.core.rundir import RunDir, read_json, write_json_atomic
from tunedeck.core.spec import RunSpec

DECISION = "restart.json"


def agreement_needed(spec: RunSpec, told: Restart) -> bool:
    """Several nodes, and a backend whose trainer is told where to resume."""
    return spec.cluster.nnodes > 1 and bool(told.flag or told.var)


def nodes_apart(run: RunDir, spec: RunSpec) -> str:
    """The nodes that do not see the head's run folder ("" when all do)."""
    c = spec.cluster
    if c.launcher == "slurm":
        return ""  # an allocation shares its filesystem
    if c.launcher != "ssh":
        return "nodes started by hand"
    links = read_links(run)
    return ", ".join(
        f"node {k}" for k in range(1, c.nnodes) if not (links.get(k) or {}).get("shared")
    )


def head_decides(run: RunDir, spec: RunSpec, mine: Restart, attempt: int) -> Restart:
    """The head's reading of its output folder, unless a node cannot see it; written for the
    nodes to follow."""
    apart = nodes_apart(run, spec)
    if apart:
        mine = replace(
            mine,
            checkpoint=None,
            note=f"from step 0 ({apart} not on the head's "
            "filesystem: they could not read its "
            "checkpoint)",
        )
    announce(run, attempt, mine)
    return mine


def announce(run: RunDir, attempt: int, mine: Restart) -> None:
    """restart.json: the head's attempt before `attempt` has ended and where the next one
    continues. Nodes that see it start theirs only then: one that starts while the head's
    old torchrun still holds the rendezvous meets it closed and fails for good."""
    write_json_atomic(
        run.path / DECISION,
        {
            "attempt": attempt,
            "t": time.time(),
            "note": mine.note,
            "checkpoint": str(mine.checkpoint) if mine.checkpoint else None,
        },
    )


def head_folder(run: RunDir) -> Path | None:
    """The head's run folder as this node sees it; None when this node does not share it."""
    d = read_json(run.path / "node.json", {})
    if isinstance(d, dict) and d.get("shared") is True and d.get("head_dir"):
        return Path(d["head_dir"])
    return None


def head_said(head: Path, attempt: int, since: float) -> Restart | None:
    """The head's decision for this restart: written for this attempt or a later one, or after
    `since` (when this node's attempt before it started; attempt counts may differ)."""
    d: Any = read_json(head / DECISION)
    if not isinstance(d, dict):
        return None
    at, t = d.get("attempt"), d.get("t")
    if not (
        (isinstance(at, int) and at >= attempt) or (isinstance(t, (int, float)) and t >= since)
    ):
        return None
    cp = d.get("checkpoint")
    return Restart(Path(cp) if isinstance(cp, str) and cp else None, str(d.get("note") or ""))


def follow(mine: Restart, said: Restart | None) -> Restart:
    """This node's restart as the head decided it (told the same way as the head's ranks)."""
    if said is None:
        return replace(
            mine,
            checkpoint=None,
            note="from step 0 (the head did not say where its restart continues)",
        )
    return replace(mine, checkpoint=said.checkpoint, note=said.note)


def apart_here(mine: Restart) -> Restart:
    return replace(
        mine, checkpoint=None, note="from step 0 (this node is not on the head's filesystem)"
    )
