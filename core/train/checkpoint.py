"""Checkpoint folders: `<output_dir>/checkpoint-<step>/`, written by rank 0.

Layout:
    adapter_config.json + adapter_model.safetensors   (lora: peft save_pretrained)
      or config.json + model.safetensors              (full: transformers save_pretrained)
    tokenizer.json, tokenizer_config.json, chat_template.jinja
    optimizer.pt      optimizer.state_dict()
    scheduler.pt      lr scheduler state_dict()
    trainer_state.json  {"step", "epoch", "seed", "loss", "world_size", "max_steps", ...}

Written into a hidden temp folder next to it and renamed, so a reader (the TUI, a resume, a
user's `ls`) never sees a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.json"


def checkpoint_path(output_dir: Path, step: int) -> Path:
    return output_dir / f"checkpoint-{step}"


def write_checkpoint(output_dir: Path, step: int, model, tokenizer, optimizer, scheduler,
                     state: dict[str, Any]) -> Path:
    final = checkpoint_path(output_dir, step)
    if final.exists():  # e.g. a save_steps checkpoint on the very step the run stopped
        return final
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = output_dir / f".checkpoint-{step}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_state(path: Path) -> dict[str, Any]:
    """trainer_state.json of a checkpoint (for resume and the TUI)."""
    return json.loads((Path(path) / STATE_FILE).read_text(encoding="utf-8"))
