"""core/ is headless: it never imports textual (nor the tui), checked two ways."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.conftest import REPO


def test_import_linter_contract_holds():
    exe = shutil.which("lint-imports") or str(
        __import__("pathlib").Path(sys.executable).parent / "lint-imports"
    )
    proc = subprocess.run([exe], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 kept, 0 broken" in proc.stdout


def test_cli_and_core_start_without_textual_or_torch():
    code = (
        "import sys, tunedeck.cli.main, tunedeck.core.supervisor.agent, tunedeck.core.views.watch, tunedeck.core.supervisor.control;"
        "bad=[m for m in ('textual','torch','transformers') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_module_imports_the_source_folders_by_their_own_names():
    """Only `tunedeck.core` / `tunedeck.tui` exist once installed: an import of a bare `core`
    or `tui` works only from a checkout (and loads a second copy of every module)."""
    import ast

    bad = []
    for folder in ("core", "cli", "tui", "tests", "bench"):
        for path in (REPO / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                bad += [
                    f"{path.relative_to(REPO)}:{node.lineno}: {n}"
                    for n in names
                    if n.split(".")[0] in ("core", "cli", "tui")
                ]
    assert not bad, "\n".join(bad)
