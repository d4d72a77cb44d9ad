"""LLaMA-Factory YAML ↔ RunSpec: `llamafactory-cli train x.yaml` configs (the shape of its
examples/ folder) become specs (`tunedeck import` reads pasted commands through importer.py);
a spec exports back to such a YAML (`tunedeck export --format llamafactory`: `export_form`).

Keys with a spec counterpart (config.KEYS and the special ones) become spec keys; every other
key is kept word for word in llamafactory.settings as key=value, so nothing is dropped.
Credentials (hf_hub_token...) are left out with a warning. Nothing here runs the command.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tunedeck.core.backends.llamafactory.config import (
    BY_LF,
    CREDENTIAL_KEYS,
    format_scalar,
    python_of,
    to_config,
)
from tunedeck.core.backends.base import Exported
from tunedeck.core.spec import RunSpec, SpecError, check_option, set_values
from tunedeck.core.backends.torchrun import launcher_env

# `llamafactory-cli train ...` and its short name
LAUNCHERS = ("llamafactory-cli", "lmf")


def _load_yaml(text: str) -> dict[str, Any]:
    import yaml

    got = yaml.safe_load(text) or {}
    if not isinstance(got, dict):
        raise ValueError("a LLaMA-Factory config is a mapping of keys to values")
    return got


def config_values(cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """({dotted spec key: value}, warnings) of a LLaMA-Factory config: the keys with a spec
    counterpart on it, every other key in llamafactory.settings as written."""
    values: dict[str, Any] = {"backend": "llamafactory"}
    settings: list[str] = []
    warnings: list[str] = []
    cfg = dict(cfg)
    cfg.pop("do_train", None)

    def keep(key: str, value: Any) -> None:
        settings.append(f"{key}={format_scalar(value)}")

    def try_set(spec_key: str, value: Any, lf_key: str, raw: Any) -> None:
        value, err = check_option(spec_key, value)
        if err:
            warnings.append(f"{lf_key}: kept in llamafactory.settings ({err})")
            keep(lf_key, raw)
        else:
            values[spec_key] = value

    if "stage" in cfg:
        try_set("llamafactory.stage", cfg.pop("stage"), "stage", cfg.get("stage"))
    ft = cfg.pop("finetuning_type", None)
    qbit = cfg.pop("quantization_bit", None)
    if ft is not None:
        if ft == "lora" and qbit in (4, 8):
            values["method.type"] = "qlora"
            values["method.quant_bits"] = qbit
            qbit = None
        elif ft in ("lora", "full"):
            values["method.type"] = ft
        else:
            keep("finetuning_type", ft)  # freeze, oft...
    if qbit is not None:
        keep("quantization_bit", qbit)
    if cfg.get("bf16") is True:
        cfg.pop("bf16")
        values["model.dtype"] = "bfloat16"
    elif cfg.get("fp16") is True:
        cfg.pop("fp16")
        values["model.dtype"] = "float16"
    if isinstance(cfg.get("disable_gradient_checkpointing"), bool):
        values["train.gradient_checkpointing"] = not cfg.pop("disable_gradient_checkpointing")
    if "dataset" in cfg:
        raw = cfg.pop("dataset")
        names = raw if isinstance(raw, list) else str(raw).split(",")
        values["llamafactory.dataset"] = [str(n).strip() for n in names if str(n).strip()]
    resume = cfg.pop("resume_from_checkpoint", None)
    if isinstance(resume, str) and resume:
        values["train.resume_from"] = resume
    elif resume not in (None, False):
        keep("resume_from_checkpoint", resume)
    for key, raw in cfg.items():
        if key in CREDENTIAL_KEYS:
            warnings.append(f"{key}: left out (a credential); set HF_TOKEN or similar instead")
            continue
        k = BY_LF.get(key)
        if k is None:
            keep(key, raw)
            continue
        try:
            value = k.back(raw)
        except (TypeError, ValueError):
            value = None
        if value is None:
            warnings.append(f"{key}: {raw!r} has no spec value; kept in llamafactory.settings")
            keep(key, raw)
            continue
        try_set(k.spec, value, key, raw)
    if settings:
        values["llamafactory.settings"] = settings
    return values, warnings


def from_config(cfg: dict[str, Any], name: str = "run") -> tuple[RunSpec, list[str]]:
    """(the spec, warnings). Raises ValueError for a config that is not LLaMA-Factory's."""
    values, warnings = config_values(cfg)
    try:
        return set_values(RunSpec(), {**values, "name": name}), warnings
    except SpecError as e:
        raise ValueError("; ".join(e.problems)) from None


def from_yaml(text: str, name: str = "run") -> tuple[RunSpec, list[str]]:
    return from_config(_load_yaml(text), name)


def export_form(spec: RunSpec, output_dir: str | None) -> Exported:
    """`tunedeck export --format llamafactory`: the YAML (and, for data.path, a
    dataset_info.json naming it) and the command that trains on them with torchrun."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", spec.name).strip(".") or "run"
    files: dict[str, str] = {}
    cfg = to_config(spec, output_dir, Path(".") if spec.data.path else None)
    info = cfg.pop("tunedeck_dataset_info", None)
    cfg.pop("tunedeck_dataset_dir", None)
    cfg.pop("output_dir", None)  # the export's own run folder; only the one the user named
    if output_dir:
        cfg["output_dir"] = output_dir
    if info:
        cfg["dataset_dir"] = f"{stem}-data"
        files[f"{stem}-data/dataset_info.json"] = json.dumps(info, indent=2)
    files[f"{stem}.yaml"] = yaml_text(cfg)
    c = spec.cluster
    env = {"FORCE_TORCHRUN": "1"}  # torchrun even for one rank, as tunedeck runs it
    if c.nproc_per_node > 0:
        env["NPROC_PER_NODE"] = str(c.nproc_per_node)
    env.update(launcher_env(c))
    env.update(spec.env)
    cli = (
        [python_of(spec), "-m", "llamafactory.cli"] if spec.llamafactory.python else [LAUNCHERS[0]]
    )
    return Exported(env, [*cli, "train", f"{stem}.yaml"], files)


def yaml_text(cfg: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False, allow_unicode=True)
