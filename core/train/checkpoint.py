"""Checkpoint folders: `<output_dir>/checkpoint-<step>/`, written by rank 0.

Layout:
    adapter_config.json + adapter_model.safetensors   (lora: peft format)
      or config.json + model.safetensors              (full: transformers format)
    tokenizer.json, tokenizer_config.json, chat_template.jinja
    optimizer.pt      full (unsharded) optimizer state, keyed by parameter name, so it loads
                      under DDP or FSDP2 and any world size
    scheduler.pt      lr scheduler state_dict()
    rng_state.pt      {rank: {"python", "numpy", "torch", "cuda"}} of every rank
    trainer_state.json  {"step", "epoch", "batches_in_epoch", "seed", "loss", "world_size", ...}
    merged/           only with method.merge_lora, on the final checkpoint: base + adapter

Written into a hidden temp folder next to it and renamed, so a reader (the TUI, a resume, a
user's `ls`) never sees a half-written checkpoint: a folder named checkpoint-N that holds
trainer_state.json is complete.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np
import torch

from tunedeck.core.rundir.checkpoints import STATE_FILE, checkpoint_path
from tunedeck.core.rundir.checkpoints import complete_checkpoints as _complete

RNG_FILE = "rng_state.pt"


def write_checkpoint(
    output_dir: Path, step: int, write: Callable[[Path], None], state: dict[str, Any]
) -> Path:
    """Run `write(tmp_folder)`, add trainer_state.json last, then rename into place."""
    final = checkpoint_path(output_dir, step)
    if final.exists():  # e.g. a save_steps checkpoint on the very step the run stopped
        return final
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = output_dir / f".checkpoint-{step}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write(tmp)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_state(path: Path) -> dict[str, Any]:
    """trainer_state.json of a checkpoint (for resume and the TUI)."""
    return json.loads((Path(path) / STATE_FILE).read_text(encoding="utf-8"))


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoint folders of this trainer's output, oldest step first."""
    return [c.path for c in _complete(output_dir, nested=False)]


def rotate(output_dir: Path, keep: int, protect: Path | None = None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond `keep` (0 = keep all). The one the run
    resumed from is never deleted: it is the only known-good state until a newer one exists
    and has been read back by nobody yet. Returns what was deleted."""
    if keep <= 0:
        return []
    done = complete_checkpoints(output_dir)
    victims = [p for p in done[:-keep] if protect is None or p.resolve() != Path(protect).resolve()]
    for p in victims:
        # Rename first so a crash mid-delete never leaves a half checkpoint that looks whole.
        trash = p.with_name(f".deleting-{p.name}")
        os.rename(p, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return victims


# -- RNG ----------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    st = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state(st["cuda"])
