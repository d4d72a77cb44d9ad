"""Shared fixtures. Tests run real processes: torchrun, the agent, the CLI, tmux."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "presets" / "demo.toml"


# -- the suite on every core (pytest-xdist: `-n auto --dist loadgroup` in pyproject) ---------
# Each file's tests run on one worker, in order: its module fixtures are built once, and files
# that keep state in fixed places (a snapshot home, the round trip's folder) stay serial. The
# two-host and Slurm files share one worker: the network namespaces, their interface names and
# sshd are machine-wide.
SHARED_HOSTS = {"test_multinode.py", "test_slurm.py", "test_slurm_nodes.py"}
MAX_WORKERS = 8  # each worker runs whole torchrun runs: two ranks with torch loaded, an agent


def worker_group(path: Path) -> str:
    return "hosts" if path.name in SHARED_HOSTS else path.name


def pytest_configure(config):
    """Compile tunedeck's own modules once, before any worker starts. Where
    PYTHONDONTWRITEBYTECODE is set (as on this project's development machine), every process a
    test starts (the CLI, an agent, each rank, the TUI) would otherwise compile them from
    source: ~0.3 s of CPU a process, ~10 % of a launching test's CPU. The installed
    packages need nothing: pip compiled them."""
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):
        import compileall

        for part in ("cli", "core", "tui"):
            compileall.compile_dir(REPO / part, quiet=1)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(worker_group(item.path)))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per usable core, at most MAX_WORKERS (run one after the other,
    the tests left a third of two cores idle while they waited on their processes);
    PYTEST_XDIST_AUTO_NUM_WORKERS wins. Tests that all share one worker (one file named,
    or tests of one file) run in this process: a worker would only add its start-up.
    `pytest -n 0` always runs here, for debugging."""
    forced = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if forced:
        return int(forced)
    files = [Path(str(a).split("::")[0]) for a in config.args]
    if files and all(f.is_file() for f in files) and len({worker_group(f) for f in files}) == 1:
        return 0
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


@pytest.fixture(scope="session", autouse=True)
def private_home(tmp_path_factory):
    """Nothing a test does may reach the user's real home or their tmux: HOME, the XDG folders
    and the run registry point into the test's temp dir, and a tmux the suite runs inside
    of is not the one the tests talk to (see `tmux`)."""
    home = tmp_path_factory.mktemp("user-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(home))
    for var, sub in (
        ("XDG_DATA_HOME", ".local/share"),
        ("XDG_CACHE_HOME", ".cache"),
        ("XDG_CONFIG_HOME", ".config"),
    ):
        mp.setenv(var, str(home / sub))
    mp.setenv("TUNEDECK_HOME", str(home / ".local" / "share" / "tunedeck"))
    # pytest-xdist's workers set COLUMNS=80 and LINES=24, which Textual and the CLI's tables
    # take over the real terminal's size: a TUI in a 120-column tmux would lay out for 80
    for var in ("TMUX", "TMUX_PANE", "COLUMNS", "LINES"):
        mp.delenv(var, raising=False)
    yield home
    mp.undo()


class Tmux:
    """A tmux server of the test's own: its own socket (-L) under its own TMUX_TMPDIR, so a
    test never touches a tmux the user runs, and `kill` (always called) ends all of it."""

    _n = itertools.count()

    def __init__(self, tmpdir: Path):
        tmpdir.mkdir(parents=True, exist_ok=True)
        self.socket = f"tunedeck-test-{os.getpid()}-{next(self._n)}"
        self.env = {**os.environ, "TMUX_TMPDIR": str(tmpdir)}
        self.env.pop("TMUX", None)

    def __call__(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
        )

    def start(self, name: str, argv: list[str], size=(120, 36), env=None, cwd=REPO) -> None:
        """A detached session running `argv` with this environment (plus `env`)."""
        subprocess.run(
            [
                "tmux",
                "-L",
                self.socket,
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                str(size[0]),
                "-y",
                str(size[1]),
                *argv,
            ],
            env={**self.env, **(env or {})},
            cwd=cwd,
            check=True,
        )

    def screen(self, name: str) -> str:
        return self("capture-pane", "-p", "-t", name).stdout

    def keys(self, name: str, *keys: str) -> None:
        self("send-keys", "-t", name, *keys, check=True)

    def alive(self, name: str) -> bool:
        return self("has-session", "-t", name).returncode == 0

    def kill(self) -> None:
        self("kill-server")


@pytest.fixture
def tmux(tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux not installed")
    t = Tmux(tmp_path / "tmux")
    try:
        yield t
    finally:
        t.kill()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One demo-model cache for the whole session, so the tiny model is built once."""
    path = Path(os.environ.get("TUNEDECK_TEST_CACHE") or tmp_path_factory.mktemp("cache"))
    os.environ["TUNEDECK_CACHE"] = str(path)
    return path


@pytest.fixture
def td_home(tmp_path, model_cache, monkeypatch) -> Path:
    """A private registry for one test."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    yield home
    _stop_leftovers(home)


def _stop_leftovers(home: Path) -> None:
    """A failed test must not leave ranks burning the CI machine's two cores."""
    from tunedeck.core.supervisor.control import stop
    from tunedeck.core.views.registry import list_runs

    for run in list_runs(home / "runs"):
        if run.needs_stop:
            stop(run, hard=True, timeout_s=30)


def cli(
    *args: str, home: Path, check: bool = True, timeout: float = 300, **kw
) -> subprocess.CompletedProcess:
    """Run the real `tunedeck` command line in a child process."""
    env = dict(os.environ, TUNEDECK_HOME=str(home))
    env.setdefault("TUNEDECK_CACHE", os.environ.get("TUNEDECK_CACHE", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "tunedeck.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
        **kw,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"tunedeck {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            + _run_told(proc.stdout)
        )
    return proc


def _run_told(stdout: str) -> str:
    """For a failed `launch --json --wait`: what the run itself said (its state, the ends of
    its agent's and torchrun's logs), so that a failure seen once in CI can be read."""
    try:
        run_dir = Path(json.loads(stdout.splitlines()[0])["run_dir"])
    except (IndexError, ValueError, KeyError, TypeError):
        return ""
    try:
        st = json.loads((run_dir / "state.json").read_text())
        told = [f"--- state.json: {st.get('status')}: {st.get('message')}"]
    except (OSError, ValueError):
        told = []
    for name in ("logs/agent.log", "logs/torchrun-node0.log"):
        try:
            lines = (run_dir / name).read_text(errors="replace").splitlines()
        except OSError:
            continue
        told.append(f"--- {name} (last 40 lines)\n" + "\n".join(lines[-40:]))
    return "\n" + "\n".join(told)


def cli_json(*args: str, home: Path, **kw):
    return json.loads(cli(*args, "--json", home=home, **kw).stdout)


def json_docs(text: str) -> list:
    """Every JSON value a command printed, in order: one for most verbs, two for a launch
    with --json --wait (the run's id and folder, then the ended run)."""
    dec, docs, text = json.JSONDecoder(), [], text.strip()
    i = 0
    while i < len(text):
        doc, i = dec.raw_decode(text, i)
        docs.append(doc)
        while i < len(text) and text[i].isspace():
            i += 1
    return docs


def cli_launch(*args: str, home: Path, **kw) -> tuple[dict, dict]:
    """`tunedeck ARGS --json --wait` that must succeed: (the started line, the ended run)."""
    started, ended = json_docs(cli(*args, "--json", "--wait", home=home, **kw).stdout)
    return started, ended


def trainer_torchrun_argv(run: Path) -> list[str]:
    """torchrun of the built-in trainer on two ranks of one host, for tests that start it themselves.
    `--log_dir` beside the run: without it torch makes a torchelastic_* folder in /tmp and
    never removes it."""
    from tunedeck.core.estimate.resolve import free_port

    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "--log_dir",
        str(run.with_name(run.name + ".torchrun")),
        "-m",
        "tunedeck.core.train",
        "--run-dir",
        str(run),
    ]


def pids_gone(pids) -> bool:
    """Every one of these processes has exited (a zombie counts: it holds nothing)."""
    from tunedeck.core.store.state import pid_alive

    return not any(pid_alive(pid) for pid in pids)


def agent_gone(run_dir: Path, timeout: float = 60) -> None:
    """Wait until the run's agent has exited: it writes the end's alert record after the final
    status, so a test that walks the folder of a run it did not `--wait` for waits for this."""
    pid = json.loads((run_dir / "state.json").read_text()).get("agent_pid")
    wait_for(lambda: pids_gone([pid]), timeout, "the agent's exit")


def wait_for(pred, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def stop_run(home: Path, run_id: str, *flags: str) -> dict:
    """`tunedeck stop` (which returns once the request is recorded), then the run's end as
    `status` reports it."""
    cli_json("stop", run_id, *flags, home=home, timeout=120)
    return wait_for(
        lambda: (
            (s := cli_json("status", run_id, home=home))["status"]
            in ("stopped", "failed", "succeeded")
            and s
        ),
        120,
        "the run's end",
    )


@pytest.fixture(scope="session")
def finished_demo(tmp_path_factory, model_cache):
    """One complete demo run (the preset as shipped), shared by read-only tests."""
    home = tmp_path_factory.mktemp("demo-home")
    proc = cli("launch", str(DEMO), "--wait", "--json", home=home, check=False, timeout=600)
    assert proc.stdout.strip(), f"launch printed nothing:\n{proc.stderr}"
    run_id = json_docs(proc.stdout)[0]["run_id"]
    yield home, run_id, proc
    _stop_leftovers(home)


def make_run_dir(path: Path, **sections) -> Path:
    """A run directory with only spec.toml, for running tunedeck.core.train under torchrun by hand:
    the demo data on 2 CPU ranks; `train__max_steps=5` style keywords set spec fields."""
    from tunedeck.core.spec import RunSpec

    spec = RunSpec(name="t")
    spec.data.path = str(REPO / "presets" / "data" / "demo_chat.jsonl")
    spec.cluster.device, spec.cluster.dist_backend = "cpu", "gloo"
    spec.method.lora_rank, spec.method.lora_alpha = 16, 32
    spec.train.learning_rate, spec.train.warmup_steps = 5e-3, 2
    for key, value in sections.items():
        section, name = key.split("__")
        setattr(getattr(spec, section), name, value)
    path.mkdir(parents=True)
    (path / "spec.toml").write_text(spec.to_toml())
    return path


# -- TUI tests ------------------------------------------------------------------------------


async def until(pilot, pred, timeout: float = 60.0, what: str = "condition"):
    """Let the app run until `pred()` holds (it returns as soon as it does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        await pilot.pause(0.03)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def screen_host(screen, readonly: bool = False, refresh_s: float = 0.2):
    """A bare app that shows one screen (its own test of a screen, without the runs list)."""
    from textual.app import App

    class Host(App):
        def __init__(self):
            super().__init__()
            self.readonly = readonly
            self.refresh_s = refresh_s  # the monitor polls at the app's rate

        def on_mount(self) -> None:
            self.push_screen(screen)

    return Host()
