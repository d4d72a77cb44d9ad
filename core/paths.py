"""Where tunedeck keeps its registry and caches.

One registry that every SSH session of the same user finds: the user's data directory unless
TUNEDECK_HOME says otherwise (tests and shared team directories set it).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
PRESETS_DIR = PACKAGE_ROOT / "presets"


def with_package_root(pythonpath: str) -> str:
    """A PYTHONPATH with tunedeck's root first, once, and no empty entries (an empty entry
    means the working directory)."""
    parts = [p for p in pythonpath.split(os.pathsep) if p and p != str(PACKAGE_ROOT)]
    return os.pathsep.join([str(PACKAGE_ROOT), *parts])


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
