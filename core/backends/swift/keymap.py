"""The one table between spec keys and ms-swift flags, read in both directions: the swift
backend turns a set key into its flag, `tunedeck import` turns a flag into its key. A key the
user did not set emits nothing (ms-swift's own default applies); a flag with no key, or a
value its key cannot hold as written, stays in swift.extra_args word for word.

`SPECIAL` names the keys whose flags take more than one word or depend on other keys (the
model, datasets, tuner and quantisation, sharding strategy, devices): the backend and the
importer handle them in code, and tests check that every ms-swift key is in one of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tunedeck.core.spec import OPTIONS, RunSpec, get_value, is_set


@dataclass(frozen=True)
class KeyFlag:
    key: str  # dotted spec key
    flag: str | None  # swift sft/pt/rlhf flag (None: not a flag there)
    megatron: str | None  # megatron sft/pt/rlhf flag
    # spec value -> ms-swift value, where they are spelled differently (both directions)
    values: tuple[tuple[str, str], ...] = field(default=())
    zero_unset: bool = False  # 0 means "not set" in the spec (its help says what 0 does)

    def flag_for(self, command: str) -> str | None:
        return self.megatron if command.startswith("megatron") else self.flag


def _both(key: str, flag: str, **kw: Any) -> KeyFlag:
    return KeyFlag(key, flag, flag, **kw)


KEYS: tuple[KeyFlag, ...] = (
    _both("model.dtype", "torch_dtype"),
    _both("model.attn_impl", "attn_impl"),
    _both("data.max_length", "max_length"),
    _both("data.truncation", "truncation_strategy", values=(("drop", "delete"),)),
    _both("data.num_workers", "dataloader_num_workers"),
    _both("data.val_split", "split_dataset_ratio"),
    _both("data.val_datasets", "val_dataset"),
    _both("data.packing", "packing"),
    _both("method.lora_rank", "lora_rank"),
    _both("method.lora_alpha", "lora_alpha"),
    _both("method.lora_dropout", "lora_dropout"),
    _both("method.target_modules", "target_modules"),
    KeyFlag("train.max_steps", "max_steps", "train_iters"),
    _both("train.num_epochs", "num_train_epochs", zero_unset=True),
    KeyFlag("train.per_device_batch_size", "per_device_train_batch_size", "micro_batch_size"),
    KeyFlag("train.grad_accum", "gradient_accumulation_steps", None),
    KeyFlag("train.learning_rate", "learning_rate", "lr"),
    _both("train.weight_decay", "weight_decay"),
    KeyFlag("train.warmup_steps", "warmup_steps", "lr_warmup_iters"),
    KeyFlag("train.lr_scheduler", "lr_scheduler_type", "lr_decay_style"),
    KeyFlag("train.max_grad_norm", "max_grad_norm", "clip_grad"),
    _both("train.seed", "seed"),
    _both("train.save_steps", "save_steps", zero_unset=True),
    _both("train.save_total_limit", "save_total_limit", zero_unset=True),
    _both("train.eval_steps", "eval_steps", zero_unset=True),
    KeyFlag("train.gradient_checkpointing", "gradient_checkpointing", None),
    KeyFlag("train.resume_from", "resume_from_checkpoint", None),
    KeyFlag("train.compile", "torch_compile", None),
    KeyFlag("parallel.tp", None, "tensor_model_parallel_size"),
    KeyFlag("parallel.pp", None, "pipeline_model_parallel_size"),
    KeyFlag("parallel.cp", None, "context_parallel_size"),
    KeyFlag("parallel.ep", None, "expert_model_parallel_size"),
    KeyFlag("parallel.sequence_parallel", None, "sequence_parallel"),
    _both("swift.rlhf_type", "rlhf_type"),
    _both("swift.use_vllm", "use_vllm"),
    _both("swift.vllm_mode", "vllm_mode"),
    _both("cluster.collective_timeout_s", "ddp_timeout", zero_unset=True),
)
# keys whose flags the backend and the importer build in code (the docstring says why)
SPECIAL = {
    "model.path": "--model (the built-in demo model adds --model_type/--template)",
    "data.path": "first entry of --dataset",
    "data.datasets": "--dataset, after data.path",
    "data.format": "self_cognition adds swift/self-cognition to --dataset",
    "data.model_name": "--model_name NAME NAME (ms-swift takes a Chinese and an English name)",
    "data.model_author": "--model_author AUTHOR AUTHOR",
    "method.type": "--tuner_type (qlora: lora with --quant_method bnb --quant_bits)",
    "method.quant_bits": "--quant_bits with --quant_method bnb",
    "parallel.strategy": "--deepspeed zeroN[_offload] / --fsdp fsdp2",
    "parallel.zero_stage": "--deepspeed zeroN",
    "parallel.zero_offload": "--deepspeed zeroN_offload or a JSON config",
    "parallel.cpu_offload": "--fsdp JSON config with offload",
    "train.grad_accum": "Megatron: --global_batch_size = micro x data-parallel x grad_accum",
    "train.gradient_checkpointing": "Megatron: --recompute_granularity full ...",
    "cluster.device": "cpu: --use_cpu true",
    "cluster.dist_backend": "--ddp_backend, when written",
    "run.output_dir": "--output_dir (a launch always passes the run's output folder)",
}
BY_KEY = {k.key: k for k in KEYS}


def reverse(command: str) -> dict[str, KeyFlag]:
    """ms-swift flag (no dashes) -> its entry, for `command`."""
    out: dict[str, KeyFlag] = {}
    for k in KEYS:
        f = k.flag_for(command)
        if f:
            out[f] = k
    return out


# -- values ------------------------------------------------------------------------------


def fmt_float(v: float) -> str:
    """The shortest text that reads back as exactly `v` (1e-4, 0.05, 3)."""
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    short = f"{v:g}"
    return short if float(short) == v else repr(v)


def encode(kf: KeyFlag, value: Any) -> list[str]:
    """A spec value as the words after its flag."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, float):
        return [fmt_float(value)]
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value)
    return [dict(kf.values).get(text, text)]


