"""One decoder layer's shape from the command line, for the benches that build a single
Qwen2 layer (saved_layer.py, swiglu_layer.py): the same flags, each bench its own defaults."""

from __future__ import annotations

import argparse

SHAPE = ("hidden", "ffn", "heads", "kv", "rank", "batch", "seq")


def add_shape_args(ap: argparse.ArgumentParser, **defaults: int) -> None:
    """--hidden --ffn --heads --kv (query and key/value heads) --rank (LoRA) --batch --seq."""
    for name in SHAPE:
        ap.add_argument(f"--{name}", type=int, default=defaults[name])


def qwen2_config(a: argparse.Namespace):
    """A one-layer Qwen2 of that shape (a small vocabulary: the benches time the layer)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=a.hidden,
        intermediate_size=a.ffn,
        num_hidden_layers=1,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv,
        vocab_size=256,
    )
