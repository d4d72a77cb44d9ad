"""A spec as LLaMA-Factory's configuration (the dict its YAML files hold), and back.

`KEYS` is the one table both ways: LLaMA-Factory key ↔ spec key, with how a value converts.
A spec key that is not set emits nothing, so LLaMA-Factory's own default applies (as for
ms-swift). Keys with no spec counterpart live in llamafactory.settings as `key=value` words.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from tunedeck.core.spec import RunSpec, get_value, is_set

# LLaMA-Factory's flash_attn values ↔ transformers' names (model.attn_impl)
ATTN = {
    "sdpa": "sdpa",
    "eager": "disabled",
    "flash_attention_2": "fa2",
    "flash_attention_3": "fa3",
}
ATTN_BACK = {v: k for k, v in ATTN.items()}


def _same(v: Any) -> Any:
    return v


def _targets_out(v: list[str]) -> str:
    return "all" if list(v) == ["all-linear"] else ",".join(v)


def _targets_in(v: Any) -> list[str]:
    words = v if isinstance(v, list) else [w.strip() for w in str(v).split(",") if w.strip()]
    return ["all-linear"] if words == ["all"] else [str(w) for w in words]


@dataclass(frozen=True)
class Key:
    lf: str  # LLaMA-Factory's key
    spec: str  # tunedeck's dotted key
    out: Callable[[Any], Any] = _same  # spec value → LLaMA-Factory value
    back: Callable[[Any], Any] = _same  # LLaMA-Factory value → spec value


KEYS = (
    Key("model_name_or_path", "model.path"),
    Key("flash_attn", "model.attn_impl", ATTN.get, ATTN_BACK.get),
    Key("cutoff_len", "data.max_length", int, int),
    Key("dataloader_num_workers", "data.num_workers", int, int),
    Key("val_size", "data.val_split", float, float),
    Key("packing", "data.packing", bool, bool),
    Key("lora_rank", "method.lora_rank", int, int),
    Key("lora_alpha", "method.lora_alpha", int, int),
    Key("lora_dropout", "method.lora_dropout", float, float),
    Key("lora_target", "method.target_modules", _targets_out, _targets_in),
    Key("max_steps", "train.max_steps", int, int),
    Key("num_train_epochs", "train.num_epochs", float, float),
    Key("per_device_train_batch_size", "train.per_device_batch_size", int, int),
    Key("gradient_accumulation_steps", "train.grad_accum", int, int),
    Key("learning_rate", "train.learning_rate", float, float),
    Key("weight_decay", "train.weight_decay", float, float),
    Key("warmup_steps", "train.warmup_steps", int, int),
    Key("lr_scheduler_type", "train.lr_scheduler"),
    Key("max_grad_norm", "train.max_grad_norm", float, float),
    Key("seed", "train.seed", int, int),
    Key("save_steps", "train.save_steps", int, int),
    Key("save_total_limit", "train.save_total_limit", int, int),
    Key("eval_steps", "train.eval_steps", int, int),
    Key("ddp_timeout", "cluster.collective_timeout_s", int, int),
    Key("output_dir", "run.output_dir"),
    Key("template", "llamafactory.template"),
    Key("dataset_dir", "llamafactory.dataset_dir"),
)
BY_LF = {k.lf: k for k in KEYS}
# spec keys the backend has no LLaMA-Factory key for: check() names them when set
UNMAPPED = (
    "data.format",
    "data.truncation",
    "data.val_path",
    "data.model_name",
    "data.model_author",
    "method.fp8_base",
    "method.merge_lora",
    "train.compile",
    "parallel.cpu_offload",
    "parallel.zero_offload",
    "parallel.tp",
    "parallel.pp",
    "parallel.cp",
    "parallel.ep",
    "parallel.sequence_parallel",
)
CREDENTIAL_KEYS = frozenset({"hf_hub_token", "ms_hub_token", "om_hub_token", "swanlab_api_key"})
DEMO_DATASET = "tunedeck_data"


def python_of(spec: RunSpec) -> str:
    """The interpreter whose LLaMA-Factory runs the spec (llamafactory.python)."""
    import sys

    p = spec.llamafactory.python
    return str(Path(p).expanduser()) if p else sys.executable


# -- settings words ---------------------------------------------------------------------------


def parse_scalar(text: str) -> Any:
    """A settings value as YAML would read the common cases: true/false/null, numbers, a JSON
    list or object; anything else is the string as written."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~"):  # as YAML: "none" is a string (report_to: none)
        return None
    if text.strip()[:1] in "[{":
        try:
            return json.loads(text)
        except ValueError:
            return text
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def format_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def settings_dict(spec: RunSpec) -> dict[str, Any]:
    """llamafactory.settings as a dict; raises ValueError naming a malformed word."""
    out: dict[str, Any] = {}
    for w in spec.llamafactory.settings:
        key, eq, value = w.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not eq or not key:
            raise ValueError(f"llamafactory.settings: {w!r} is not key=value")
        out[key] = parse_scalar(value)
    return out


# -- data -------------------------------------------------------------------------------------


def dataset_entry(data_path: str) -> dict[str, Any]:
    """A dataset_info.json entry for a tunedeck data file, its format read from the first row
    (messages → sharegpt with OpenAI role tags; instruction/input/output → alpaca;
    query/response → alpaca with those columns)."""
    from tunedeck.core.demo import read_head

    first: dict[str, Any] = {}
    for line in read_head(data_path, 1 << 16).data.decode("utf-8", "replace").splitlines():
        if line.strip():
            try:
                got = json.loads(line)
            except ValueError:
                got = None
            first = got if isinstance(got, dict) else {}
            break
    entry: dict[str, Any] = {"file_name": str(Path(data_path).resolve())}
    if "messages" in first:
        entry["formatting"] = "sharegpt"
        entry["columns"] = {"messages": "messages"}
        entry["tags"] = {
            "role_tag": "role",
            "content_tag": "content",
            "user_tag": "user",
            "assistant_tag": "assistant",
            "system_tag": "system",
        }
    elif "query" in first and "response" in first:
        entry["columns"] = {"prompt": "query", "response": "response"}
    return entry  # alpaca (instruction/input/output) is LLaMA-Factory's default


