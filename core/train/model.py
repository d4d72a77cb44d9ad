"""Model, tokenizer and precision for a RunSpec."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tunedeck.core.demo import (
    BUILTIN_TINY,
    ensure_tiny_model,
    load_tokenizer as load_demo_tokenizer,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(spec) -> tuple[Path, bool]:
    """(folder, is_builtin). Every rank calls this; the demo build is lock-protected."""
    if spec.model.path == BUILTIN_TINY:
        return ensure_tiny_model(spec.data.path), True
    if spec.model.path.startswith("builtin:"):
        raise ValueError(
            f"model.path {spec.model.path!r}: unknown builtin model; known: {BUILTIN_TINY}"
        )
    return Path(spec.model.path).expanduser(), False


def keep_out_bitsandbytes(spec, path: Path) -> bool:
    """Keep bitsandbytes out of a rank that quantizes nothing; whether it did.

    peft imports it whenever it is installed, for every LoRA run, and its import compiles
    kernel registrations: 1.5 s of CPU a rank on the 2-core machine, on every start and
    restart (`python -c "import peft"` with and without it). A None in sys.modules makes
    `import` raise ImportError and importlib's find_spec answer None, which peft and
    transformers both read as "not installed". Left alone for QLoRA, for a checkpoint saved
    quantized (its config.json has a quantization_config) and for a config it cannot read
    (a hub id: transformers decides). scipy (0.7 s a start) cannot be kept out so: where
    scikit-learn is installed transformers imports it, and it needs scipy (every built-in
    run on the H200 image failed at that import)."""
    if spec.method.type == "qlora" or "bitsandbytes" in sys.modules:
        return False
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict) or "quantization_config" in config:
        return False
    sys.modules["bitsandbytes"] = None
    return True


def load_tokenizer(path: Path, builtin: bool):
    if builtin:
        return load_demo_tokenizer(path)  # keeps the BPE exactly as trained; see tunedeck.core.demo
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
    base in the compute dtype (half the memory) while peft keeps the adapters in fp32. QLoRA
    loads the base quantized by bitsandbytes (GPU only).
    """
    from transformers import AutoModelForCausalLM

    method = spec.method.type
    kw = {"attn_implementation": spec.model.attn_impl}
    if method == "qlora":
        kw["quantization_config"] = qlora_config(spec, dtype)
        kw["device_map"] = {"": device}
    load_dtype = dtype if method in ("lora", "qlora") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=load_dtype, **kw)
    if method == "qlora":
        # Not peft's prepare_model_for_kbit_training: it upcasts the norms (and embedding and
        # head) to fp32, a norm's fp32 output makes every 4-bit linear cast its output back to
        # fp32, and so the MLP's saved intermediates double: +48 % activation bytes a token,
        # counted on CPU with real bitsandbytes (tests/test_train_qlora.py); ~45 GiB on the 7B
        # at 4 x 2048. Frozen in the compute dtype, the base saves what LoRA's does. Gradient
        # checkpointing is non-reentrant (prepare below), so inputs need no grad either.
        for p in model.parameters():
            p.requires_grad_(False)
    return prepare(spec, model, device), method


def qlora_config(spec, dtype: torch.dtype):
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "method.type qlora needs bitsandbytes, which is not importable "
            "here (pip install 'tunedeck[qlora]'), or use "
            "method.type lora"
        ) from None
    from transformers import BitsAndBytesConfig

    if spec.method.quant_bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
    )


def prepare(spec, model, device: torch.device):
    """No KV cache, optional gradient checkpointing, LoRA adapters; moved to `device`.

    Shared by the trainer and the benchmark (which builds its model from a config)."""
    model.config.use_cache = False  # no KV cache while training
    if spec.train.gradient_checkpointing:
        # Non-reentrant: works with frozen inputs (LoRA) and with FSDP2.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if spec.method.type in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        targets = spec.method.target_modules
        cfg = LoraConfig(
            task_type="CAUSAL_LM",
            r=spec.method.lora_rank,
            lora_alpha=spec.method.lora_alpha,
            lora_dropout=spec.method.lora_dropout,
            target_modules="all-linear" if targets == ["all-linear"] else list(targets),
        )
        model = get_peft_model(model, cfg)
    if spec.method.type == "qlora":
        return model  # already placed by device_map; .to() is not allowed on 4-bit weights
    return model.to(device)


def count_params(model) -> tuple[int, int]:
    from tunedeck.core.train.lora_fused import weight_numel

    total = sum(weight_numel(p) for p in model.parameters())  # 4-bit ones by their shape
    # method.fp8_base keeps frozen weights outside the parameters (lora_fused.to_fp8)
    total += sum(getattr(m, "_tunedeck_numel", 0) for m in model.modules())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, total
