"""Which ms-swift is installed, read from package metadata (no import of swift or torch)."""

from __future__ import annotations

import importlib.metadata
import re

# What tunedeck emits when ms-swift is not installed here (an export on a laptop, say).
ASSUMED = "4.6.0"


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("ms-swift")
    except importlib.metadata.PackageNotFoundError:
        return None


def parse(version: str) -> tuple[int, int, int]:
    nums = [int(x) for x in re.findall(r"\d+", version)[:3]]
    return tuple(nums + [0] * (3 - len(nums)))  # type: ignore[return-value]


def tuner_flag(version: str) -> str:
    """4.x renamed --train_type to --tuner_type (4.0.x took both, 4.1 dropped the old name)."""
    return "--tuner_type" if parse(version) >= (4, 0, 0) else "--train_type"
