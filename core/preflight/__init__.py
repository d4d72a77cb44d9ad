"""The preflight checklist: everything that would make a run fail in its first minutes,
checked in seconds before a GPU hour is spent. Each check returns pass / warn / fail / skip
with a detail and a fix (`fix_set`: the fix as spec values, where a value is the fix);
`run_checks` yields them one by one so a UI can show them live. A launch is gated on them:
`failures` block it unless overridden, and `gate_record` is what the run keeps of it.
"""

from tunedeck.core.preflight.base import CheckResult, Context
from tunedeck.core.preflight.runner import (
    all_checks,
    failures,
    gate_record,
    make_context,
    ordered,
    run_checks,
    summary,
    summary_line,
)

__all__ = [
    "CheckResult",
    "Context",
    "all_checks",
    "failures",
    "gate_record",
    "make_context",
    "ordered",
    "run_checks",
    "summary",
    "summary_line",
]
