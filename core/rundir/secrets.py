"""A run's secrets file, `secrets.json` (0600, its owner only): the real values of everything
spec.toml, plan.json and launch.sh show as ****.

The launch (`tunedeck.core.supervisor.launch.prepare_run`) splits them out of the resolved spec and
the plan with `split_secrets` and writes them with `write_secrets`; nothing else in the run
directory holds a secret value (masking rules: `tunedeck.core.spec`, `is_secret_name`).

**The agent takes the env's real values (and argv's) from `read_secrets(run)`**: plan.json's
node is masked, so the command it starts is

    argv, env = read_secrets(run).node_command(plan["nodes"][node_rank])
    env = {**os.environ, **env, "TUNEDECK_ATTEMPT": str(attempt)}

and what it logs of that command is `mask_argv(argv)`. Clone and resume read a run's spec back
with its real values through `read_secrets(run).unmask_spec(load_spec(run.spec))`.

Layout (version 1):

    {"version": 1,
     "env": {"HF_TOKEN": "..."},                    the spec's env, masked names only
     "lists": {"script.args": ["--api-key=..."]},   spec lists with a masked word, whole
     "nodes": {"0": {"env": {"HF_TOKEN": "..."},    per node of plan.json: masked variables
                     "argv": {"17": "..."}}}}       and argv words (by index), real values

A missing or damaged file reads as no secrets (the masked values are then what runs).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from tunedeck.core.rundir import RunDir, read_json, write_json_atomic
from tunedeck.core.spec import MASK, MASKED_LISTS, RunSpec, mask_argv, mask_env, mask_spec

VERSION = 1
LIST_KEYS = tuple(MASKED_LISTS)


@dataclass
class NodeSecrets:
    env: dict[str, str] = field(default_factory=dict)  # variable -> real value
    argv: dict[int, str] = field(default_factory=dict)  # index in argv -> real word


@dataclass
class Secrets:
    env: dict[str, str] = field(default_factory=dict)
    lists: dict[str, list[str]] = field(default_factory=dict)
    nodes: dict[int, NodeSecrets] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.env or self.lists or any(n.env or n.argv for n in self.nodes.values()))

    def node_command(self, node: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """(argv, env) with real values for one node of plan.json (masked as saved): what the
        agent starts. The env is the plan's (the spec's env included), on top of which the
        agent puts nothing but TUNEDECK_ATTEMPT."""
        argv = [str(a) for a in node.get("argv") or []]
        env = {str(k): str(v) for k, v in (node.get("env") or {}).items()}
        real = self.nodes.get(_int(node.get("node_rank")) or 0)
        if real is not None:
            for i, word in real.argv.items():
                if 0 <= i < len(argv) and MASK in argv[i]:  # only what was masked
                    argv[i] = word
            for k, v in real.env.items():
                if env.get(k) == MASK:
                    env[k] = v
        return argv, env

    def unmask_spec(self, spec: RunSpec) -> RunSpec:
        """A copy of a run's saved spec with the real values back (clone, resume)."""
        out = copy.deepcopy(spec)
        for k, v in self.env.items():
            if out.env.get(k) == MASK:
                out.env[k] = v
        for key, words in self.lists.items():
            section, _, name = key.partition(".")
            holder = getattr(out, section, None)
            if holder is not None and MASKED_LISTS[key](words) == getattr(holder, name, None):
                setattr(holder, name, list(words))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "env": dict(self.env),
            "lists": {k: list(v) for k, v in self.lists.items()},
            "nodes": {
                str(r): {"env": dict(n.env), "argv": {str(i): w for i, w in n.argv.items()}}
                for r, n in self.nodes.items()
            },
        }


def split_secrets(spec: RunSpec, plan: Any) -> tuple[RunSpec, dict[str, Any], Secrets]:
    """(the spec to save, masked; plan.json's content, env and argv masked; the real values)
    for a launch of `spec` (resolved) by `plan` (its `LaunchPlan`)."""
    secrets = Secrets()
    masked = mask_spec(spec)
    secrets.env = {k: v for k, v in spec.env.items() if masked.env.get(k) != v}
    for key in LIST_KEYS:
        section, _, name = key.partition(".")
        real = getattr(getattr(spec, section), name)
        if real != getattr(getattr(masked, section), name):
            secrets.lists[key] = list(real)
    data = plan.to_json()
    for node, cmd in zip(data["nodes"], plan.nodes):
        ns = NodeSecrets()
        argv = [str(a) for a in cmd.argv]
        node["argv"] = mask_argv(argv)
        ns.argv = {i: a for i, (a, m) in enumerate(zip(argv, node["argv"])) if a != m}
        node["env"] = mask_env(dict(cmd.env))
        ns.env = {k: v for k, v in cmd.env.items() if node["env"].get(k) != v}
        if ns.env or ns.argv:
            secrets.nodes[int(cmd.node_rank)] = ns
    return masked, data, secrets


def write_secrets(run: RunDir, secrets: Secrets) -> None:
    """secrets.json, 0600 (atomic, as every JSON file of a run)."""
    write_json_atomic(run.secrets, secrets.to_json())


def read_secrets(run: RunDir) -> Secrets:
    """The run's secrets; none when the file is missing or damaged."""
    data = read_json(run.secrets, {})
    out = Secrets()
    if not isinstance(data, dict):
        return out
    env = data.get("env")
    if isinstance(env, dict):
        out.env = {str(k): v for k, v in env.items() if isinstance(v, str)}
    lists = data.get("lists")
    if isinstance(lists, dict):
        out.lists = {
            k: v
            for k, v in lists.items()
            if k in LIST_KEYS and isinstance(v, list) and all(isinstance(w, str) for w in v)
        }
    nodes = data.get("nodes")
    if isinstance(nodes, dict):
        for rank, n in nodes.items():
            r = _int(rank)
            if r is None or not isinstance(n, dict):
                continue
            ns = NodeSecrets()
            if isinstance(n.get("env"), dict):
                ns.env = {str(k): v for k, v in n["env"].items() if isinstance(v, str)}
            if isinstance(n.get("argv"), dict):
                ns.argv = {
                    i: w
                    for i, w in ((_int(k), w) for k, w in n["argv"].items())
                    if i is not None and isinstance(w, str)
                }
            out.nodes[r] = ns
    return out


def _int(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None
