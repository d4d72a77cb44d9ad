"""Turn what ms-swift, HF Trainer and tqdm print into tunedeck step events (core/rundir/events.py).

Sources, best first:
  - ms-swift's `logging.jsonl` (raw floats; `global_step/max_steps` "12/100"; Megatron uses
    `iteration`), written by world rank 0 (the last rank for Megatron);
  - console dicts: Python dict reprs on stdout. transformers 5 formats every float as a string
    with 4 significant digits ({'loss': '6.893', ...}); 4.x prints raw floats;
  - tqdm bars (`12/100 [00:03<00:20, 4.1it/s, loss=1.23]`) for scripts that print nothing else.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tunedeck.core.ingest.parsers.pydict import parse_dict_line

ANNOUNCE = re.compile(r"The logging file will be saved in: (\S+logging\.jsonl)")
_DICT = re.compile(r"\{'[A-Za-z_].*\}")
_TQDM = re.compile(r"(\d+)/(\d+) \[[^\]]*?(?:,\s*([\d.]+)(it/s|s/it))?(?:,\s*(.*))?\]")
_PLAIN = re.compile(r"\bstep[\s=:]+(\d+)\b.*?\bloss[\s=:]+(-?[\d.]+(?:e-?\d+)?|nan|inf)", re.I)


def num(v: Any) -> float | None:
    """A metric value as float: numbers as they are, strings like '6.893' or '1e-05' parsed."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip().rstrip("%"))
        except ValueError:
            return None
    return None


def _step_of(rec: dict[str, Any]) -> int | None:
    for key in ("global_step/max_steps", "iteration"):
        v = rec.get(key)
        if isinstance(v, str) and "/" in v:
            head = v.split("/", 1)[0].strip()
            if head.isdigit():
                return int(head)
    for key in ("step", "global_step"):
        v = rec.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def record_to_event(rec: dict[str, Any], step: int | None = None) -> dict[str, Any] | None:
    """A step (or eval) event from one log record; None for summaries and other records."""
    step = _step_of(rec) if step is None else step
    if step is None:
        return None
    if "loss" in rec:
        ev: dict[str, Any] = {"kind": "step", "step": step, "loss": num(rec["loss"])}
        for src, dst in (("learning_rate", "lr"), ("lr", "lr"), ("grad_norm", "grad_norm"),
                         ("memory(GiB)", "mem_gib"), ("token_acc", "token_acc"),
                         ("epoch", "epoch")):
            val = num(rec.get(src))
            if val is not None:
                ev[dst] = val
        s_it = num(rec.get("train_speed(s/it)"))
        it_s = num(rec.get("train_speed(iter/s)"))  # ms-swift <= 3.12.4
        if s_it:
            ev["step_s"] = s_it
        elif it_s:
            ev["step_s"] = 1.0 / it_s
        for key in ("tokens_per_s", "train_tokens_per_second"):
            val = num(rec.get(key))
            if val is not None:
                ev["tokens_per_s"] = val
        return ev
    if "eval_loss" in rec:
        return {"kind": "eval", "step": step, "loss": num(rec["eval_loss"])}
    return None


def console_dict(line: str) -> dict[str, Any] | None:
    """The dict printed on a console line (possibly after a tqdm bar and `\\r`), or None."""
    m = _DICT.search(line)
    # the ingest parser: it also reads transformers 4's bare `nan`, which literal_eval rejects
    return parse_dict_line(m.group(0)) if m else None


def tqdm_progress(line: str) -> dict[str, Any] | None:
    """The last tqdm state on a line: {"n", "total", "step_s", "loss"?}."""
    last = None
    for m in _TQDM.finditer(line):
        last = m
    if last is None:
        return None
    out: dict[str, Any] = {"n": int(last.group(1)), "total": int(last.group(2))}
    if last.group(3):
        rate = float(last.group(3))
        if rate > 0:
            out["step_s"] = rate if last.group(4) == "s/it" else 1.0 / rate
    post = last.group(5) or ""
    lm = re.search(r"\bloss=([-\d.e+]+|nan)", post)
    if lm:
        out["loss"] = num(lm.group(1))
    return out


def plain_step(line: str) -> tuple[int, float | None] | None:
    """`step 12 loss 1.93`-style prints of plain torch scripts."""
    m = _PLAIN.search(line)
    return (int(m.group(1)), num(m.group(2))) if m else None


def announced_logging_file(text: str) -> Path | None:
    found = None
    for m in ANNOUNCE.finditer(text):
        found = Path(m.group(1))
    return found
