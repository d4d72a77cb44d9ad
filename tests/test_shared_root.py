"""A runs folder others can write into must be sticky: otherwise a run folder can be swapped
between the ownership check and its use. tunedeck says so, naming the fix."""

from __future__ import annotations

import os

import pytest

from tests.conftest import cli
from tunedeck.core.rundir.ownership import root_problem


@pytest.mark.parametrize(
    "mode, unsafe",
    [
        (0o700, False),  # a private home
        (0o755, False),
        (0o1777, False),  # shared as /tmp is
        (0o3775, False),  # shared with a group, sticky
        (0o777, True),
        (0o2775, True),  # group-writable, setgid but not sticky
        (0o775, True),
    ],
)
def test_a_runs_folder_others_can_write_needs_the_sticky_bit(tmp_path, mode, unsafe):
    root = tmp_path / "runs"
    root.mkdir()
    os.chmod(root, mode)
    why = root_problem(root)
    assert bool(why) == unsafe
    if unsafe:
        assert str(root) in why and f"chmod +t {root}" in why and f"{mode:04o}" in why


def test_a_missing_runs_folder_is_not_a_problem(tmp_path):
    assert root_problem(tmp_path / "absent") == ""


def test_ls_warns_about_a_shared_runs_folder_without_the_sticky_bit(td_home):
    root = td_home / "runs"
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o777)
    p = cli("ls", home=td_home)
    assert f"chmod +t {root}" in p.stderr
    os.chmod(root, 0o1777)
    p = cli("ls", "--json", home=td_home)
    assert "chmod" not in p.stderr and p.stdout.strip() == "[]"
