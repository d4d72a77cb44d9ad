"""Numbers tunedeck reads from its own environment variables (beat, alert hold, telemetry and
stall periods, the queue's busy threshold): one reader, so a typo in any of them is handled
the same way (a warning that names the variable, then the default) instead of crashing an
agent or being ignored silently."""

from __future__ import annotations

import logging
import math
import os

log = logging.getLogger("tunedeck.env")


def env_number(name: str, default: float, floor: float = 0.0) -> float:
    """`name` as a float no lower than `floor`; `default` when it is unset or empty, and (with
    a warning) when it is not a finite number."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        log.warning("%s=%r is not a number; using %g", name, raw, default)
        return default
    return max(floor, value)
