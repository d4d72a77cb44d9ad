"""core/views/manage.py (delete, checkpoints, clone and resume specs) and the incremental
registry (core/views/registry.py), on run directories written by the real launch code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import psutil
import pytest

from tests.conftest import DEMO, REPO
from tunedeck.core.rundir import RunDir
from tunedeck.core.rundir.checkpoints import resume_point
from tunedeck.core.supervisor import launch
from tunedeck.core.views import manage
from tunedeck.core.views.manage import (
    ManageError,
    clone_spec,
    complete_checkpoints,
    delete_run,
    live_reason,
    newest_checkpoint,
    plan_delete,
    resume_spec,
)
from tunedeck.core.views.registry import Registry, list_runs, read_run
from tunedeck.core.spec import load_spec

T0 = 1_764_000_000.0  # a fixed "created" for deterministic runs


def make_run(
    root: Path,
    run_id: str,
    *,
    name: str = "demo",
    status: str = "succeeded",
    created: float = T0,
    step: int = 100,
    max_steps: int = 100,
    loss: float | None = 1.5,
    checkpoints: tuple[int, ...] = (),
    output_dir: str = "",
    **spec_sets,
) -> Path:
    """A run directory written by `prepare_run` (spec.toml, plan.json, launch.sh,
    state.json), then ended as the agent records it; `checkpoints` are complete folders."""
    spec = load_spec(DEMO)
    spec.name, spec.cluster.device = name, "cpu"
    spec.train.max_steps, spec.run.output_dir = max_steps, output_dir
    for key, value in spec_sets.items():
        if key == "backend":
            spec.backend = value
            continue
        section, field_ = key.split("__")
        if section == "env":
            spec.env[field_] = value
        else:
            setattr(getattr(spec, section), field_, value)
    with mock.patch.object(launch, "new_run_id", lambda _name: run_id):
        run_dir = launch.prepare_run(spec, root)
    rd = RunDir(run_dir)
    st = rd.read_state()
    st.update(
        status=status,
        created=created,
        started=created + 5,
        ended=None if status in ("running", "pending") else created + 600,
        exit_code={"succeeded": 0, "failed": 1}.get(status),
    )
    st["progress"].update(step=step, max_steps=max_steps, loss=loss)
    if status == "running":  # a live agent: this test process, as the agent records itself
        me = psutil.Process()
        st.update(agent_pid=me.pid, agent_create_time=me.create_time())
    rd.write_state(st)
    out = rd.output_dir(load_spec(rd.spec))
    for n in checkpoints:
        write_checkpoint(out, n)
    return run_dir


def write_checkpoint(out: Path, step: int, complete: bool = True) -> Path:
    ck = out / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    (ck / "adapter_model.safetensors").write_bytes(b"w" * 64)
    if complete:
        (ck / "trainer_state.json").write_text(json.dumps({"step": step}))
    return ck


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "runs"


# -- checkpoints -------------------------------------------------------------------------


def test_newest_complete_checkpoint_skips_partial_and_hidden_folders(tmp_path):
    out = tmp_path / "out"
    write_checkpoint(out, 50)
    write_checkpoint(out, 100)
    write_checkpoint(out, 150, complete=False)  # rank 0 died mid-save
    hidden = write_checkpoint(out, 200)
    hidden.rename(out / ".checkpoint-200.tmp-123")  # the trainer's temp folder
    (out / "checkpoint-x").mkdir()
    assert [c.step for c in complete_checkpoints(out)] == [50, 100]
    assert newest_checkpoint(out).path == out / "checkpoint-100"
    assert newest_checkpoint(tmp_path / "missing") is None


def test_swift_version_folders_are_searched(tmp_path):
    out = tmp_path / "out"
    write_checkpoint(out / "v0-20250101-120000", 10)
    write_checkpoint(out / "v1-20250102-120000", 30)
    write_checkpoint(out / "v1-20250102-120000" / "deeper", 99)  # not a checkpoint's place
    assert [c.step for c in complete_checkpoints(out)] == [10, 30]
    assert newest_checkpoint(out).path == out / "v1-20250102-120000" / "checkpoint-30"


def test_a_restart_continues_from_the_last_checkpoint_written(tmp_path):
    """attempt > 0: the latest write in the run's own folder (not the highest step: an older
    run's checkpoint-500 left there, or a history resumed from an older step, must not win);
    the first attempt: train.resume_from ("auto" = highest step)."""
    out = tmp_path / "out"
    old = write_checkpoint(out / "v0-20250101-120000", 500)  # an earlier run's
    os.utime(old / "trainer_state.json", (1e9, 1e9))
    mine = write_checkpoint(out / "v1-20250102-120000", 40)
    given = write_checkpoint(tmp_path / "elsewhere", 7)
    assert resume_point("", out, 1) == mine
    assert resume_point(str(given), out, 2) == mine
    assert resume_point("", out, 0) is None
    assert resume_point(str(given), out, 0) == given
    assert resume_point("auto", out, 0) == old
    assert resume_point("", out, 1, nested=False) is None  # the built-in trainer's layout
    assert resume_point(str(given), out, 1, nested=False) == given
    assert resume_point("auto", tmp_path / "missing", 3) is None


def test_a_restart_command_names_its_checkpoint_once():
    from tunedeck.core.backends.base import Restart

    r = Restart(Path("/o/v1/checkpoint-40"), "from checkpoint-40", "--resume_from_checkpoint")
    argv = [
        "python",
        "-m",
        "swift.cli.sft",
        "--resume_from_checkpoint",
        "/o/checkpoint-2",
        "--lr",
        "1",
        "--resume_from_checkpoint=/x",
        "--output_dir",
        "/o",
    ]
    assert r.argv(argv) == [
        "python",
        "-m",
        "swift.cli.sft",
        "--lr",
        "1",
        "--output_dir",
        "/o",
        "--resume_from_checkpoint",
        "/o/v1/checkpoint-40",
    ]
    assert Restart.at(None, "--resume_from_checkpoint").argv(argv) == argv  # step 0
    assert Restart.at(Path("/o/checkpoint-3")).argv(argv) == argv  # the trainer looks itself


# -- resume ------------------------------------------------------------------------------


def test_a_spec_cut_short_is_neither_cloned_nor_resumed(root):
    """Valid TOML all the same ("lora_rank = 1" of 16): its lost keys would be defaults."""
    run_dir = make_run(
        root, "r-cut", status="stopped", step=120, max_steps=300, checkpoints=(50, 100)
    )
    spec = run_dir / "spec.toml"
    text = spec.read_text()
    spec.write_text(text[: text.index("[env]")])  # whole lines, [env] and beyond gone
    for made in (clone_spec, resume_spec):
        with pytest.raises(ManageError, match="damaged .*no \\[env\\] table"):
            made(read_run(run_dir))
    spec.write_text(text)
    assert clone_spec(read_run(run_dir)).spec.name


def test_resume_spec_continues_from_the_newest_complete_checkpoint(root):
    run_dir = make_run(
        root, "r-stopped", status="stopped", step=120, max_steps=300, checkpoints=(50, 100)
    )
    write_checkpoint(run_dir / "output", 150, complete=False)
    run = read_run(run_dir)
    frozen = load_spec(run_dir / "spec.toml")
    made = resume_spec(run)
    assert made.spec.train.resume_from == str(run_dir / "output" / "checkpoint-100")
    assert made.checkpoint.step == 100
    assert made.spec.run.output_dir == str(run_dir / "output")
    # the rest is the frozen spec; a single-node port is picked again at launch
    assert made.spec.cluster.master_port == 0 and frozen.cluster.master_port != 0
    made.spec.train.resume_from = frozen.train.resume_from
    made.spec.cluster.master_port = frozen.cluster.master_port
    assert made.spec == frozen


def test_a_script_run_is_resumed_through_its_variable(root):
    """A resumed script run is told TUNEDECK_RESUME_FROM (the same variable a restart sets),
    and the notes say the script must read it; a clone starts from step 0 without it."""
    from tunedeck.core.backends import plan_run

    script = REPO / "tests" / "scripts" / "hf_trainer_script.py"
    run_dir = make_run(
        root,
        "s-1",
        status="failed",
        step=7,
        checkpoints=(4,),
        backend="script",
        script__path=str(script),
    )
    made = resume_spec(read_run(run_dir))
    ck = str(run_dir / "output" / "checkpoint-4")
    assert any("TUNEDECK_RESUME_FROM" in n and "reads it" in n for n in made.notes)
    env = plan_run(made.spec, RunDir(root / "next"))[1].nodes[0].env
    assert env["TUNEDECK_RESUME_FROM"] == ck
    fresh = plan_run(clone_spec(read_run(run_dir)).spec, RunDir(root / "clone"))[1]
    assert "TUNEDECK_RESUME_FROM" not in fresh.nodes[0].env


def test_resume_refuses_without_a_checkpoint_and_for_other_statuses(root):
    failed = read_run(make_run(root, "r-failed", status="failed", step=7))
    with pytest.raises(ManageError, match="no complete checkpoint"):
        resume_spec(failed)
    done = read_run(make_run(root, "r-done", checkpoints=(100,)))
    with pytest.raises(ManageError, match="finished all its steps"):
        resume_spec(done)
    live = read_run(make_run(root, "r-live", status="running", checkpoints=(10,)))
    assert live.status == "running"
    with pytest.raises(ManageError, match="still running"):
        resume_spec(live)


def test_resume_notes_a_checkpoint_already_at_max_steps(root):
    run = read_run(make_run(root, "r-end", status="failed", checkpoints=(100,)))
    made = resume_spec(run)
    assert any("max_steps" in n for n in made.notes)


def _record_end(run_dir: Path, agent: subprocess.Popen) -> None:
    """state.json as an agent leaves it when a graceful stop ends the run: stopped, with the
    agent's own pid (`agent` stands for it: a real process, alive or not)."""
    rd = RunDir(run_dir)
    st = rd.read_state()
    st.update(
        status="stopped",
        ended=time.time(),
        message="stopped (graceful)",
        worker_pids=[],
        agent_pid=agent.pid,
        agent_create_time=agent.create_time,
    )
    rd.write_state(st)


