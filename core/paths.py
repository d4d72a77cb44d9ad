"""Where tunedeck keeps its registry and caches.

One registry that every SSH session of the same user finds: the user's data directory unless
TUNEDECK_HOME says otherwise (tests and shared team directories set it).
"""

from __future__ import annotations

import os
from pathlib import Path

# The presets ship beside tunedeck.core: tunedeck/presets in an installed wheel, the top-level
# presets/ folder of an editable checkout (pyproject.toml maps both).
PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"


def home() -> Path:
    env = os.environ.get("TUNEDECK_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "tunedeck"


def runs_root() -> Path:
    return home() / "runs"


def cache_dir() -> Path:
    """Built assets (the demo model) are cached here, shared by every run."""
    env = os.environ.get("TUNEDECK_CACHE")
    if env:
        return Path(env).expanduser()
    if os.environ.get("TUNEDECK_HOME"):
        return home() / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tunedeck"
