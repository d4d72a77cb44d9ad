"""Another user's run directory is never acted on (core/rundir/ownership.py).

In a shared TUNEDECK_HOME (runs/ 1777) a second local user can make a folder under runs/ whose
state.json says `running` with a dead agent and whose plan.json holds any argv. Before the
ownership rule, the next `tunedeck ls` of any other user adopted it (a new agent ran that argv
as the reader: root ran `id > file` planted by `nobody`), `tunedeck stop` signalled the pids it
named and `tunedeck stacks` sent them SIGUSR1.

The planting tests use a real second user: as root, `setpriv` to uid/gid 65534 (nobody) copies
the run into a shared home made under a fresh /tmp folder nobody can reach; then the real CLI
and the registry the TUI uses run as root. They skip when not root or without setpriv. The rule
itself is checked on files made here (a group-writable file, a symlinked state.json, a FIFO, a
folder chowned to another uid). The last tests are the stop issued while a launch is still
starting its agent: it must not be told as a run whose agent was gone.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.conftest import DEMO, REPO, cli, cli_json, wait_for
from tunedeck.core.rundir import ownership
from tunedeck.core.supervisor import adopt, control, procs, stacks
from tunedeck.core.views.registry import FOREIGN, Registry, find_run, read_run

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
DATA = REPO / "presets" / "data" / "demo_chat.jsonl"
WATCH_S = 8.0  # how long a planted plan is given to run (an adoption starts it in ~2 s)


def _need_second_user() -> None:
    if os.geteuid() != 0:
        pytest.skip("planting a run as another user needs root (setpriv to uid 65534)")
    if SETPRIV is None:
        pytest.skip("setpriv (util-linux) is not installed")


def as_nobody(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        **kw,
    )


@dataclass
class Shared:
    base: Path  # root's 0755 folder under /tmp: markers go here
    home: Path  # the shared TUNEDECK_HOME, 1777 like its runs/
    sleepers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def runs(self) -> Path:
        return self.home / "runs"

    def sleeper(self) -> subprocess.Popen:
        """A live process of this user's (the one a planted state.json names), in a session
        of its own: a stop that wrongly killed its process group must not take pytest along
        (before the rule, a planted run's stop did exactly that)."""
        p = subprocess.Popen(["sleep", "600"], start_new_session=True)
        self.sleepers.append(p)
        return p


@pytest.fixture
def shared(model_cache, monkeypatch):
    _need_second_user()
    # /tmp (1777) → base (0755) → home (1777): nobody can reach it; tmp_path's parents are 0700
    base = Path(tempfile.mkdtemp(prefix="td-foreign-", dir="/tmp"))
    os.chmod(base, 0o755)
    home = base / "home"
    (home / "runs").mkdir(parents=True)
    os.chmod(home, 0o1777)
    os.chmod(home / "runs", 0o1777)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.delenv("TUNEDECK_NO_ADOPT", raising=False)
    probe = as_nobody("/bin/sh", "-c", f'test -w "{home / "runs"}"')
    if probe.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"user nobody cannot write {home / 'runs'}: {probe.stderr.strip()}")
    s = Shared(base, home)
    try:
        yield s
    finally:
        for p in s.sleepers:
            p.kill()
            p.wait()
        shutil.rmtree(base, ignore_errors=True)


def dead_pid_identity() -> tuple[int, dict]:
    """A pid that has ended, with the identity it had (an agent that died)."""
    p = subprocess.Popen(["sleep", "30"])
    ident = procs.identity(p.pid)
    p.kill()
    p.wait()
    assert ident is not None
    return p.pid, ident


def planted_state(run_id: str, **extra) -> dict:
    now = time.time()
    agent, ident = dead_pid_identity()
    st = {
        "run_id": run_id,
        "name": "planted",
        "status": "running",
        "message": "",
        "created": now - 120,
        "started": now - 110,
        "ended": None,
        "agent_pid": agent,
        "agent_pgid": agent,
        "agent_create_time": now - 120,
        "torchrun_pid": None,
        "worker_pids": [],
        "pgids": [],
        "pid_identity": {str(agent): ident},
        "launches": [],
        "host": os.uname().nodename,
        "master_port": 29511,
        "attempt": 0,
        "exit_code": None,
        "stop_requested": None,
        "progress": {
            "step": 42,
            "max_steps": 200,
            "loss": 2.5,
            "lr": 0.001,
            "tokens_per_s": 1234.0,
            "t": now - 1,
        },
    }
    st.update(extra)
    return st


