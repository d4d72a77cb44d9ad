"""Finding: one thing tunedeck noticed about a run, with its evidence, cause and fix.

Shared by the log-based rules (core/diagnose/) and the live detectors in the agent
(starvation, stall, straggler). The agent stores findings in run.db's `findings` table
(see core/store/store.py: save_finding / read_findings), one row per `key()`: a finding
refined by later evidence replaces its stored version.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Finding:
    category: str  # e.g. "oom_gpu", "nccl_timeout", "dataloader_starvation"
    severity: str  # error | warning | info
    summary: str  # one line for the runs list / monitor
    cause: str  # what happened and why, in the user's terms
    fix: str  # what to do about it
    rank: int | None = None
    node: int | None = None
    evidence: list[str] = field(default_factory=list)  # the log lines / numbers it rests on
    t: float | None = None  # when it happened (first evidence), unix seconds
    source: str = ""  # file (and line) the evidence came from
    root_cause: bool = True  # False for consequences of an earlier failure
    host: str | None = None  # the host name the log gave (torchrun's table, a prefix)
    # what identifies it within its category when the summary is refined as evidence grows
    # (a count, a share): LossWatch's "grad_zero@1" stays while "(12 steps)" becomes "(40
    # steps)". Empty: the summary identifies it.
    ident: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Finding":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    def key(self) -> tuple:
        """Identity for de-duplication across polls: a refined finding keeps it."""
        return (self.category, self.rank, self.node, self.ident or self.summary)


def finding_key(d: dict[str, Any]) -> tuple:
    """`Finding.key` of a stored finding (its JSON), without building the Finding."""
    return (d.get("category"), d.get("rank"), d.get("node"), d.get("ident") or d.get("summary"))
