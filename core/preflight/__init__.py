"""The preflight checklist: everything that would make a run fail in its first minutes,
checked in seconds before a GPU hour is spent. Each check returns pass / warn / fail / skip
with a detail and a fix; `run_checks` yields them one by one so a UI can show them live.
"""

from tunedeck.core.preflight.base import CheckResult, Context
from tunedeck.core.preflight.runner import all_checks, make_context, run_checks, summary, \
    summary_line

__all__ = ["CheckResult", "Context", "all_checks", "make_context", "run_checks", "summary",
           "summary_line"]
