"""LLaMA-Factory YAML ↔ RunSpec: `llamafactory-cli train x.yaml` configs (the shape of its
examples/ folder) and pasted commands become specs; a spec exports back to such a YAML.

Keys with a spec counterpart (config.KEYS and the special ones) become spec keys; every other
key is kept word for word in llamafactory.settings as key=value, so nothing is dropped.
Credentials (hf_hub_token...) are left out with a warning. Nothing here runs the command.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from tunedeck.core.backends.llamafactory.config import (
    BY_LF,
    CREDENTIAL_KEYS,
    DEMO_DATASET,
    format_scalar,
    to_config,
)
from tunedeck.core.spec import RunSpec, SpecError, check_option, set_values


def _load_yaml(text: str) -> dict[str, Any]:
    import yaml

    got = yaml.safe_load(text) or {}
    if not isinstance(got, dict):
        raise ValueError("a LLaMA-Factory config is a mapping of keys to values")
    return got


def from_config(cfg: dict[str, Any], name: str = "run") -> tuple[RunSpec, list[str]]:
    """(the spec, warnings). Raises ValueError for a config that is not LLaMA-Factory's."""
    values: dict[str, Any] = {"backend": "llamafactory", "name": name}
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
    try:
        return set_values(RunSpec(), values), warnings
    except SpecError as e:
        raise ValueError("; ".join(e.problems)) from None


def from_yaml(text: str, name: str = "run") -> tuple[RunSpec, list[str]]:
    return from_config(_load_yaml(text), name)


LAUNCHERS = ("llamafactory-cli", "lmf")
ENV_TO_CLUSTER = {
    "NPROC_PER_NODE": "cluster.nproc_per_node",
    "NNODES": "cluster.nnodes",
    "NODE_RANK": "cluster.node_rank",
    "MASTER_ADDR": "cluster.master_addr",
    "MASTER_PORT": "cluster.master_port",
    "CUDA_VISIBLE_DEVICES": "cluster.gpus",
}


def from_command(command: str, cwd: Path | None = None) -> tuple[RunSpec, list[str]]:
    """A pasted `[VAR=..] llamafactory-cli train x.yaml [key=value ...]` (or `lmf train`):
    the YAML is read from `cwd` (relative paths), key=value overrides win over it, and the
    launcher's variables (NPROC_PER_NODE, NNODES...) become cluster keys."""
    words = shlex.split(command)
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        k, _, v = words.pop(0).partition("=")
        env[k] = v
    if len(words) < 2 or Path(words[0]).name not in LAUNCHERS or words[1] != "train":
        raise ValueError("not a `llamafactory-cli train CONFIG.yaml` command")
    rest = words[2:]
    cfg: dict[str, Any] = {}
    name = "run"
    if rest and rest[0].endswith((".yaml", ".yml")):
        path = Path(rest.pop(0)).expanduser()
        if not path.is_absolute():
            path = (cwd or Path.cwd()) / path
        cfg = _load_yaml(path.read_text(encoding="utf-8"))
        name = path.stem
    for w in rest:
        if w.startswith("--"):  # the argparse form: --key value / --key=value
            raise ValueError(f"{w}: write overrides as key=value after the YAML")
        k, eq, v = w.partition("=")
        if not eq:
            raise ValueError(f"{w!r} is not key=value")
        cfg[k] = _load_yaml(f"v: {v}")["v"] if v else ""
    spec, warnings = from_config(cfg, name)
    cluster: dict[str, Any] = {}
    for var, key in ENV_TO_CLUSTER.items():
        if var not in env:
            continue
        v = env.pop(var)
        if key in ("cluster.master_addr", "cluster.gpus"):
            cluster[key] = v
        elif v.isdigit():
            cluster[key] = int(v)
        else:
            raise ValueError(f"{var}={v}: a number is expected")
    env.pop("FORCE_TORCHRUN", None)  # tunedeck always runs torchrun
    for k, v in env.items():
        cluster[f"env.{k}"] = v
    if cluster:
        try:
            spec = set_values(spec, cluster)
        except SpecError as e:
            raise ValueError("; ".join(e.problems)) from None
    return spec, warnings


def to_yaml(spec: RunSpec) -> str:
    """The spec as a `llamafactory-cli train` YAML (no output_dir unless the spec names one).
    tunedeck's data.path has no dataset_info.json entry outside a run: the header says so."""
    import yaml

    cfg = to_config(spec, None)
    head = "# LLaMA-Factory config exported by tunedeck\n"
    if spec.data.path:
        names = [n for n in str(cfg.get("dataset", "")).split(",") if n and n != DEMO_DATASET]
        if names:
            cfg["dataset"] = ",".join(names)
        else:
            cfg.pop("dataset", None)
        head += (
            f"# data.path {spec.data.path} needs an entry in dataset_info.json; add it to "
            "`dataset` by that name\n"
        )
    return head + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False)