def plant(
    s: Shared, run_id: str, state: dict, argv: list[str], extra: dict[str, str] | None = None
) -> Path:
    """runs/<run_id>/ made by user nobody like a real run: state.json, plan.json (node 0 runs
    `argv`), spec.toml (presets/demo.toml as a launch freezes it: the data path absolute),
    logs/agent.log and events/."""
    stage = s.base / "stage" / run_id
    stage.mkdir(parents=True)
    run_dir = s.runs / run_id
    spec = DEMO.read_text().replace('path = "data/demo_chat.jsonl"', f'path = "{DATA}"')
    assert str(DATA) in spec
    plan = {
        "nodes": [{"node_rank": 0, "argv": argv, "env": {}, "cwd": str(run_dir)}],
        "nproc_per_node": 1,
        "nnodes": 1,
        "world_size": 1,
    }
    files = {
        "state.json": json.dumps(state),
        "plan.json": json.dumps(plan),
        "spec.toml": spec,
        "logs/agent.log": "",
        "events/rank0.jsonl": "",
        **(extra or {}),
    }
    for name, text in files.items():
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        (stage / name).write_text(text)
    for p in [stage.parent, stage, *stage.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    r = as_nobody("/bin/cp", "-r", str(stage), str(run_dir))
    assert r.returncode == 0, r.stderr
    assert os.lstat(run_dir).st_uid == NOBODY
    return run_dir


def agents_on(run_dir: Path) -> list[int]:
    """Agent processes started on `run_dir` (an adoption)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info.get("cmdline") or []
        if "tunedeck.core.supervisor.agent" in cmd and str(run_dir) in cmd:
            found.append(p.pid)
    return found


def tree(run_dir: Path) -> dict[str, tuple]:
    """Every entry of the folder with what a write would change."""
    out = {}
    for p in [run_dir, *run_dir.rglob("*")]:
        st = os.lstat(p)
        out[str(p.relative_to(run_dir))] = (st.st_mtime_ns, st.st_size, st.st_ino)
    return out


# -- the rule ---------------------------------------------------------------------------------


def own_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True, mode=0o700)
    for name in ("state.json", "plan.json", "spec.toml"):
        (run / name).write_text("{}")
        os.chmod(run / name, 0o600)
    return run


def test_the_users_own_run_passes(tmp_path):
    run = own_run(tmp_path)
    os.chmod(run, 0o755)  # readable by others is fine: only writing matters
    os.chmod(run / "plan.json", 0o644)
    assert ownership.problem(run) is None
    ownership.check(run)


def test_a_file_others_can_write_fails(tmp_path):
    run = own_run(tmp_path)
    os.chmod(run / "plan.json", 0o660)
    assert ownership.problem(run) == "plan.json is writable by its group"
    os.chmod(run / "plan.json", 0o602)
    assert ownership.problem(run) == "plan.json is writable by others"
    os.chmod(run / "plan.json", 0o600)
    os.chmod(run, 0o777)
    assert ownership.problem(run) == "the run folder is writable by others"
    # only the files the caller reads count
    os.chmod(run, 0o700)
    os.chmod(run / "plan.json", 0o666)
    assert ownership.problem(run, files=("state.json",)) is None


def test_a_symlink_never_passes(tmp_path):
    run = own_run(tmp_path)
    victim = tmp_path / "victims-own-file.json"  # the user's own file, linked by another
    victim.write_text("{}")
    os.chmod(victim, 0o600)
    (run / "state.json").unlink()
    (run / "state.json").symlink_to(victim)
    assert ownership.problem(run) == "state.json is a symbolic link"
    with pytest.raises(OSError):
        ownership.read_untrusted(run / "state.json")
    link = tmp_path / "runs" / "r2"
    link.symlink_to(own_run(tmp_path / "other"))
    assert ownership.problem(link) == "the run folder is a symbolic link"


def test_a_fifo_fails_and_is_never_read(tmp_path):
    run = own_run(tmp_path)
    (run / "state.json").unlink()
    os.mkfifo(run / "state.json")
    assert ownership.problem(run) == "state.json is a FIFO"
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="FIFO"):
        ownership.read_untrusted(run / "state.json")  # O_NONBLOCK: no writer, no wait
    assert time.monotonic() - t0 < 2


def test_a_folder_or_file_owned_by_another_uid_fails(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    run = own_run(tmp_path)
    os.chown(run / "spec.toml", NOBODY, NOBODY)
    assert ownership.problem(run) == "spec.toml is owned by uid 65534 (nobody)"
    os.chown(run / "spec.toml", 0, 0)
    os.chown(run, NOBODY, NOBODY)
    assert ownership.problem(run) == "the run folder is owned by uid 65534 (nobody)"
    with pytest.raises(ownership.ForeignRun, match="owned by uid 65534"):
        ownership.check(run)
    # the same folder is the user's own for its owner
    assert ownership.problem(run, uid=NOBODY) is None


# -- a run planted by another user -------------------------------------------------------------


def test_a_planted_run_is_listed_foreign_and_never_adopted(shared):
    from tunedeck.core.demo import ensure_tiny_model

    ensure_tiny_model(DATA)  # cached: an adoption would reach the planted argv at once
    marker = shared.base / "marker"
    run_id = "20261201-000000-planted-0bad"
    run_dir = plant(shared, run_id, planted_state(run_id), ["/bin/sh", "-c", f"id > {marker}"])
    before = tree(run_dir)
    why = "the run folder is owned by uid 65534 (nobody)"

    listed = cli_json("ls", home=shared.home)
    assert [(r["run_id"], r["status"], r["message"]) for r in listed] == [
        (run_id, FOREIGN, f"foreign: {why}")
    ]
    # read-only: what its state.json records is shown
    assert listed[0]["step"] == 42 and listed[0]["loss"] == 2.5 and listed[0]["name"] == "planted"
    plain = cli("ls", home=shared.home).stdout
    assert run_id in plain and FOREIGN in plain and "42/200" in plain
    status = cli_json("status", run_id, home=shared.home)
    assert status["status"] == FOREIGN and why in status["message"]
    assert cli_json("status", "planted", home=shared.home)["run_id"] == run_id

    # the registry as the TUI's runs list keeps it (a scan, then rescans)
    reg = Registry(shared.runs)
    for _ in range(3):
        (info,) = reg.scan(full=True)
        assert info.status == FOREIGN and info.foreign and not info.needs_stop
        assert info.step == 42 and info.message == f"foreign: {why}"
    assert read_run(run_dir).foreign

    # every adoption path refuses it
    state = json.loads((run_dir / "state.json").read_text())
    assert adopt.why_not(run_dir, state) == f"foreign: {why}"
    assert adopt.request(run_dir, state, force=True) is False
    assert adopt.ensure_agent(run_dir, timeout_s=2) is False
    with pytest.raises(ownership.ForeignRun):
        adopt.spawn(run_dir)
    # and an agent started on it by hand refuses before writing anything
    for extra in (["--adopt"], []):
        r = subprocess.run(
            [sys.executable, "-m", "tunedeck.core.supervisor.agent", str(run_dir), *extra],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, TUNEDECK_HOME=str(shared.home)),
        )
        assert r.returncode == 2 and why in r.stderr, r.stderr

    deadline = time.monotonic() + WATCH_S
    while time.monotonic() < deadline:
        assert not marker.exists(), f"the planted argv ran: {marker.read_text()}"
        assert not agents_on(run_dir)
        time.sleep(0.2)
    assert not marker.exists()
    assert tree(run_dir) == before, "something was written into the planted run"


def test_a_planted_runs_pids_are_never_signalled(shared):
    victim = shared.sleeper()  # a live process of this user's, named by the planted state
    ident = procs.identity(victim.pid)
    run_id = "20261201-000000-planted-5160"
    state = planted_state(
        run_id,
        torchrun_pid=victim.pid,
        worker_pids=[victim.pid],
        pgids=[victim.pid],
        rank_pids={"0": victim.pid},
        launches=[
            {
                "id": "0123456789abcdef",
                "attempt": 0,
                "boot": procs.boot_id(),
                "after": 0,
                "t": time.time() - 100,
                "torchrun_pid": victim.pid,
            }
        ],
    )
    state["pid_identity"][str(victim.pid)] = ident
    run_dir = plant(
        shared, run_id, state, ["/bin/true"], extra={"stacks/rank0.txt": ""}
    )  # what `stacks` signals a rank for
    before = tree(run_dir)
    why = "the run folder is owned by uid 65534 (nobody)"

    for flags in ([], ["--hard"], ["--wait"]):
        r = cli("stop", run_id, *flags, home=shared.home, check=False)
        assert r.returncode == 1 and why in r.stderr and "nothing is signalled" in r.stderr, (
            flags,
            r.stdout,
            r.stderr,
        )
    r = cli("stacks", run_id, home=shared.home, check=False)
    assert r.returncode == 1 and why in r.stderr, (r.stdout, r.stderr)

    info = find_run(run_id, shared.runs)
    with pytest.raises(control.ForeignRun):
        control.stop(info, hard=True)
    with pytest.raises(control.ForeignRun):
        control.request_stop(info, hard=True)
    with pytest.raises(control.ForeignRun):
        control._stop_orphaned(info)
    with pytest.raises(ownership.ForeignRun):
        stacks.dump_stacks(run_dir)

    time.sleep(1.0)
    assert victim.poll() is None and procs.same_process(victim.pid, ident), (
        "a pid named by another user's state.json was signalled"
    )
    assert not agents_on(run_dir)
    assert not (run_dir / "stop.json").exists()
    assert tree(run_dir) == before


def test_a_run_of_this_user_in_the_shared_home_is_still_its_own(shared, monkeypatch):
    """The rule reads who owns the run, not where it lies: this user's run in the 1777 home
    is adoptable and stoppable as before (its agent is not started here)."""
    monkeypatch.setenv("TUNEDECK_NO_ADOPT", "1")
    run_id = "20261201-000000-mine-0a0a"
    run_dir = shared.runs / run_id
    run_dir.mkdir(mode=0o700)
    for name, text in (
        ("state.json", json.dumps(planted_state(run_id))),
        ("plan.json", json.dumps({"nodes": []})),
        ("spec.toml", DEMO.read_text()),
    ):
        (run_dir / name).write_text(text)
        os.chmod(run_dir / name, 0o600)
    info = read_run(run_dir)
    assert info.status == "lost" and not info.foreign and info.needs_stop
    assert adopt.why_not(run_dir, info.state) is None


def test_a_node_folder_planted_before_the_head_reaches_it_is_refused(shared):
    """The other host's side of an ssh run (`python -m tunedeck.core.nodes.remote`): a
    <run id>.node<k> folder another user made first is not attached to, streamed or revived."""
    import io

    from tunedeck.core.nodes import remote, wire

    head_id = "20261201-000000-head-1111"
    marker = shared.base / "node-marker"
    node_dir = plant(
        shared,
        remote.node_run_id(head_id, 1),
        planted_state(remote.node_run_id(head_id, 1)),
        ["/bin/sh", "-c", f"id > {marker}"],
    )
    before = tree(node_dir)
    for op in ({"op": "start"}, {"op": "attach", "revive": True}):
        hello = {"run_id": head_id, "node": 1, "home": str(shared.home), **op}
        out = io.BytesIO()
        assert remote.serve(io.BytesIO(wire.frame(hello)), out) == 1
        said = wire.parse(out.getvalue().splitlines()[0])
        assert said["k"] == "error" and "owned by uid 65534 (nobody)" in said["why"], said
    time.sleep(3)
    assert not marker.exists() and not agents_on(node_dir) and tree(node_dir) == before


async def test_the_runs_list_shows_a_foreign_run_and_hides_what_acts_on_it(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    from tests.test_manage import make_run
    from tests.test_tui_runs import app_for, loaded, select
    from tunedeck.tui.format import RUN_STATUS_STYLE
    from tunedeck.tui.screens.confirm import ConfirmScreen

    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    mine = make_run(home / "runs", "20251124-090000-mine-a1b2", status="succeeded")
    theirs = make_run(
        home / "runs",
        "20251124-100000-theirs-c3d4",
        name="theirs",
        status="succeeded",
        step=30,
        max_steps=100,
    )
    for p in [theirs, *theirs.rglob("*")]:
        os.lchown(p, NOBODY, NOBODY)
    assert RUN_STATUS_STYLE[FOREIGN]
    app = app_for()
    async with app.run_test(size=(160, 40)) as pilot:
        screen, _table = await loaded(app, pilot, 2)
        select(screen, theirs.name)
        await pilot.pause(0.1)
        cells = screen._cells(screen.selected_run(), 0)
        assert cells["name"].plain == "theirs" and cells["status"].plain == FOREIGN
        assert cells["step"] == "30/100"
        assert str(cells["status"].style) == RUN_STATUS_STYLE[FOREIGN]
        for action in ("clone", "resume", "delete"):
            assert screen.check_action(action, ()) is False, action
        assert screen.check_action("new_run", ()) is True
        await pilot.press("d")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ConfirmScreen)
        assert (theirs / "state.json").exists()
        select(screen, mine.name)
        await pilot.pause(0.1)
        assert screen.check_action("delete", ()) is True


# -- a stop while a launch is still starting its agent ----------------------------------------


def _prepared(home: Path, agent_follows: bool = True) -> Path:
    """A run as `launch` leaves it between writing state.json and its agent taking it
    (`agent_follows`: this process will start the agent, as launch does)."""
    from tunedeck.core.supervisor.launch import prepare_run
    from tunedeck.core.spec import load_spec

    spec = load_spec(DEMO, ["train.max_steps=100000", "cluster.device=cpu"])
    return prepare_run(spec, home / "runs", agent_follows=agent_follows)


def test_a_stop_before_the_agent_took_the_run_is_carried_out_by_the_agent(td_home):
    """`tunedeck stop` 0.1 s after `tunedeck launch`: state.json exists, the agent has not
    written its pid yet. The stop waits for it; the agent ends the run "stopped before start"
    and the CLI says just that, never "agent was gone; processes killed"."""
    from tunedeck.core.supervisor.launch import start_agent

    run_dir = _prepared(td_home)
    stopper = subprocess.Popen(
        [sys.executable, "-m", "tunedeck.tui", "stop", run_dir.name, "--wait", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, TUNEDECK_HOME=str(td_home)),
    )
    try:
        wait_for(lambda: (run_dir / "stop.json").exists(), 60, "the stop's request")
        said_early = json.loads((run_dir / "state.json").read_text())
        start_agent(run_dir)  # what launch does next
        out, err = stopper.communicate(timeout=120)
    finally:
        if stopper.poll() is None:
            stopper.kill()
    assert said_early["status"] == "pending", said_early
    assert stopper.returncode == 0, err
    done = json.loads(out)
    final = json.loads((run_dir / "state.json").read_text())
    assert done["status"] == final["status"] == "stopped", (done, final)
    assert done["message"] == final["message"] and final["message"].startswith(
        "stopped before start"
    ), (done["message"], final["message"])
    assert "agent was gone" not in done["message"] + final["message"]
    assert not procs.marked_processes(run_dir.name)


def test_a_stop_of_a_run_no_agent_ever_took_says_so(td_home):
    """A launch that died before starting its agent (long ago): the stop ends the run from
    here at once and says that no agent took it, not that processes were killed."""
    run_dir = _prepared(td_home)
    st = json.loads((run_dir / "state.json").read_text())
    st["created"] = time.time() - 3600
    (run_dir / "state.json").write_text(json.dumps(st))
    t0 = time.monotonic()
    done = cli_json("stop", run_dir.name, "--wait", home=td_home)
    assert time.monotonic() - t0 < 20
    assert done["status"] == "stopped"
    assert done["message"].startswith("stopped before start: no agent had taken the run"), done
    assert "killed" not in done["message"]


def test_a_stop_does_not_wait_for_an_agent_no_one_will_start(td_home):
    """A run written a moment ago whose launch is gone (here: a process that prepared it and
    exited), or that was only prepared: no agent is coming, so the stop ends it at once
    rather than waiting out the start window."""
    code = (
        "import sys; from pathlib import Path\n"
        "from tunedeck.core.spec import load_spec\n"
        "from tunedeck.core.supervisor.launch import prepare_run\n"
        "spec = load_spec(Path(sys.argv[2]), ['cluster.device=cpu'])\n"
        "print(prepare_run(spec, Path(sys.argv[1]) / 'runs', agent_follows=True))"
    )
    made = subprocess.run(
        [sys.executable, "-c", code, str(td_home), str(DEMO)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    orphan = Path(made.stdout.strip().splitlines()[-1])
    assert json.loads((orphan / "state.json").read_text())["launcher"]["pid"] > 0
    only_prepared = _prepared(td_home, agent_follows=False)
    for run_dir in (orphan, only_prepared):
        t0 = time.monotonic()
        done = cli_json("stop", run_dir.name, "--wait", home=td_home)
        assert time.monotonic() - t0 < 10, run_dir.name  # the start window is 30 s
        assert done["status"] == "stopped"
        assert done["message"].startswith("stopped before start: no agent had taken the run")


def test_the_owner_lock_keeps_a_late_stop_from_overwriting_a_starting_agent(td_home):
    """While an agent holds the run's lock (taking ownership), a stop of a run without an
    agent pid writes nothing: the agent reads stop.json and ends the run itself."""
    run_dir = _prepared(td_home)
    st = json.loads((run_dir / "state.json").read_text())
    st["created"] = time.time() - 3600  # not waited for
    (run_dir / "state.json").write_text(json.dumps(st))
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the agent's main() does
        control.request_stop(read_run(run_dir))
        after = json.loads((run_dir / "state.json").read_text())
        assert after["status"] == "pending" and (run_dir / "stop.json").exists(), after
    finally:
        os.close(fd)
