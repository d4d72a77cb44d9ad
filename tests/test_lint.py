"""The tree is formatted and linted by ruff as pyproject.toml configures it (CI runs this)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TREE = ["core", "tui", "tests", "bench"]


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (it comes with the test extra)")
    return [exe]


def test_ruff_lint_is_clean():
    r = subprocess.run(
        [*_ruff(), "check", "--no-cache", "--output-format", "concise", *TREE],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format_leaves_the_tree_as_it_is():
    r = subprocess.run(
        [*_ruff(), "format", "--no-cache", "--check", *TREE],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
