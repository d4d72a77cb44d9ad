"""DeepSpeed engine logs:
`[Rank 0] step=10, skipped=0, lr=[1e-05], mom=[(0.9, 0.999)]` (every steps_per_print) and the
throughput timer's `... global_step=10, RunningAvgSamplesPerSec=12.3, CurrSamplesPerSec=12.1 ...`
or `samples/sec=12.3`."""

from __future__ import annotations

import re
from typing import Any

_STEP = re.compile(r"(?:\[Rank (\d+)\]\s+)?\bstep=(\d+),\s*skipped=(\d+)(?:,\s*lr=\[([^\],]+))?")
_TIMER = re.compile(r"global_step=(\d+)")
_RATE = re.compile(r"(RunningAvgSamplesPerSec|CurrSamplesPerSec|samples/sec)[=:]\s*([\d.]+)")


def parse_deepspeed(line: str) -> dict[str, Any] | None:
    if "step=" not in line and "samples/sec" not in line:
        return None
    m = _STEP.search(line)
    out: dict[str, Any] = {}
    if m:
        out["step"] = int(m.group(2))
        out["skipped"] = int(m.group(3))
        if m.group(1) is not None:
            out["rank"] = int(m.group(1))
        if m.group(4):
            try:
                out["lr"] = float(m.group(4))
            except ValueError:
                pass
    else:
        # the throughput timer's line, not any `global_step=` (Lightning's bar prints 3.2e+4)
        t = _TIMER.search(line)
        if t and _RATE.search(line) and line[t.end() : t.end() + 1] not in ".e":
            out["step"] = int(t.group(1))
    for name, value in _RATE.findall(line):
        if name != "CurrSamplesPerSec" or "samples_per_s" not in out:
            out["samples_per_s"] = float(value)
    return out if "step" in out else None
