"""One live writer per output folder (core/supervisor/launch.py): a launch refuses a folder that a
live run of the home writes (the same folder or one inside the other, ms-swift's own
--output_dir included) unless told to share it, checked under the launch lock; a clone of a
live run is refused (core/views/manage.py). Run directories are written by the real launch code
(tests/test_manage.py `make_run`); the command-line scenarios are in
tests/test_output_writer_cli.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import DEMO
from tests.test_manage import make_run
from tunedeck.core.rundir import RunDir
from tunedeck.core.supervisor import launch
from tunedeck.core.views.manage import ManageError, clone_spec
from tunedeck.core.views.registry import read_run
from tunedeck.core.spec import load_spec


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "runs"


def demo_spec(output_dir: str = "", name: str = "next"):
    spec = load_spec(DEMO, ['cluster.device="cpu"'])
    spec.name, spec.run.output_dir = name, output_dir
    return spec


def runs_in(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if (p / "state.json").exists()}


def test_a_live_runs_folder_is_refused_the_same_inside_or_around_it(root, tmp_path):
    out = tmp_path / "out"
    make_run(root, "live-1", name="first", status="running", output_dir=str(out))
    before = runs_in(root)
    for mine, how in (
        (out, "writes it"),
        (out / "v0-20250101-120000", "lies inside"),
        (tmp_path, "holds"),
        # the same folder through a symlink and a relative path: real paths
        (tmp_path / "link", "writes it"),
        ("../../out", "writes it"),
    ):
        if mine == tmp_path / "link":
            mine.symlink_to(out)
        with pytest.raises(launch.OutputShared) as e:
            launch.prepare_run(demo_spec(str(mine)), root)
        said = str(e.value)
        assert "live run live-1 (first, running)" in said and how in said, said
        assert str(out) in said and "--share-output" in said
        assert [r.run_id for r, _ in e.value.users] == ["live-1"]
    assert runs_in(root) == before  # nothing written

    # asked to share: launched, and state.json says with whom
    run_dir = launch.prepare_run(demo_spec(str(out)), root, share_output=True)
    assert RunDir(run_dir).read_state()["output_shared_with"] == ["live-1"]
    assert launch.shared_with(run_dir) == ["live-1"]
    # a folder of its own: no record at all
    own = launch.prepare_run(demo_spec(), root)
    assert RunDir(own).read_state().get("output_shared_with") is None
    assert launch.shared_with(own) is None


def test_only_runs_that_can_still_write_count(root, tmp_path):
    """Ended runs, a damaged state.json and a launch abandoned before its agent started do
    not hold a folder; a pending run (being launched, or queued in Slurm) does."""
    out = tmp_path / "out"
    for i, status in enumerate(("succeeded", "failed", "stopped")):
        make_run(root, f"ended-{i}", status=status, output_dir=str(out))
    damaged = make_run(root, "damaged", status="running", output_dir=str(out))
    (damaged / "state.json").write_text("{not json")
    abandoned = make_run(root, "abandoned", status="pending", output_dir=str(out))
    st = json.loads((abandoned / "state.json").read_text())
    st["created"] = time.time() - launch.ABANDONED_S - 60
    RunDir(abandoned).write_state(st)
    assert launch.output_users(Path(out), root) == []
    launch.prepare_run(demo_spec(str(out)), root)  # allowed

    # the run just launched is pending: it holds the folder now
    with pytest.raises(launch.OutputShared, match="pending"):
        launch.prepare_run(demo_spec(str(out)), root)
    queued = make_run(root, "queued", status="pending", output_dir=str(tmp_path / "q"))
    st = json.loads((queued / "state.json").read_text())
    st.update(created=time.time() - 3600, slurm_job="1234")
    RunDir(queued).write_state(st)
    with pytest.raises(launch.OutputShared, match="queued"):
        launch.prepare_run(demo_spec(str(tmp_path / "q")), root)


def test_an_ms_swift_runs_own_output_dir_flag_counts(root, tmp_path):
    """ms-swift writes where swift.extra_args' --output_dir says (over tunedeck's folder), into
    v<N>-<date>/ below it: the whole folder is that run's."""
    theirs = tmp_path / "swift-out"
    run_dir = root / "swift-live"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.toml").write_text(
        'name = "sft"\nbackend = "swift"\n[run]\noutput_dir = "/somewhere/else"\n'
        f'[swift]\nextra_args = ["--lora_rank", "8", "--output_dir={theirs}"]\n'
    )
    me = psutil.Process()
    RunDir(run_dir).write_state(
        {
            "run_id": "swift-live",
            "name": "sft",
            "status": "running",
            "created": time.time(),
            "agent_pid": me.pid,
            "agent_create_time": me.create_time(),
        }
    )
    assert launch.run_written_folder(RunDir(run_dir)) == theirs.resolve()
    with pytest.raises(launch.OutputShared, match="swift-live"):
        launch.prepare_run(demo_spec(str(theirs / "v1-20250102-120000")), root)
    launch.prepare_run(demo_spec("/somewhere/else"), root)  # not what it writes


def test_launches_at_the_same_moment_do_not_both_pass(root, tmp_path):
    """Four threads launch into one folder at once: the lock makes one of them first and the
    others see its run (a thread of the same process takes the lock like another process)."""
    out = str(tmp_path / "out")
    specs = [demo_spec(out, name=f"t{i}") for i in range(4)]
    go, made, refused = threading.Barrier(4), [], []

    def one(spec):
        go.wait()
        try:
            made.append(launch.prepare_run(spec, root))
        except launch.OutputShared as e:
            refused.append(e)

    threads = [threading.Thread(target=one, args=(s,)) for s in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(made) == 1 and len(refused) == 3, (made, refused)
    assert all(made[0].name in str(e) for e in refused)
    assert launch.lock_path(root) == root.parent / "runs.launch.lock"
    assert launch.lock_path(root).is_file()
    assert runs_in(root) == {p.name for p in root.iterdir()}  # only runs in the root


def test_the_lock_is_reentrant_in_a_thread_and_exclusive_across_processes(root):
    import subprocess
    import sys

    code = (
        "import sys; from pathlib import Path; from tunedeck.core.supervisor import launch\n"
        "try:\n"
        "    with launch.launch_lock(Path(sys.argv[1]), wait_s=0.3): print('got it')\n"
        "except launch.LaunchError as e: print('refused:', e)\n"
    )
    with launch.launch_lock(root):
        with launch.launch_lock(root):  # launch → prepare_run: the same thread again
            pass
        other = subprocess.run(
            [sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=60
        )
        assert "refused: another launch has held" in other.stdout, other
    other = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=60
    )
    assert other.stdout.strip() == "got it", other


def test_a_live_run_is_not_cloned(root):
    live = read_run(make_run(root, "c-live", status="running"))
    with pytest.raises(ManageError, match="c-live is running: a clone copies an ended run"):
        clone_spec(live)
    ended = read_run(make_run(root, "c-ended", status="stopped"))
    assert clone_spec(ended).spec.run.output_dir == ""
