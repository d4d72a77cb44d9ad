"""`tunedeck delete` from the command line, on run directories written by the real launch code:
records go, the output folder only when named, a live run and a shared output folder are
refused with nothing deleted."""

from __future__ import annotations

import json

from tests.conftest import cli
from tests.test_manage import make_run


def test_delete_keeps_outputs_unless_named_and_dry_run_touches_nothing(td_home):
    root = td_home / "runs"
    run_dir = make_run(root, "20261202-010000-demo-aaaa", checkpoints=(50, 100))
    out = run_dir / "output"
    assert out.is_dir()
    plan = json.loads(
        cli("delete", "20261202-010000-demo-aaaa", "--dry-run", "--json", home=td_home).stdout
    )
    assert plan["checkpoints"] == 2 and plan["outputs_deletable"]
    assert plan["output_dir"] == str(out.resolve()) and (run_dir / "state.json").exists()

    p = cli("delete", "20261202-010000-demo-aaaa", home=td_home)
    assert "kept its output folder" in p.stdout and "2 complete checkpoints" in p.stdout
    assert not (run_dir / "state.json").exists() and (out / "checkpoint-100").is_dir()
    assert "20261202-010000-demo-aaaa" not in cli("ls", home=td_home).stdout

    other = make_run(root, "20261202-020000-demo-bbbb", checkpoints=(10,))
    wrong = cli(
        "delete", "20261202-020000-demo-bbbb", "--outputs", str(td_home), home=td_home, check=False
    )
    assert wrong.returncode == 1 and "is not the output folder" in wrong.stderr
    assert (other / "state.json").exists()  # nothing deleted
    gone = json.loads(
        cli(
            "delete",
            "20261202-020000-demo-bbbb",
            "--outputs",
            str(other / "output"),
            "--json",
            home=td_home,
        ).stdout
    )
    assert gone["kept"] is None and not other.exists()


def test_delete_refuses_live_runs_and_shared_outputs(tmp_path):
    # not td_home: its teardown stops live runs, and this one's "agent" is the test itself
    td_home = tmp_path / "home"
    root = td_home / "runs"
    live = make_run(root, "20261202-030000-live-cccc", name="live", status="running")
    p = cli("delete", "20261202-030000-live-cccc", home=td_home, check=False)
    assert p.returncode == 1 and "stop it before deleting it" in p.stderr
    assert "Traceback" not in p.stderr and (live / "state.json").exists()

    shared = tmp_path / "shared-out"
    a = make_run(root, "20261202-040000-a-dddd", name="a", output_dir=str(shared), checkpoints=(5,))
    make_run(root, "20261202-050000-b-eeee", name="b", output_dir=str(shared))
    p = cli("delete", "20261202-040000-a-dddd", "--outputs", str(shared), home=td_home, check=False)
    assert p.returncode == 1 and "uses it too" in p.stderr
    assert (a / "state.json").exists() and (shared / "checkpoint-5").is_dir()