def _agent(seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    proc.create_time = psutil.Process(proc.pid).create_time()
    return proc


def test_resume_and_clone_judge_the_run_as_it_is_now(root):
    """A viewer's RunInfo is its last look: the runs list read the run while it ran, the stop
    was recorded since. R pressed then resumes it (not "is running")."""
    run_dir = make_run(root, "r-now", status="running", step=5, checkpoints=(5,))
    seen = read_run(run_dir)
    assert seen.status == "running"
    with pytest.raises(ManageError, match="is running"):
        resume_spec(seen)  # still running on disk: refused
    agent = _agent(0)
    agent.wait()
    _record_end(run_dir, agent)
    made = resume_spec(seen)  # the same, now old, RunInfo
    assert made.spec.train.resume_from == str(run_dir / "output" / "checkpoint-5")
    assert clone_spec(seen).spec.train.resume_from == ""


def test_resume_waits_for_the_agent_that_recorded_the_end_to_exit(root, monkeypatch):
    """The agent writes the run's end, then exits (closing run.db and its trackers): on a
    loaded machine it is still alive for a moment. Resuming then waits for that exit instead
    of refusing; an agent that stays is refused, with what was waited for."""
    run_dir = make_run(root, "r-exit", status="running", step=5, checkpoints=(5,))
    agent = _agent(1.0)
    try:
        _record_end(run_dir, agent)
        t0 = time.monotonic()
        made = resume_spec(read_run(run_dir))
        assert agent.poll() is not None and time.monotonic() - t0 < manage.ENDING_S
        assert made.checkpoint.step == 5
    finally:
        agent.kill()
        agent.wait()
    monkeypatch.setattr(manage, "ENDING_S", 0.5)
    stays = _agent(60)
    try:
        _record_end(run_dir, stays)
        t0 = time.monotonic()
        with pytest.raises(
            ManageError, match=r"agent .* still alive 0.5s after its end was recorded"
        ):
            resume_spec(read_run(run_dir))
        assert time.monotonic() - t0 >= 0.5
    finally:
        stays.kill()
        stays.wait()


# -- clone -------------------------------------------------------------------------------


def test_clone_gets_its_own_output_folder_and_starts_fresh(root, tmp_path):
    run_dir = make_run(root, "c-1", train__resume_from="auto")
    made = clone_spec(read_run(run_dir))
    frozen = load_spec(run_dir / "spec.toml")
    assert frozen.run.output_dir == str(run_dir / "output")  # plan_run froze it
    assert made.spec.run.output_dir == "" and made.spec.train.resume_from == ""
    assert any("resume_from" in n for n in made.notes)
    assert made.spec.model == frozen.model and made.spec.train.max_steps == 100
    assert made.spec.name == "demo"

    shared = tmp_path / "shared-out"
    made = clone_spec(read_run(make_run(root, "c-2", output_dir=str(shared))))
    assert made.spec.run.output_dir == str(shared)  # the user's choice stays, with a note
    assert any(str(shared) in n for n in made.notes)


def test_clone_and_resume_get_the_real_secrets_not_the_masked_ones(root):
    """spec.toml holds secrets as ****; a clone or a resume must launch with the real ones."""
    run_dir = make_run(
        root, "s-1", status="stopped", checkpoints=(50,), env__HF_TOKEN="hf_real_value"
    )
    assert "hf_real_value" not in (run_dir / "spec.toml").read_text()
    assert clone_spec(read_run(run_dir)).spec.env["HF_TOKEN"] == "hf_real_value"
    assert resume_spec(read_run(run_dir)).spec.env["HF_TOKEN"] == "hf_real_value"


# -- delete ------------------------------------------------------------------------------


def test_delete_removes_records_and_keeps_the_output_folder(root):
    run_dir = make_run(root, "d-1", status="stopped", checkpoints=(50,))
    make_run(root, "d-other")
    run = read_run(run_dir)
    plan = plan_delete(run, root)
    assert plan.output_dir == (run_dir / "output").resolve() and plan.checkpoints == 1
    assert plan.outputs_deletable
    names = {p.name for p in plan.records}
    assert {"spec.toml", "plan.json", "launch.sh", "state.json", "logs", "events"} <= names
    assert "output" not in names
    result = delete_run(run, root=root)
    assert sorted(p.name for p in run_dir.iterdir()) == ["output"]
    assert (run_dir / "output" / "checkpoint-50" / "trainer_state.json").exists()
    assert result.kept == (run_dir / "output").resolve()
    assert [r.run_id for r in list_runs(root)] == ["d-other"]


def test_delete_outputs_only_when_that_folder_is_named(root, tmp_path):
    run_dir = make_run(root, "d-2", status="failed", checkpoints=(10, 20))
    run = read_run(run_dir)
    with pytest.raises(ManageError, match="not the output folder"):
        delete_run(run, outputs=tmp_path, root=root)
    assert (run_dir / "state.json").exists()  # refused before anything went
    delete_run(run, outputs=run_dir / "output", root=root)
    assert not run_dir.exists()


def test_delete_with_an_output_folder_outside_the_run(root, tmp_path):
    out = tmp_path / "ckpts"
    run_dir = make_run(root, "d-3", output_dir=str(out), checkpoints=(5,))
    delete_run(read_run(run_dir), root=root)
    assert not run_dir.exists() and (out / "checkpoint-5" / "trainer_state.json").exists()


def test_delete_refuses_a_live_run(root, monkeypatch):
    run_dir = make_run(root, "d-live", status="running")
    run = read_run(run_dir)
    assert live_reason(run)
    with pytest.raises(ManageError, match="stop it"):
        plan_delete(run, root)
    with pytest.raises(ManageError):
        delete_run(run, root=root)
    assert (run_dir / "state.json").exists()
    # ended as recorded, but its agent (this process) stays alive: refused once the wait
    # for its exit is over
    monkeypatch.setattr(manage, "ENDING_S", 0.3)
    st = RunDir(run_dir).read_state()
    st["status"] = "stopped"
    RunDir(run_dir).write_state(st)
    with pytest.raises(ManageError, match="agent .* after its end was recorded"):
        delete_run(read_run(run_dir), root=root)


def test_delete_never_takes_outputs_another_run_writes_to(root):
    src = make_run(root, "d-src", status="stopped", checkpoints=(40,))
    # a resume of it: same output folder
    make_run(root, "d-resumed", status="stopped", output_dir=str(src / "output"))
    run = read_run(src)
    plan = plan_delete(run, root)
    assert not plan.outputs_deletable and "d-resumed" in plan.outputs_kept_because
    with pytest.raises(ManageError, match="d-resumed"):
        delete_run(run, outputs=src / "output", root=root)
    assert (src / "state.json").exists()


def test_delete_never_takes_a_folder_holding_the_registry(root, tmp_path):
    run_dir = make_run(root, "d-wide", status="failed", output_dir=str(tmp_path))
    plan = plan_delete(read_run(run_dir), root)
    assert not plan.outputs_deletable and "runs root" in plan.outputs_kept_because


# -- the incremental registry -----------------------------------------------------------


def _age_files(root: Path, runs: list[str] | None = None) -> None:
    """The root and runs' state.json (all by default) a minute old, past the racy window, as
    files are on an idle machine."""
    t = time.time() - 60
    names = runs if runs is not None else [d.name for d in root.iterdir()]
    for p in [root, *(root / n / "state.json" for n in names)]:
        if p.exists():
            os.utime(p, (t, t))


def test_registry_reads_nothing_again_for_unchanged_finished_runs(root):
    for i in range(6):
        make_run(root, f"g-{i}", created=T0 + i, status=("succeeded", "failed", "stopped")[i % 3])
    (root / "not-a-run").mkdir()
    _age_files(root)
    reg = Registry(root)
    first = reg.scan()
    assert (reg.reads, reg.listings) == (6, 1)
    gen = reg.generation
    for _ in range(3):
        again = reg.scan()
    assert (reg.reads, reg.listings) == (6, 1), "unchanged runs were read again"
    assert again is first and reg.generation == gen

    # one run's state changes: only that one is read (within the scans that take turns over
    # finished runs), and its object is new
    rd = RunDir(root / "g-2")
    st = rd.read_state()
    st["name"] = "renamed"
    rd.write_state(st)
    old = time.time() - 60  # past the racy window, as a finished run's file soon is
    os.utime(rd.state, (old, old))
    for _ in range(reg.finished_every):
        runs = reg.scan()
    assert reg.reads == 7 and reg.listings == 1 and reg.generation == gen + 1
    assert next(r for r in runs if r.run_id == "g-2").name == "renamed"
    assert all(a is b for a, b in zip(runs, first) if a.run_id != "g-2")

    # a new run: the root is listed again, the new one read; a deleted one vanishes
    make_run(root, "g-new", created=T0 + 100)
    delete_run(read_run(root / "g-0"), root=root)
    _age_files(root, ["g-new"])
    reads = reg.reads
    runs = reg.scan()
    assert reg.listings == 2 and reg.reads - reads <= 2  # g-new (+ g-2 while racy)
    assert [r.run_id for r in runs][0] == "g-new" and "g-0" not in {r.run_id for r in runs}


def test_registry_stats_finished_runs_in_turns_and_live_ones_every_time(root):
    for i in range(20):
        make_run(root, f"t-{i:02d}", created=T0 + i)
    make_run(root, "t-live", status="running", created=T0 + 100)
    _age_files(root)
    reg = Registry(root, finished_every=10)
    reg.scan()
    real_stat = os.stat
    seen: list[str] = []
    with mock.patch(
        "os.stat", side_effect=lambda p, *a, **k: (seen.append(str(p)), real_stat(p, *a, **k))[1]
    ):
        for _ in range(10):
            reg.scan()
        per_run = {d.name: sum(f"/{d.name}/" in p for p in seen) for d in root.iterdir()}
        assert per_run.pop("t-live") == 10 and set(per_run.values()) == {1}
        seen.clear()
        reg.scan(full=True)
        assert sum("state.json" in p for p in seen) == 21
    assert reg.reads == 21


def test_registry_gives_list_runs_results(root):
    for i in range(4):
        make_run(root, f"h-{i}", created=T0 + 10 * i, status="failed" if i % 2 else "succeeded")
    naive = sorted(
        (r for d in root.iterdir() if (r := read_run(d))), key=lambda r: r.created, reverse=True
    )
    assert [r.to_json() for r in Registry(root).scan()] == [r.to_json() for r in naive]
    assert [r.to_json() for r in list_runs(root)] == [r.to_json() for r in naive]
    assert list_runs(root / "absent") == []


def test_registry_notices_an_agent_that_died_without_a_write(root):
    run_dir = make_run(root, "a-1", status="running")
    _age_files(root)
    reg = Registry(root)
    assert reg.scan()[0].status == "running"
    reads = reg.reads
    # the agent pid now names a process that is gone: no write to state.json happens
    st = RunDir(run_dir).read_state()
    with mock.patch("tunedeck.core.views.registry.pid_alive", return_value=False):
        run = reg.scan()[0]
    assert run.status == "failed" and "agent is gone" in run.message
    assert reg.reads == reads and st["status"] == "running"