class NotRepresentable(ValueError):
    """The words cannot be held by the key as written (they stay in swift.extra_args)."""


def decode(kf: KeyFlag, words: list[str]) -> Any:
    """The words after a flag as the key's value, exactly (or NotRepresentable)."""
    typ = OPTIONS[kf.key].type
    if typ is bool:
        if not words:
            return True  # `--packing` alone: argparse's const
        if len(words) == 1 and words[0].lower() in ("true", "false"):
            return words[0].lower() == "true"
        raise NotRepresentable(words)
    if getattr(typ, "__origin__", None) is list:
        if not words:
            raise NotRepresentable(words)
        return list(words)
    if len(words) != 1:
        raise NotRepresentable(words)
    w = words[0]
    try:
        if typ in (int, float):
            v = int(w) if typ is int else float(w)
            if not math.isfinite(v) or (kf.zero_unset and v == 0):
                raise NotRepresentable(words)
            return v
    except ValueError:
        raise NotRepresentable(words) from None
    back = {b: a for a, b in kf.values}
    return back.get(w, w)


def emits(kf: KeyFlag, value: Any) -> bool:
    """Whether a set key's value becomes a flag (0 of a zero_unset key does not)."""
    return not (kf.zero_unset and value == 0)


# -- effective values --------------------------------------------------------------------


def effective_values(spec: RunSpec, tables: dict | None) -> list[dict[str, Any]]:
    """Each ms-swift setting of the table for `spec`'s command: its flag, the value the run
    gets and where it comes from ("spec", "ms-swift X default", or "extra_args")."""
    command = spec.swift.command
    known = (tables or {}).get("commands", {}).get(command, {})
    version = (tables or {}).get("version", "?")
    extra = {w[2:].partition("=")[0] for w in spec.swift.extra_args if w.startswith("--")}
    rows = []
    for kf in KEYS:
        flag = kf.flag_for(command)
        if not flag or not OPTIONS[kf.key].applies(spec):
            continue
        if flag in extra:
            rows.append({"key": kf.key, "flag": flag, "value": None, "source": "extra_args"})
        elif is_set(spec, kf.key):
            rows.append(
                {"key": kf.key, "flag": flag, "value": get_value(spec, kf.key), "source": "spec"}
            )
        else:
            info = known.get(flag, {})
            rows.append(
                {
                    "key": kf.key,
                    "flag": flag,
                    "value": info.get("default"),
                    "source": f"ms-swift {version} default",
                }
            )
    return rows


