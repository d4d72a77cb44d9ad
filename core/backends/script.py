"""The custom-script backend: torchrun runs the user's own training script or module (HF
Trainer, accelerate, plain torch), and the agent turns what rank 0 prints into step events.

A user script knows nothing of tunedeck, so metrics come from its console: HF Trainer log dicts
(`{'loss': '6.893', 'learning_rate': ...}`; string values in transformers 5), tqdm bars
(`12/100 [..., loss=1.2]`) and `step N loss X` prints. The agent is the only writer of
`events/rank0.jsonl` for these runs; the ranks never open it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tunedeck.core.backends.torchrun import base_env, torchrun_argv
from tunedeck.core.backends.plan import LaunchPlan, NodeCommand
from tunedeck.core.spec import RunSpec
from tunedeck.core.swift import logs
from tunedeck.core.rundir.events import json_value


def script_path(spec: RunSpec) -> Path:
    """Absolute script path. Ranks run in the run directory, so a relative path is taken
    from where tunedeck is invoked, as torchrun itself would."""
    return Path(spec.script.path).expanduser().resolve()


def script_target(spec: RunSpec) -> list[str]:
    s = spec.script
    if s.module:
        return ["-m", s.module, *s.args]
    path = script_path(spec)
    return [str(path) if path.is_file() else s.path, *s.args]


def build_plan(spec: RunSpec, run_dir: Path, run_id: str,
               check_paths: bool = True) -> LaunchPlan:
    """check_paths=False for exports: the script may exist only on the target machine."""
    s = spec.script
    if s.path and s.module:
        raise ValueError("script.path and script.module are exclusive; set one")
    if check_paths and s.path and not script_path(spec).is_file():
        raise ValueError(f"script.path: {s.path} is not a file (relative paths are taken "
                         f"from {Path.cwd()})")
    plan = LaunchPlan(run_id=run_id, backend="script",
                      nproc_per_node=spec.cluster.nproc_per_node, nnodes=spec.cluster.nnodes)
    for node in range(spec.cluster.nnodes):
        argv = torchrun_argv(spec, run_dir, run_id, node) + script_target(spec)
        host = spec.cluster.master_addr if node == 0 else f"node{node}"
        env = base_env(spec, run_dir, run_id)
        # scripts that follow tunedeck's spec can read where outputs go
        env.setdefault("TUNEDECK_OUTPUT_DIR", spec.run.output_dir or str(run_dir / "output"))
        plan.nodes.append(NodeCommand(node, host, argv, env, str(run_dir)))
    return plan


# -- metrics -----------------------------------------------------------------------------

class EventSink:
    """Appends normalised events to events/rank<r>.jsonl, one write per line, each step once."""

    def __init__(self, run_dir: Path, rank: int = 0):
        self.path = run_dir / "events" / f"rank{rank}.jsonl"
        self.rank = rank
        self.seen: set[tuple[str, int]] = set()
        self.last_step = 0

    def emit(self, event: dict[str, Any]) -> bool:
        key = (event.get("kind", "?"), int(event.get("step") or 0))
        if event.get("kind") in ("step", "eval") and key in self.seen:
            return False
        self.seen.add(key)
        if event.get("kind") == "step":
            self.last_step = max(self.last_step, key[1])
        # NaN/inf as null, as the built-in trainer writes them: the file stays JSON
        out = {k: json_value(v) for k, v in {"t": time.time(), **event, "rank": self.rank}.items()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(out) + "\n")
        return True


class RankLogTail:
    """New complete lines of one rank's stdout and stderr (latest torchrun attempt), split on
    tqdm's carriage returns."""

    def __init__(self, run_dir: Path, rank: int):
        self.run_dir, self.rank = run_dir, rank
        self.offsets: dict[Path, int] = {}

    def new_lines(self) -> list[str]:
        from tunedeck.core.ingest.tail import read_new_lines
        from tunedeck.core.runs.registry import rank_log_files

        out: list[str] = []
        for path in rank_log_files(self.run_dir, self.rank):
            if not path.exists():
                continue
            lines, off = read_new_lines(path, self.offsets.get(path, 0))
            self.offsets[path] = off
            for line in lines:
                out.extend(p for p in line.split("\r") if p.strip())
        return out


def _hint_logging_steps(args: list[str]) -> int:
    for i, a in enumerate(args):
        val = a.split("=", 1)[1] if a.startswith("--logging_steps=") else (
            args[i + 1] if a == "--logging_steps" and i + 1 < len(args) else None)
        if val and val.isdigit() and int(val) > 0:
            return int(val)
    return 1


class ConsoleMonitor:
    """Step events from rank 0's console. HF dicts carry no step number: they are numbered
    by count x --logging_steps (from the script's args, default 1) unless they carry one."""

    def __init__(self, run_dir: Path, rank: int = 0, logging_steps: int = 1):
        self.sink = EventSink(run_dir)
        self.tail = RankLogTail(run_dir, rank)
        self.logging_steps = logging_steps
        self.dicts = 0
        self.saw_dicts = False

    def parse(self, lines: list[str]) -> None:
        for line in lines:
            rec = logs.console_dict(line)
            if rec is not None:
                if "loss" in rec and logs._step_of(rec) is None:
                    self.dicts += 1
                    ev = logs.record_to_event(rec, step=self.dicts * self.logging_steps)
                elif "eval_loss" in rec and logs._step_of(rec) is None:
                    ev = logs.record_to_event(rec, step=self.dicts * self.logging_steps)
                else:
                    ev = logs.record_to_event(rec)
                if ev:
                    self.saw_dicts = True
                    self.sink.emit(ev)
                continue
            plain = logs.plain_step(line)
            if plain:
                self.saw_dicts = True
                self.sink.emit({"kind": "step", "step": plain[0], "loss": plain[1]})
                continue
            prog = logs.tqdm_progress(line)
            # only bars that show a loss are training bars (not "Loading weights 50/50"), and
            # only for scripts that print no metric dicts
            if prog and prog.get("loss") is not None and not self.saw_dicts \
                    and prog["n"] > self.sink.last_step:
                ev = {"kind": "step", "step": prog["n"], "loss": prog.get("loss")}
                if "step_s" in prog:
                    ev["step_s"] = prog["step_s"]
                self.sink.emit(ev)

    def tick(self, now: float, new_events: list) -> None:
        self.parse(self.tail.new_lines())

    def close(self, new_events: list) -> None:
        self.parse(self.tail.new_lines())


def monitors(agent) -> list:
    """Called by the run agent for script runs: rank 0 lives on node 0."""
    if agent.spec.cluster.node_rank != 0:
        return []
    return [ConsoleMonitor(agent.run_dir, 0, _hint_logging_steps(agent.spec.script.args))]
