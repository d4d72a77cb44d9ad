"""The trained model out of a run: which checkpoint (`pick`), the base it was trained from,
the merged export (`export.py`) and a chat with it (`chat.py`).

torch, transformers and peft are imported inside the functions: the front ends import this
package through core/api.py, and `tunedeck ls` must not pay for them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import STATE_FILE, complete_checkpoints
from tunedeck.core.spec import RunSpec, load_spec


class ModelOutError(ValueError):
    """A checkpoint or model that cannot be exported or loaded; the message says why."""


@dataclass(frozen=True)
class Source:
    """What a run trained: its spec, one complete checkpoint, and whether that is an adapter."""

    run_dir: Path
    spec: RunSpec
    checkpoint: Path
    step: int
    adapter: bool

    @property
    def run_id(self) -> str:
        return self.run_dir.name


def _loss(ckpt: Path) -> float | None:
    try:
        loss = json.loads((ckpt / STATE_FILE).read_text()).get("loss")
    except (OSError, ValueError):
        return None
    return loss if isinstance(loss, (int, float)) else None


def pick(run_dir: Path, which: str = "last") -> Source:
    """`which`: a step number, "last", or "best" (the lowest training loss a checkpoint
    recorded)."""
    run_dir = Path(run_dir)
    spec = load_spec(RunDir(run_dir).spec)
    done = complete_checkpoints(RunDir(run_dir).output_dir(spec))
    if not done:
        raise ModelOutError(f"run {run_dir.name} has no complete checkpoint yet")
    if which == "last":
        ck = done[-1]
    elif which == "best":
        scored = [(loss, c.step, c) for c in done if (loss := _loss(c.path)) is not None]
        if not scored:
            raise ModelOutError(f"--checkpoint best: no checkpoint of {run_dir.name} has a loss")
        ck = min(scored, key=lambda t: (t[0], -t[1]))[2]
    else:
        try:
            step = int(which)
        except ValueError:
            raise ModelOutError(f"--checkpoint {which!r}: a step number, last or best") from None
        by_step = {c.step: c for c in done}
        if step not in by_step:
            raise ModelOutError(
                f"--checkpoint {step}: no complete checkpoint at that step; "
                f"there are {', '.join(str(s) for s in by_step)}"
            )
        ck = by_step[step]
    adapter = (ck.path / "adapter_config.json").exists()
    if not adapter and not (ck.path / "config.json").exists():
        raise ModelOutError(f"{ck.path}: neither an adapter nor a model folder")
    return Source(run_dir, spec, ck.path, ck.step, adapter)


def base_model_path(spec: RunSpec) -> tuple[Path, bool]:
    """(folder, builtin) of the model a run started from (the demo model is built if needed)."""
    from tunedeck.core.train.model import resolve_model_path

    return resolve_model_path(spec)


def load_tokenizer(src: Source):
    """The tokenizer the checkpoint saved (with its chat template), else the base's."""
    from tunedeck.core.train.model import load_tokenizer as load

    base, builtin = base_model_path(src.spec)
    has_own = (src.checkpoint / "tokenizer_config.json").exists()
    return load(src.checkpoint if has_own else base, builtin)


def load_model(src: Source | None, base: Path, dtype, device: str = "cpu", tuned: bool = True):
    """The base model, with the checkpoint's adapter on it when `tuned` (a full checkpoint is
    loaded as it is). Evaluation mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # bars are noise in a CLI's stderr and the TUI's pane
    if src is not None and tuned and not src.adapter:
        return (
            AutoModelForCausalLM.from_pretrained(str(src.checkpoint), dtype=dtype).to(device).eval()
        )
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype).to(device)
    if src is not None and tuned:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(src.checkpoint))
    return model.eval()
