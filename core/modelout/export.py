"""`tunedeck export-model`: a checkpoint as a folder transformers, vLLM and friends load.

An adapter checkpoint is merged into its base (peft `merge_and_unload`) and saved with the
tokenizer and its chat template, or copied as the adapter alone (`merge=False`); a full
checkpoint is saved in the asked dtype. A README.md model card names the run, the data, the
settings and the final losses. A backend with its own merge tool (ms-swift: `swift export
--merge_lora`) merges with it, as its users would, run as an argv (never a shell) with its
output passed on as progress. The folder is written beside its final name and renamed into
place, so a reader never sees half an export; the run records it (exports.json), so
`tunedeck export RUN --format vllm` serves it."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

from tunedeck.core.modelout import (
    ModelOutError,
    Source,
    base_model_path,
    load_model,
    load_tokenizer,
)
from tunedeck.core.backends import backend_of
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.exports import record_export

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _losses(run_dir: Path) -> dict[str, float]:
    """The last train and eval loss run.db holds (empty when it cannot be read)."""
    out: dict[str, float] = {}
    try:
        con = sqlite3.connect(f"file:{RunDir(run_dir).path / 'run.db'}?mode=ro", uri=True)
        try:
            for key, sql in (
                (
                    "train_loss",
                    "SELECT loss FROM steps WHERE loss IS NOT NULL ORDER BY step DESC LIMIT 1",
                ),
                ("eval_loss", "SELECT eval_loss FROM evals ORDER BY step DESC LIMIT 1"),
            ):
                row = con.execute(sql).fetchone()
                if row and row[0] is not None:
                    out[key] = float(row[0])
        finally:
            con.close()
    except sqlite3.Error:
        pass
    return out


def model_card(src: Source, merged: bool, dtype: str) -> str:
    s = src.spec
    losses = _losses(src.run_dir)
    rows = [
        ("tunedeck run", src.run_id),
        ("run name", s.name),
        ("checkpoint", f"step {src.step} ({src.checkpoint})"),
        ("base model", s.model.path),
        ("data", s.data.path),
        (
            "method",
            s.method.type
            + (f" r={s.method.lora_rank} alpha={s.method.lora_alpha}" if src.adapter else ""),
        ),
        ("steps", str(s.train.max_steps)),
        ("learning rate", f"{s.train.learning_rate:g} ({s.train.lr_scheduler})"),
        ("batch per device", str(s.train.per_device_batch_size)),
        ("max length", str(s.data.max_length)),
        (
            "export",
            (
                "adapter merged into the base"
                if merged
                else "adapter only"
                if src.adapter
                else "full model"
            )
            + f", {dtype}",
        ),
    ] + [(k.replace("_", " "), f"{v:.4f}") for k, v in losses.items()]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return (
        f"---\nlibrary_name: transformers\ntags: [tunedeck, {s.method.type}]\n---\n\n"
        f"# {s.name}\n\nFine-tuned with tunedeck, run `{src.run_id}`.\n\n"
        f"| | |\n| --- | --- |\n{table}\n"
    )


def export_model(
    src: Source,
    out: Path,
    merge: bool = True,
    dtype: str = "bf16",
    progress: Callable[[str], None] = lambda _msg: None,
    device: str = "cpu",
) -> Path:
    """Write the export into `out` (which must not exist); returns it."""
    import torch

    if dtype not in DTYPES:
        raise ModelOutError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    out = Path(out)
    if out.exists():
        raise ModelOutError(f"{out} exists; name a new folder with -o")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    torch_dtype = getattr(torch, DTYPES[dtype])
    merged = merge and src.adapter
    own_merge = backend_of(src.spec).merge_command if merged else None
    try:
        if own_merge is not None:
            _run_merge(own_merge(src.checkpoint, tmp, dtype), progress)
        else:
            _export_here(src, tmp, merge, torch_dtype, dtype, progress, device)
        (tmp / "README.md").write_text(model_card(src, merged, dtype))
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    kind = "merged" if merged else "adapter" if src.adapter else "full"
    record_export(src.run_dir, out, src.step, kind, dtype)
    progress(f"exported to {out}")
    return out


def _run_merge(argv: list[str], progress: Callable[[str], None]) -> None:
    """The backend's merge tool; its lines become progress, its failure a ModelOutError with
    its last lines."""
    progress("merging with: " + " ".join(argv[1:] if argv[1:2] == ["-m"] else argv))
    tail: list[str] = []
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # drained to the end: the child never blocks on the pipe
            line = line.rstrip()
            if line:
                tail = (tail + [line])[-20:]
                progress(line)
    if proc.returncode != 0:
        raise ModelOutError(
            f"{argv[2] if argv[1:2] == ['-m'] else argv[0]} exited {proc.returncode}:\n"
            + "\n".join(tail)
        )


def _export_here(
    src: Source,
    tmp: Path,
    merge: bool,
    torch_dtype,
    dtype: str,
    progress: Callable[[str], None],
    device: str,
) -> None:
    """peft's merge (or the adapter or full checkpoint as it is), with the tokenizer."""
    merged = merge and src.adapter
    tok = load_tokenizer(src)
    if src.adapter and not merge:
        progress("copying the adapter")
        shutil.copytree(
            src.checkpoint,
            tmp,
            ignore=shutil.ignore_patterns(
                "optimizer.pt", "scheduler.pt", "rng_state*", "trainer_state.json"
            ),
        )
    else:
        base, _ = base_model_path(src.spec)
        progress(f"loading {'the base and the adapter' if merged else 'the checkpoint'} ({dtype})")
        model = load_model(src, base, torch_dtype, device)
        if merged:
            progress("merging the adapter into the base")
            model = model.merge_and_unload()
        progress("saving")
        model.save_pretrained(tmp)
        del model
    tok.save_pretrained(tmp)