def estimate_view(spec: RunSpec, tables: dict | None) -> RunSpec:
    """A copy of `spec` for the batch math and memory estimate only (never for a plan): the
    unset keys hold ms-swift's defaults where the spec can hold them (a micro batch of 1, the
    accumulation that makes a global batch of 16, its LoRA rank and alpha), so the numbers
    are those of the run ms-swift starts, not tunedeck's own defaults."""
    import copy

    from tunedeck.core.spec import check_option, set_values

    out = copy.deepcopy(spec)
    values = {}
    for row in effective_values(spec, tables):
        if not row["source"].startswith("ms-swift") or row["value"] is None:
            continue
        kf = BY_KEY[row["key"]]
        v = row["value"]
        words = (
            [str(x) for x in v]
            if isinstance(v, list)
            else [("true" if v else "false") if isinstance(v, bool) else str(v)]
        )
        try:
            value = decode(kf, words)
        except NotRepresentable:
            continue
        if isinstance(value, float) and OPTIONS[kf.key].type is int and value.is_integer():
            value = int(value)
        if check_option(kf.key, value)[1] is None:
            values[kf.key] = value
    known = (tables or {}).get("commands", {}).get(spec.swift.command, {})
    tuner = known.get("tuner_type", {}).get("default")
    if not is_set(spec, "method.type") and tuner in ("lora", "full"):
        values["method.type"] = tuner  # Megatron's default is full
    if not is_set(spec, "train.grad_accum"):
        micro = values.get("train.per_device_batch_size", spec.train.per_device_batch_size)
        megatron = spec.swift.command.startswith("megatron")
        values["train.grad_accum"] = 1 if megatron else default_grad_accum(spec, micro)
        gbs = known.get("global_batch_size", {}).get("default")
        if megatron and isinstance(gbs, int):
            from tunedeck.core.estimate.batch import data_parallel_size

            world = spec.cluster.nproc_per_node * spec.cluster.nnodes
            accum, rem = divmod(gbs, max(micro * data_parallel_size(spec, world), 1))
            if accum and not rem:
                values["train.grad_accum"] = accum
    out = set_values(out, values)
    out.explicit = set(spec.explicit)  # what the user set stays what they set
    return out


def default_grad_accum(spec: RunSpec, micro: int) -> int:
    """The accumulation ms-swift picks when --gradient_accumulation_steps is not given: a
    global batch of 16 (ceil(16 / micro batch / world size)); GRPO accumulates nothing."""
    if spec.swift.command == "rlhf" and spec.swift.rlhf_type == "grpo":
        return 1
    world = max(spec.cluster.nproc_per_node, 1) * spec.cluster.nnodes
    return max(1, math.ceil(16 / max(micro, 1) / world))


def length_phrase(spec: RunSpec, tables: dict | None) -> str:
    """How long an ms-swift run trains, and where that comes from."""
    if is_set(spec, "train.max_steps"):
        return f"{spec.train.max_steps} steps"
    if is_set(spec, "train.num_epochs") and spec.train.num_epochs:
        return f"{fmt_float(spec.train.num_epochs)} epochs"
    if any(
        w.startswith(("--max_steps", "--num_train_epochs", "--train_iters"))
        for w in spec.swift.extra_args
    ):
        return "length as in swift.extra_args"
    known = (tables or {}).get("commands", {}).get(spec.swift.command, {})
    epochs = known.get("num_train_epochs", {}).get("default")
    version = (tables or {}).get("version", "?")
    return (
        f"{fmt_float(float(epochs))} epochs (ms-swift {version} default)"
        if epochs
        else f"length: ms-swift {version} default"
    )


# -- flags that are not settings --------------------------------------------------------

# flags that name the model without --model (written in swift.extra_args)
MODEL_FROM = frozenset({"model", "mcore_model", "adapters", "ckpt_dir"})
# --swanlab_token is `SWANLAB_API_KEY` (swanlab's own login). Passed so, the value never shows in
# `ps` nor in ms-swift's args.json. Other credential flags (--swanlab_secret) have no variable
# and stay in argv: the preview says `ps` shows them.
SECRET_FLAG_ENV = {"hub_token": None, "swanlab_token": "SWANLAB_API_KEY"}
# every ms-swift flag that holds a credential (its other flags with a credential word in their
# name, such as --teacher_tag_key, hold none): what `tunedeck import` keeps out of a spec
CREDENTIAL_FLAGS = frozenset({*SECRET_FLAG_ENV, "swanlab_secret", "api_key"})
HUB_TOKEN_VARS = "MODELSCOPE_API_TOKEN (HF_TOKEN with --use_hf)"