# -- spec → config ----------------------------------------------------------------------------


def to_config(spec: RunSpec, output_dir: str | None, run_dir: Path | None = None) -> dict[str, Any]:
    """The LLaMA-Factory configuration of a run. `output_dir` None: none unless the spec names
    one (an export). `run_dir`: where a dataset_info.json for data.path goes (the plan); None
    (an export) names data.path's entry only in a comment the caller adds."""
    lf = spec.llamafactory
    cfg: dict[str, Any] = {"stage": lf.stage, "do_train": True}
    for k in KEYS:
        if k.spec == "run.output_dir" or not is_set(spec, k.spec):
            continue
        value = get_value(spec, k.spec)
        if k.spec == "model.path" and value.startswith("builtin:"):
            continue
        if value in ("", []):
            continue
        out = k.out(value)
        if out is not None:
            cfg[k.lf] = out
    if spec.model.path.startswith("builtin:"):
        from tunedeck.core.demo import BUILTIN_TINY, tiny_model_dir

        if spec.model.path != BUILTIN_TINY:
            raise ValueError(f"model.path: unknown built-in model {spec.model.path!r}")
        if not spec.data.path:
            raise ValueError("data.path: the built-in tiny model is built from the data")
        try:  # built by the agent before torchrun starts; named by the data's bytes
            cfg["model_name_or_path"] = str(tiny_model_dir(spec.data.path))
        except OSError as e:
            raise ValueError(_data_problem(e)) from None
        cfg.setdefault("template", "qwen")
    if is_set(spec, "method.type"):
        m = spec.method
        cfg["finetuning_type"] = "full" if m.type == "full" else "lora"
        if m.type == "qlora":
            cfg["quantization_bit"] = m.quant_bits
    if is_set(spec, "model.dtype"):
        dt = spec.model.dtype
        if dt == "bfloat16":
            cfg["bf16"] = True
        elif dt == "float16":
            cfg["fp16"] = True
    if is_set(spec, "train.gradient_checkpointing"):
        cfg["disable_gradient_checkpointing"] = not spec.train.gradient_checkpointing
    if run_dir is not None and cfg.get("dataset_dir"):  # ranks run in the run directory
        cfg["dataset_dir"] = str(Path(cfg["dataset_dir"]).expanduser().resolve())
    datasets = list(lf.dataset)
    if spec.data.path:
        datasets.insert(0, DEMO_DATASET)
        if run_dir is not None:
            folder = Path(run_dir) / "llamafactory"
            try:
                info: dict[str, Any] = {DEMO_DATASET: dataset_entry(spec.data.path)}
            except OSError as e:
                raise ValueError(_data_problem(e)) from None
            if lf.dataset:  # the user's own names come from their dataset_info.json
                own = Path(lf.dataset_dir or "data") / "dataset_info.json"
                info.update(_read_info(own))
            cfg["tunedeck_dataset_info"] = info
            cfg["tunedeck_dataset_dir"] = str(folder)
            for name in lf.dataset:
                if name in info and "file_name" in info[name]:
                    base = Path(lf.dataset_dir or "data")
                    info[name]["file_name"] = str((base / info[name]["file_name"]).resolve())
    if datasets:
        cfg["dataset"] = ",".join(datasets)
    if spec.parallel.strategy == "deepspeed" and is_set(spec, "parallel.strategy"):
        cfg["deepspeed"] = _deepspeed_preset(spec.parallel.zero_stage)
    if spec.train.resume_from and spec.train.resume_from != "auto":
        cfg["resume_from_checkpoint"] = spec.train.resume_from
    elif spec.train.resume_from == "auto" and output_dir:
        from tunedeck.core.rundir.checkpoints import resume_point

        found = resume_point("auto", Path(output_dir), 0)
        if found:
            cfg["resume_from_checkpoint"] = str(found)
    if spec.cluster.device == "cpu":
        cfg["use_cpu"] = True
        cfg["ddp_backend"] = "gloo"
    elif spec.cluster.dist_backend == "gloo":
        cfg["ddp_backend"] = "gloo"
    out_dir = output_dir or (spec.run.output_dir if is_set(spec, "run.output_dir") else "")
    if out_dir:
        cfg["output_dir"] = out_dir
    cfg.update(settings_dict(spec))  # as written: they win
    cfg.setdefault("logging_steps", 1)  # HF's default (500) leaves short runs without steps
    return cfg


def _data_problem(e: OSError) -> str:
    said = str(e)  # a DataFileError's sentence names data.path already
    return said if said.startswith("data.path") else f"data.path: {said}"


def _read_info(path: Path) -> dict[str, Any]:
    try:
        got = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"llamafactory.dataset_dir: cannot read {path}: {e}") from None
    return got if isinstance(got, dict) else {}


def _deepspeed_preset(stage: int) -> dict[str, Any]:
    """A ZeRO config in the shape of LLaMA-Factory's examples/deepspeed/ds_z*_config.json,
    passed inline (HF's deepspeed argument takes a dict as well as a path)."""
    zero: dict[str, Any] = {"stage": stage}
    if stage >= 2:
        zero.update(overlap_comm=False, contiguous_gradients=True, reduce_scatter=True)
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
    }
