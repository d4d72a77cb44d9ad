"""core/ is headless: it never imports textual (nor the tui), checked two ways."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.conftest import REPO


def test_import_linter_contract_holds():
    exe = shutil.which("lint-imports") or str(__import__("pathlib").Path(sys.executable).parent
                                               / "lint-imports")
    proc = subprocess.run([exe], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


def test_cli_and_core_start_without_textual_or_torch():
    code = ("import sys, tui.cli, core.runs.agent, core.runs.watch, core.runs.control;"
            "bad=[m for m in ('textual','torch','transformers') if m in sys.modules];"
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
