"""Checkpoint folders in an output directory: the one place that knows what a complete one is.

`<output_dir>/checkpoint-<step>/` (the built-in trainer, HF-Trainer scripts) or, under
ms-swift, `<output_dir>/v<N>-<date>/checkpoint-<step>/`. A checkpoint is complete once it holds
trainer_state.json: the built-in trainer writes it last into a hidden temp folder and renames
the folder into place (tunedeck.core.train.checkpoint); the HF Trainer under ms-swift writes it
after the weights and the optimizer. Hidden folders (being written, being rotated away) never
count. No torch here: the CLI and the TUI read checkpoints too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"checkpoint-(\d+)")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int


def step_of(path: Path) -> int:
    """The step in a checkpoint folder's name; 0 when it has none."""
    m = _NAME.fullmatch(Path(path).name)
    return int(m.group(1)) if m else 0


def checkpoint_path(output_dir: Path, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step}"


def _found(output_dir: Path, nested: bool) -> list[tuple[int, float, Path]]:
    """(step, when trainer_state.json was written, folder) of each complete checkpoint."""
    found: list[tuple[int, float, Path]] = []

    def look(folder: Path, depth: int) -> None:
        try:
            entries = [e for e in os.scandir(folder) if not e.name.startswith(".") and e.is_dir()]
        except OSError:
            return
        for e in entries:
            m = _NAME.fullmatch(e.name)
            if m:
                try:
                    done = os.stat(Path(e.path) / STATE_FILE)
                except OSError:
                    continue
                found.append((int(m.group(1)), done.st_mtime, Path(e.path)))
            elif depth == 0 and nested:
                look(Path(e.path), 1)

    look(Path(output_dir), 0)
    return found


def complete_checkpoints(output_dir: Path, nested: bool = True) -> list[Checkpoint]:
    """Complete checkpoints, oldest step first; `nested` also looks one folder down
    (ms-swift's version folders)."""
    # ms-swift restarts its step count in each version folder: the later write wins a tie
    return [Checkpoint(p, step) for step, _, p in sorted(_found(output_dir, nested))]


def newest_checkpoint(output_dir: Path, nested: bool = True) -> Checkpoint | None:
    done = complete_checkpoints(output_dir, nested)
    return done[-1] if done else None


def resume_point(want: str, output_dir: Path, attempt: int, nested: bool = True) -> Path | None:
    """The checkpoint an attempt of a run starts from (None: step 0). A restart (attempt > 0)
    continues from the last checkpoint written into the run's output folder: the latest write,
    not the highest step, so a run resumed from an older checkpoint, or an output folder an
    earlier run left checkpoints in, never sends it back to someone else's history. Without
    one, or on the first attempt, train.resume_from: a folder, or "auto" = the highest step."""
    if attempt > 0:
        found = _found(output_dir, nested)
        if found:
            return max(found, key=lambda f: (f[1], f[0]))[2]
    if want == "auto":
        c = newest_checkpoint(output_dir, nested)
        return c.path if c else None
    return Path(want).expanduser() if want else None
