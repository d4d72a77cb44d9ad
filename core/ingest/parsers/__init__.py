"""Pure parsers for the text training jobs write, one module per format.

Every parser takes one logical line (see `assemble.LineAssembler` for turning raw bytes with
`\\r`-glued tqdm updates and hard-wrapped lines into logical lines) and returns a plain dict, or
None when the line is not in its format. They keep no state except the block parsers
(`torchrun.ChildFailedParser`), which take lines as they arrive, so a tailer can feed them
whatever a poll read.

`parse_metrics_line` tries the metric formats in the order that is cheapest to reject.
"""

from __future__ import annotations

from typing import Any

from tunedeck.core.ingest.parsers.assemble import LineAssembler
from tunedeck.core.ingest.parsers.deepspeed import parse_deepspeed
from tunedeck.core.ingest.parsers.frameworks import parse_framework_line
from tunedeck.core.ingest.parsers.normalize import normalize
from tunedeck.core.ingest.parsers.plain import parse_plain_step
from tunedeck.core.ingest.parsers.pydict import parse_dict_line
from tunedeck.core.ingest.parsers.torchtitan import parse_torchtitan
from tunedeck.core.ingest.parsers.tqdm import parse_tqdm

__all__ = [
    "LineAssembler",
    "parse_metrics_line",
    "parse_dict_line",
    "parse_tqdm",
    "parse_torchtitan",
    "parse_deepspeed",
    "parse_plain_step",
]


def parse_metrics_line(line: str) -> tuple[str, dict[str, Any]] | None:
    """(format, raw fields) for a line carrying training metrics, else None.

    format is one of "dict" (built-in events, ms-swift/HF Trainer dicts, logging.jsonl),
    "tqdm", "torchtitan", "deepspeed", "plain" (`step 12 loss 1.93` prints, and the
    frameworks of `frameworks.py`, already in plain keys).

    A line in no format is tried once more without its prefixes (`[rank0]:`, a time stamp,
    srun's `0:`, ...; normalize.py): lines that parse as they are never pay for that.
    """
    got = _parse(line)
    if got is None and line[:1] not in _NO_PREFIX:
        text = normalize(line).text
        if text != line:
            got = _parse(text)
    return got


# first characters no prefix starts with (most lines that parse start with `{` or a space)
_NO_PREFIX = frozenset("{ \t")


def _parse(line: str) -> tuple[str, dict[str, Any]] | None:
    s = line.lstrip()
    if not s:
        return None
    d = parse_framework_line(s) if s[0] != "{" else None
    if d is not None:
        return "plain", d
    if s[0] == "{":
        d = parse_dict_line(s)
        return ("dict", d) if d is not None else None
    if "step" in s:
        d = parse_torchtitan(s)
        if d is not None:
            return "torchtitan", d
        d = parse_deepspeed(s)
        if d is not None:
            return "deepspeed", d
    if "|" in s or "% " in s:
        d = parse_tqdm(s)
        if d is not None:
            return "tqdm", d
    if ("step" in s or "Step" in s) and ("loss" in s or "Loss" in s):
        d = parse_plain_step(s)
        if d is not None:
            return "plain", d
    return None
