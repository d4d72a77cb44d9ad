"""How LLaMA-Factory runs a spec, for the numbers (`Backend.as_run`, core/backends/run_estimate.py).

A spec key the user leaves unset emits nothing into the config, so LLaMA-Factory's (and HF
TrainingArguments') default applies, not tunedeck's: a 2048-token cutoff_len, a micro batch of
8, LoRA rank 8 on every linear layer, gradient checkpointing on. The estimate, preflight's
memory check and the compose form take those.
"""

from __future__ import annotations

from typing import Any

from tunedeck.core.spec import RunSpec, get_value, is_set, set_values

SOURCE = "LLaMA-Factory default"
# spec key → the value LLaMA-Factory 0.9 runs with when the config leaves its key out
DEFAULTS: dict[str, Any] = {
    "data.max_length": 2048,  # cutoff_len
    "train.per_device_batch_size": 8,  # per_device_train_batch_size (HF)
    "train.grad_accum": 1,
    "train.learning_rate": 5e-5,
    "train.num_epochs": 3.0,
    "method.type": "lora",  # finetuning_type
    "method.lora_rank": 8,
    "method.lora_alpha": 16,  # lora_rank * 2
    "method.lora_dropout": 0.0,
    "method.target_modules": ["all-linear"],  # lora_target: all
    "train.gradient_checkpointing": True,  # disable_gradient_checkpointing: false
    "data.packing": False,
}


def run_defaults(spec: RunSpec) -> dict[str, tuple[Any, str]]:
    """Each setting `spec` leaves to LLaMA-Factory: (the value it runs with, where from)."""
    out = {k: (v, SOURCE) for k, v in DEFAULTS.items() if not is_set(spec, k)}
    if "method.lora_alpha" in out and is_set(spec, "method.lora_rank"):
        out["method.lora_alpha"] = (2 * spec.method.lora_rank, SOURCE + " (lora_rank * 2)")
    return out


def as_run(spec: RunSpec) -> tuple[RunSpec, list[str]]:
    """`spec` with LLaMA-Factory's defaults in place of unset keys (for the numbers only)."""
    unset = {k: v for k, (v, _) in run_defaults(spec).items() if get_value(spec, k) != v}
    if not unset:
        return spec, []
    view = set_values(spec, unset)
    view.explicit = set(spec.explicit)
    notes = []
    if "data.max_length" in unset:
        notes.append(
            "data.max_length unset: LLaMA-Factory's cutoff_len is 2048, so the figures assume "
            "samples that long; set it to the data's longest sample for a tighter one"
        )
    return view, notes
