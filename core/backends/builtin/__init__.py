"""The built-in trainer backend: torchrun runs `python -m tunedeck.core.train --run-dir RUN`.
The trainer writes the event stream itself, so the backend adds no monitor."""

from __future__ import annotations

from tunedeck.core.backends.base import Backend, Restart
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.backends.torchrun import torchrun_plan
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import resume_point
from tunedeck.core.spec import RunSpec


def build_plan(spec: RunSpec, run: RunDir) -> LaunchPlan:
    return torchrun_plan(spec, run, ["-m", "tunedeck.core.train", "--run-dir", str(run.path)])


def restart(spec: RunSpec, run: RunDir, attempt: int) -> Restart:
    """What the trainer's rank 0 will pick (tunedeck.core.train.trainer.resume_source); read
    on the head only, the node whose output folder rank 0 writes."""
    if spec.cluster.node_rank > 0:
        return Restart(None, "")
    return Restart.at(
        resume_point(spec.train.resume_from, run.output_dir(spec), attempt, nested=False)
    )


def requirements(spec: RunSpec) -> list[tuple[str, str, str]]:
    req = [
        ("torch", "2.4", "FSDP2 fully_shard / DDP"),
        ("transformers", "4.45", "models"),
        ("tokenizers", "0.19", "tokenizer"),
    ]
    if spec.method.type != "full":
        req.append(("peft", "0.10", "LoRA"))
    return req


BACKEND = Backend("builtin", build_plan, restart=restart, requirements=requirements)
