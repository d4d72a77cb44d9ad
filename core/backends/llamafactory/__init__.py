"""The LLaMA-Factory backend: tunedeck's torchrun runs LLaMA-Factory's trainer on each rank,

    LF_PYTHON -m torch.distributed.run <tunedeck flags> .../llamafactory/boot.py CONFIG_JSON

with the interpreter named by llamafactory.python (LLaMA-Factory 0.9.x pins transformers,
peft and datasets older than ms-swift's, so it lives in an environment of its own). The whole
configuration travels in the plan as one JSON word (the dict `llamafactory-cli train x.yaml`
would read), so the plan stays pure: boot.py writes the dataset_info.json for data.path into
the run directory on the rank, and takes a restart's checkpoint from TUNEDECK_RESUME_FROM.
Metrics: the agent tails LLaMA-Factory's trainer_log.jsonl into events/rank0.jsonl.
docs/llamafactory.md records what was tried and what works.
"""

from __future__ import annotations

import json
from pathlib import Path

from tunedeck.core.backends.base import Backend, Monitor, Restart
from tunedeck.core.backends.llamafactory.config import (
    BY_LF,
    CREDENTIAL_KEYS,
    UNMAPPED,
    python_of,
    settings_dict,
    to_config,
)
from tunedeck.core.backends.llamafactory import run_estimate
from tunedeck.core.backends.llamafactory.importer import IMPORTER
from tunedeck.core.backends.llamafactory.monitor import TrainerLogMonitor
from tunedeck.core.backends.llamafactory.yaml_io import export_form
from tunedeck.core.backends.plan import LaunchPlan
from tunedeck.core.backends.torchrun import torchrun_plan
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import resume_point
from tunedeck.core.spec import RunSpec, is_set

BOOT = Path(__file__).with_name("boot.py")
RESUME_VAR = "TUNEDECK_RESUME_FROM"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def check(spec: RunSpec, local: bool) -> None:
    """Raises ValueError naming every field LLaMA-Factory cannot take as written; `local`:
    also asks the LLaMA-Factory behind llamafactory.python which keys it takes."""
    problems: list[str] = []
    settings = settings_dict(spec)  # a malformed word is named at once
    for key in settings:
        if key in CREDENTIAL_KEYS:
            problems.append(
                f"llamafactory.settings: {key} holds a credential; set it in the launching "
                "environment (HF_TOKEN, MODELSCOPE_API_TOKEN) instead"
            )
        elif key in BY_LF:
            problems.append(
                f"llamafactory.settings: {key} is the spec key {BY_LF[key].spec}; set that"
            )
        elif key in ("stage", "dataset"):
            problems.append(f"llamafactory.settings: {key} is llamafactory.{key}; set that")
        elif key.startswith("tunedeck_"):
            problems.append(f"llamafactory.settings: {key} is reserved")
    for key in UNMAPPED:
        if is_set(spec, key):
            problems.append(f"{key}: LLaMA-Factory has no such setting; unset it")
    p = spec.parallel
    if is_set(spec, "parallel.strategy") and p.strategy not in ("ddp", "deepspeed"):
        problems.append(
            f"parallel.strategy {p.strategy}: the LLaMA-Factory backend runs ddp or deepspeed "
            "(FSDP through an accelerate config is not wired)"
        )
    if not spec.data.path and not spec.llamafactory.dataset:
        problems.append("data.path or llamafactory.dataset: LLaMA-Factory needs a dataset")
    # an export runs where its user starts it, where LLaMA-Factory's default ./data is theirs
    if local and spec.llamafactory.dataset and not spec.llamafactory.dataset_dir:
        problems.append(
            "llamafactory.dataset_dir: required with llamafactory.dataset (ranks run in the "
            "run directory, so LLaMA-Factory's default ./data would not be yours)"
        )
    if spec.cluster.device == "cpu" and spec.model.dtype in ("bfloat16", "float16"):
        if is_set(spec, "model.dtype"):
            problems.append(f"model.dtype {spec.model.dtype}: CPU runs train in float32")
    if local and spec.llamafactory.python and not Path(python_of(spec)).is_file():
        problems.append(f"llamafactory.python: {python_of(spec)} is not a file")
    elif local:
        problems += _unknown_keys(python_of(spec), settings)
    if problems:
        raise ValueError("; ".join(problems))
    to_config(spec, "OUTPUT_DIR")  # raises ValueError naming model.path / data.path


def _unknown_keys(python: str, settings: dict) -> list[str]:
    """Settings keys the LLaMA-Factory under `python` does not take (its own parser's fields),
    or why that interpreter cannot run LLaMA-Factory at all."""
    import difflib

    from tunedeck.core.backends.llamafactory.fields import FieldTableError, field_names

    try:
        known = field_names(python)
    except FieldTableError as e:
        return [str(e)]
    out = []
    for key in settings:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            out.append(f"llamafactory.settings: {key} is not a LLaMA-Factory key{hint}")
    return out


def config_word(spec: RunSpec, run: RunDir) -> str:
    cfg = to_config(spec, str(run.output_dir(spec)), run.path)
    return json.dumps(cfg, separators=(",", ":"), sort_keys=False)


def build_plan(spec: RunSpec, run: RunDir) -> LaunchPlan:
    env = dict(OFFLINE_ENV) if spec.model.path.startswith("builtin:") else {}
    plan = torchrun_plan(spec, run, [str(BOOT), config_word(spec, run)], env)
    for node in plan.nodes:
        node.argv[0] = python_of(spec)  # torchrun itself runs in LLaMA-Factory's environment
    return plan


def monitors(run: RunDir, spec: RunSpec) -> list[Monitor]:
    """Rank 0 (on node 0) writes trainer_log.jsonl into the output folder."""
    if spec.cluster.node_rank != 0:
        return []
    return [TrainerLogMonitor(run, run.output_dir(spec))]


def restart(spec: RunSpec, run: RunDir, attempt: int) -> Restart:
    """A restart continues from the last checkpoint-N written into the output folder, passed
    to boot.py in TUNEDECK_RESUME_FROM (it becomes resume_from_checkpoint)."""
    path = resume_point(spec.train.resume_from, run.output_dir(spec), attempt)
    if path is None:
        return Restart(None, "", var=RESUME_VAR)
    return Restart.at(path, var=RESUME_VAR, how="LLaMA-Factory's resume_from_checkpoint")


BACKEND = Backend(
    "llamafactory",
    build_plan,
    check,
    monitors,
    restart,
    importer=IMPORTER,
    exports={"llamafactory": export_form},
    as_run=run_estimate.as_run,
    run_defaults=run_estimate.run_defaults,
)
