"""A backend is one folder (core/backends/<name>/) and one protocol (core/backends/base.py
`Backend`, with the facts kept below the backends in core/backend_traits.py): no code outside
its folder branches on its name. docs/adding-a-backend.md says what a backend provides."""

from __future__ import annotations

import ast
from pathlib import Path

from tunedeck.core.backend_traits import NAMES, TRAITS, Traits
from tunedeck.core.backends import BACKENDS
from tunedeck.core.spec import OPTIONS

REPO = Path(__file__).resolve().parent.parent
WORDS = frozenset(NAMES) | {"builtin", "swift", "script"}

# (file, the line's code) of a branch on a backend's name left outside its folder: none
ALLOWED: set[tuple[str, str]] = set()


def _names(node: ast.AST) -> set[str]:
    """The backend names a literal (or a tuple/list/set of literals) spells."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & WORDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names(e) for e in node.elts)) if node.elts else set()
    return set()


def _is_backend(node: ast.AST) -> bool:
    """An expression that reads a backend's name: `spec.backend`, `backend`, `_backend(x)`,
    `fmt`-like names are not (a format named after a backend is the export's business)."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("backend", "name") and (
            node.attr == "backend" or "backend" in ast.unparse(node.value)
        )
    if isinstance(node, ast.Name):
        return node.id in ("backend", "backend_name")
    if isinstance(node, ast.Call):
        return _is_backend(node.func) or (
            isinstance(node.func, ast.Name) and node.func.id.endswith("backend")
        )
    return False


def branches(path: Path) -> list[tuple[int, str]]:
    """(line, code) of each comparison of a backend value with a backend's name."""
    src = path.read_text()
    lines = src.splitlines()
    out = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if any(_is_backend(s) for s in sides) and any(_names(s) for s in sides):
            out.append((node.lineno, lines[node.lineno - 1].strip()))
    return out


def _files() -> list[Path]:
    own = [REPO / "core" / "backends" / n for n in NAMES]
    files = sorted((REPO / "core").rglob("*.py")) + sorted((REPO / "tui").rglob("*.py"))
    return [f for f in files if not any(f.is_relative_to(d) for d in own)]


def test_nothing_outside_a_backends_folder_branches_on_its_name():
    found, allowed = [], set()
    for f in _files():
        rel = f.relative_to(REPO).as_posix()
        for line, code in branches(f):
            if (rel, code) in ALLOWED:
                allowed.add((rel, code))
            else:
                found.append(f"{rel}:{line}: {code}")
    assert not found, "branches on a backend's name (ask backend_of(spec) / traits_of):\n" + (
        "\n".join(found)
    )
    # an allowed line that is gone comes off the list
    assert allowed == ALLOWED, f"no longer there: {sorted(ALLOWED - allowed)}"


def test_the_check_finds_a_branch(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        'if spec.backend == "swift":\n    pass\n'
        'ok = backend in ("builtin", "script")\n'
        'fine = spec.dist_backend == "nccl"\n'
        'when = {"backend": ("swift",)}\n'
    )
    assert [n for n, _ in branches(f)] == [1, 3]


def test_registry_and_traits_name_the_same_backends():
    assert tuple(BACKENDS) == NAMES == tuple(TRAITS)
    assert OPTIONS["backend"].choices == NAMES
    for name, backend in BACKENDS.items():
        assert backend.name == name
        assert isinstance(backend.traits, Traits) and backend.traits is TRAITS[name]
    for name in NAMES:
        pkg = REPO / "core" / "backends" / name
        assert (pkg / "__init__.py").is_file(), f"core/backends/{name}/ is a package"
