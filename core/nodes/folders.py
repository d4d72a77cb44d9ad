"""A node's run folder (`<run-id>.node<k>`, made by its agent for one node of a multi-node
run) belongs to the head's run: in a home the nodes share (always under Slurm), listing,
name resolution and actions see the head's run only."""

from __future__ import annotations

import json
import re
from pathlib import Path

_NODE = re.compile(r"^(?P<head>.+)\.node(?P<k>[1-9][0-9]*)$")  # run ids never hold a dot


def node_run_id(run_id: str, node: int) -> str:
    return f"{run_id}.node{node}"


def head_of(folder: Path) -> str | None:
    """The head's run id when `folder` is a node's folder (its name and its node.json say
    so), else None."""
    m = _NODE.match(folder.name)
    if not m:
        return None
    try:
        said = json.loads((folder / "node.json").read_text()).get("head_run_id")
    except (OSError, ValueError, AttributeError):
        return m["head"]  # node.json not written yet: the name alone says it
    return said if said == m["head"] else None


def node_host(state: dict) -> str | None:
    """The host name a node's state.json gives it: the one its task recorded under Slurm
    (`net.host`, the Slurm node's name), else the machine's (`host`)."""
    net = state.get("net")
    named = net.get("host") if isinstance(net, dict) else None
    host = named or state.get("host")
    return host if isinstance(host, str) and host else None
