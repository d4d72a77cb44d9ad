"""Model, tokenizer and precision for a RunSpec."""

from __future__ import annotations

from pathlib import Path

import torch

from core.demo import BUILTIN_TINY, ensure_tiny_model, load_tokenizer as load_demo_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(spec) -> tuple[Path, bool]:
    """(folder, is_builtin). Every rank calls this; the demo build is lock-protected."""
    if spec.model.path == BUILTIN_TINY:
        return ensure_tiny_model(spec.data.path), True
    if spec.model.path.startswith("builtin:"):
        raise ValueError(f"model.path {spec.model.path!r}: unknown builtin model; "
                         f"known: {BUILTIN_TINY}")
    return Path(spec.model.path).expanduser(), False


def load_tokenizer(path: Path, builtin: bool):
    if builtin:
        return load_demo_tokenizer(path)  # keeps the BPE exactly as trained; see core.demo
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto → bf16 on GPUs that support it, else fp32 (CPU autocast in bf16 is slow)."""
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return DTYPES[name]


def build_model(spec, path: Path, device: torch.device, dtype: torch.dtype):
    """The model to train, on `device`. Returns (model, method).

    Full fine-tuning keeps fp32 master weights and runs under autocast. LoRA loads the frozen
    base in the compute dtype (half the memory) while peft keeps the adapters in fp32.
    """
    from transformers import AutoModelForCausalLM

    method = spec.method.type
    if method == "qlora":
        raise NotImplementedError("method.type qlora is not supported by the builtin trainer "
                                  "yet; use lora, or the swift backend")
    load_dtype = dtype if method == "lora" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=load_dtype)
    model.config.use_cache = False  # no KV cache while training
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        targets = spec.method.target_modules
        cfg = LoraConfig(
            task_type="CAUSAL_LM", r=spec.method.lora_rank, lora_alpha=spec.method.lora_alpha,
            lora_dropout=spec.method.lora_dropout,
            target_modules="all-linear" if targets == ["all-linear"] else list(targets))
        model = get_peft_model(model, cfg)
    return model.to(device), method


def count_params(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total
