"""LaunchPlan: exactly what will run on each node, and its exports.

A plan is data (argv lists and env dicts), never a shell string; the shell export quotes every
word with shlex, and secrets are masked wherever a plan is shown or saved.
"""

from __future__ import annotations

import os
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

    def to_shell(self, node_rank: int = 0, guard: bool | None = None) -> str:
        """A script that reproduces one node's launch (launch.sh), secrets masked.

        `guard`: the script refuses to run into a run directory that already holds a run
        (its state.json, written only by `tunedeck launch`), since replaying it would append
        to that run's event files, logs and checkpoints; TUNEDECK_REPLAY_INTO_RUN=1 in the
        environment overrides. None (the default): guard when the run directory exists now,
        i.e. for the launch.sh a launch writes into it, not for a preview (its run is not
        named yet) or an export to another machine."""
        node = self.nodes[node_rank]
        lines = [
            "#!/usr/bin/env bash",
            f"# tunedeck run {self.run_id}, node {node.node_rank} of {self.nnodes}",
            "set -euo pipefail",
        ]
        run_dir = node.env.get("TUNEDECK_RUN_DIR")
        if guard is None:
            guard = bool(run_dir) and os.path.isdir(run_dir)
        if guard and run_dir:
            lines += _guard_lines(self.run_id, run_dir)
        lines.append(f"cd {shlex.quote(node.cwd)}")
        for k, v in mask_env(node.env).items():
            lines.append(f"export {k}={shlex.quote(v)}")
        lines.append(_wrap_argv(mask_argv(node.argv)))
        return "\n".join(lines) + "\n"


# launch.sh's override of its guard: an explicit choice to append to an existing run's files
REPLAY_ENV = "TUNEDECK_REPLAY_INTO_RUN"


def _guard_lines(run_id: str, run_dir: str) -> list[str]:
    state = shlex.quote(run_dir.rstrip("/") + "/state.json")
    why = (
        f"launch.sh: {run_dir} already holds run {run_id}; running this script again "
        f"would append to the event files, logs and checkpoints of that run, and tunedeck "
        f"would show them as its own. Launch a new run instead (tunedeck launch, or clone "
        f"the run in the TUI), or set {REPLAY_ENV}=1 to append anyway."
    )
    return [
        f"# refuses to append to run {run_id}'s files unless {REPLAY_ENV}=1",
        f'if [ -e {state} ] && [ "${{{REPLAY_ENV}:-}}" != 1 ]; then',
        f"  echo {shlex.quote(why)} >&2",
        "  exit 3",
        "fi",
    ]


def _wrap_argv(argv: list[str]) -> str:
    """One `--flag value` pair per line, so long torchrun commands stay readable."""
    parts: list[str] = []
    for a in argv:
        q = shlex.quote(a)
        if (
            parts
            and not a.startswith("-")
            and parts[-1].lstrip().startswith("-")
            and " " not in parts[-1].strip()
        ):
            parts[-1] += " " + q
        else:
            parts.append(q)
    return " \\\n  ".join(parts)
