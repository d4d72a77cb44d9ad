"""Use tunedeck from this checkout where it is not pip-installed (the GPU machine).

tunedeck installs as one package whose parts stay at the repository's top level (core/ ->
tunedeck.core, cli/ -> tunedeck.cli, tui/ -> tunedeck.tui, presets/). Here a folder holding a `tunedeck` package made
of links to those folders goes first on sys.path and on PYTHONPATH, so the agent and the ranks
a benchmark starts import the same code. Python: `import checkout; checkout.use()`. Shell:
`export PYTHONPATH="$(python3 bench/checkout.py)${PYTHONPATH:+:$PYTHONPATH}"`.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def link_dir() -> Path:
    tag = hashlib.sha1(str(REPO).encode()).hexdigest()[:10]
    base = Path(tempfile.gettempdir()) / f"tunedeck-checkout-{tag}"
    pkg = base / "tunedeck"
    pkg.mkdir(parents=True, exist_ok=True)
    for name in ("core", "cli", "tui", "presets"):
        link = pkg / name
        if not link.is_symlink():
            link.symlink_to(REPO / name)
    return base


def use() -> None:
    """Make `import tunedeck` work here and in child processes (no-op when installed)."""
    try:
        import tunedeck.core  # noqa: F401

        return
    except ImportError:
        pass
    base = str(link_dir())
    sys.path.insert(0, base)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [base, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )


if __name__ == "__main__":
    print(link_dir())
