"""The data stage of a backend that prints it: tokenising/packing progress bars read off a
rank's console and turned into the "tokenizing" phase events the built-in trainer writes
(core/rundir/events.py), so the monitor shows the data stage of an ms-swift or script run the
same way: done, total, rate, ETA, and which stage.

The bars are the ones HF datasets and ms-swift draw: `Map`, `Map (num_proc=N)`, `Filter`,
`Running tokenizer on dataset`, `Tokenizing ...`, `Grouping texts in chunks of N`,
`Packing: ` / `Packing (num_proc=N): `, `Converting format of dataset`. A bar that is not a data
stage (`Train`, `Loading weights`, downloads) is ignored. At most one event per `every_s`,
and always a stage's last (done == total). With the run's collective timeout known, the first
reading whose elapsed + remaining time outlasts it carries a `warning` with the fix, as the
built-in trainer warns: the other ranks' first collective would time out waiting.
"""

from __future__ import annotations

import math
import re
from typing import Any

from tunedeck.core.ingest.parsers.tqdm import parse_tqdm

_DATA_STAGE = re.compile(
    r"^(?:map|filter|running tokenizer|tokeniz|grouping texts|packing|converting format"
    r"|preprocess|encod|pre-tokeniz)",
    re.IGNORECASE,
)


def data_bar(line: str) -> dict[str, Any] | None:
    """A data-stage progress bar's reading (parse_tqdm's fields), else None."""
    if "%" not in line:
        return None
    bar = parse_tqdm(line)
    if bar is None or bar["total"] <= 0 or not _DATA_STAGE.match(bar["desc"]):
        return None
    return bar


class DataPhase:
    """Console lines in, phase event fields out (`feed`: the newest bar among the lines)."""

    def __init__(self, timeout_s: float | None = None, every_s: float = 2.0):
        self.timeout_s, self.every_s = timeout_s, every_s
        self.warned = False
        self.last_t = -math.inf
        self.last: tuple[str, int, int] | None = None  # (stage, done, total) last emitted

    def feed(self, lines: list[str], now: float) -> dict[str, Any] | None:
        bar = None
        for line in lines:
            bar = data_bar(line) or bar
        if bar is None:
            return None
        key = (bar["desc"], bar["n"], bar["total"])
        finished = bar["n"] >= bar["total"]
        if key == self.last or (not finished and now - self.last_t < self.every_s):
            return None
        self.last, self.last_t = key, now
        fields: dict[str, Any] = {
            "phase": "tokenizing",
            "stage": bar["desc"],
            "done": bar["n"],
            "total": bar["total"],
        }
        rate = bar.get("it_per_s") or (1 / bar["s_per_it"] if bar.get("s_per_it") else None)
        if rate:
            fields["rate"] = round(rate, 1)
        if "remaining_s" in bar:
            fields["eta_s"] = bar["remaining_s"]
        elif rate:
            fields["eta_s"] = round((bar["total"] - bar["n"]) / rate, 1)
        whole = bar.get("elapsed_s", 0.0) + fields.get("eta_s", 0.0)
        if self.timeout_s and not self.warned and not finished and whole > self.timeout_s:
            self.warned = True
            fields["warning"] = (
                f"the data stage ({bar['desc']}) takes about {whole:.0f} s, longer than the "
                f"collective timeout ({self.timeout_s:.0f} s): the other ranks would time out "
                "waiting. Raise cluster.collective_timeout_s, pre-tokenise the data, or cache it."
            )
        return fields
