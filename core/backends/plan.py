"""LaunchPlan: exactly what will run on each node, and its exports.

A plan is data (argv lists and env dicts), never a shell string; the shell export quotes every
word with shlex, and secrets are masked wherever a plan is shown or saved.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from tunedeck.core.spec import mask_argv, mask_env


@dataclass
class NodeCommand:
    node_rank: int
    host: str
    argv: list[str]
    env: dict[str, str]  # set on top of the launching environment
    cwd: str


@dataclass
class LaunchPlan:
    run_id: str
    backend: str
    nproc_per_node: int
    nnodes: int
    nodes: list[NodeCommand] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def to_json(self) -> dict[str, Any]:
        """Serializable form with secrets masked (plan.json)."""
        d = asdict(self)
        for n in d["nodes"]:
            n["env"] = mask_env(n["env"])
        d["world_size"] = self.world_size
        return d

    def to_shell(self, node_rank: int = 0) -> str:
        """A script that reproduces one node's launch (launch.sh), secrets masked."""
        node = self.nodes[node_rank]
        lines = ["#!/usr/bin/env bash",
                 f"# tunedeck run {self.run_id}, node {node.node_rank} of {self.nnodes}",
                 "set -euo pipefail", f"cd {shlex.quote(node.cwd)}"]
        for k, v in mask_env(node.env).items():
            lines.append(f"export {k}={shlex.quote(v)}")
        lines.append(_wrap_argv(mask_argv(node.argv)))
        return "\n".join(lines) + "\n"


def _wrap_argv(argv: list[str]) -> str:
    """One `--flag value` pair per line, so long torchrun commands stay readable."""
    parts: list[str] = []
    for a in argv:
        q = shlex.quote(a)
        if parts and not a.startswith("-") and parts[-1].lstrip().startswith("-") \
                and " " not in parts[-1].strip():
            parts[-1] += " " + q
        else:
            parts.append(q)
    return " \\\n  ".join(parts)
