"""`step 12 loss 1.93`-style prints of plain torch scripts (also `step=12, loss=1.93` and
`Step: 12 | Loss: 1.93`); torchtitan's richer `step: 12  loss: ...` lines have their own
parser, tried first."""

from __future__ import annotations

import re
from typing import Any

_PLAIN = re.compile(
    r"\bstep[\s=:]+(\d+)\b.*?\bloss[\s=:]+(-?\d+(?:\.\d*)?(?:e-?\d+)?|nan|inf)\b", re.I
)


def parse_plain_step(line: str) -> dict[str, Any] | None:
    m = _PLAIN.search(line)
    return {"step": int(m.group(1)), "loss": float(m.group(2))} if m else None
