"""The agent's tracker mirror, for a backend that knows nothing of tunedeck: a real `script`
run (tests/scripts/ddp_toy.py, 2 ranks over gloo on CPU) that only prints HF Trainer's log
dicts; the agent parses them into run.db and mirrors them into TensorBoard, read back with
TensorBoard's own reader and compared with `tunedeck metrics`."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, cli, cli_json
from tunedeck.core.spec import cross_checks, loads_spec
from tunedeck.core.trackers import Mirror, open_mirror
from tunedeck.core.trackers.sinks import wanted

STEPS = 12


@pytest.fixture(scope="module")
def script_run(tmp_path_factory):
    home = tmp_path_factory.mktemp("trackers-home")
    spec = tmp_path_factory.mktemp("trackers-spec") / "toy.toml"
    toy = REPO / "tests" / "scripts" / "ddp_toy.py"
    spec.write_text(f"""name = "toy-script"
backend = "script"
[script]
path = "{toy}"
args = ["--steps", "{STEPS}", "--step-sleep", "0.02", "--no-events", "--print-metrics"]
[cluster]
device = "cpu"
cpu_procs = 2
""")
    proc = cli("launch", str(spec), "--wait", "--json", home=home, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[0])["run_id"]
    return home, run_id, home / "runs" / run_id


def test_script_run_mirrored_to_tensorboard_matches_metrics(script_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    home, run_id, run_dir = script_run
    metrics = {r["step"]: r for r in cli_json("metrics", run_id, home=home)}
    assert sorted(metrics) == list(range(1, STEPS + 1))
    acc = EventAccumulator(str(run_dir / "tracking" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    for tag, key in (("train/loss", "loss"), ("train/lr", "learning_rate")):
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert sorted(got) == sorted(metrics), tag
        bad = [s for s in got if not math.isclose(got[s], metrics[s][key], rel_tol=1e-6)]
        assert not bad, f"{tag} differs from `tunedeck metrics` at steps {bad}"
    (ev,) = acc.Scalars("eval/loss")
    assert ev.step == STEPS and ev.value > 0
    assert [e.value for e in acc.Scalars("tracking/dropped_points")] == [0]
    spec_text = acc.Tensors("spec/text_summary")[0].tensor_proto.string_val[0].decode()
    assert 'backend = "script"' in spec_text
    assert (
        "ddp_toy.py" in acc.Tensors("command/text_summary")[0].tensor_proto.string_val[0].decode()
    )
    # the same thread read run.db's telemetry (the host's, here: the ranks had ended by the
    # last poll), at the last step
    mem = acc.Scalars("host/mem_used_gib")
    assert mem and mem[-1].step == STEPS and 0 < mem[-1].value < 4096
    # the agent did it: no torch in the agent, so its log says what the mirror dropped
    assert "trackers: 0 points dropped" in (run_dir / "logs" / "agent.log").read_text()


def test_backend_reports_leave_a_tracker_to_the_backend(tmp_path):
    spec = loads_spec(
        'backend = "script"\n[script]\npath = "x.py"\n[tracking]\nmlflow = true\n'
        'backend_reports = ["tensorboard"]\n'
    )
    assert wanted(spec) == ["mlflow"]
    spec.tracking.backend_reports = ["tensorboard", "mlflow"]
    assert open_mirror(spec, tmp_path) is None  # nothing left: no thread, no folder
    assert not (tmp_path / "tracking").exists()
    spec.tracking.backend_reports = ["comet"]
    assert any(
        p.startswith("tracking.backend_reports: unknown tracker comet") for p in cross_checks(spec)
    )


@pytest.mark.parametrize(
    "backend, args, own",
    [
        ("swift", [], {"tensorboard"}),  # ms-swift's default --report_to
        ("swift", ["--report_to", "none"], set()),
        ("swift", ["--report_to", "wandb", "mlflow", "--logging_steps", "1"], {"wandb", "mlflow"}),
        ("swift", ["--report_to=all"], {"tensorboard", "wandb", "mlflow"}),
        ("script", [], set()),  # transformers' default: none
        ("script", ["--report_to", "tensorboard,wandb"], {"tensorboard", "wandb"}),
    ],
)
def test_a_backends_own_report_to_is_not_doubled(tmp_path, backend, args, own):
    """What ms-swift or an HF script reports to by itself (its --report_to, or its default)
    is left to it; `tunedeck tb` then points at the backend's own event files."""
    from tunedeck.core.trackers import backend_reports, tensorboard_logdir

    key = "swift.extra_args" if backend == "swift" else "script.args"
    spec = loads_spec(
        f'backend = "{backend}"\n[script]\npath = "x.py"\n[tracking]\nwandb = "offline"\n'
        "mlflow = true\n"
    )
    section, field = key.split(".")
    setattr(getattr(spec, section), field, args)
    assert backend_reports(spec) == own
    assert set(wanted(spec)) == {"tensorboard", "wandb", "mlflow"} - own
    logdir = tensorboard_logdir(tmp_path, spec)
    assert logdir == (
        tmp_path / "output" if "tensorboard" in own else tmp_path / "tracking" / "tensorboard"
    )


def test_mirror_drops_points_and_survives_a_failing_tracker():
    """A slow tracker costs points (counted), never time; a failing one is switched off; one
    that cannot start costs nothing but itself."""
    gate = threading.Event()

    class Slow:
        name = "slow"

        def __init__(self):
            self.logged: list[int] = []

        def log(self, step, values):
            gate.wait(10)
            self.logged.append(step)

        def note(self, step, tag, text): ...
        def close(self, dropped):
            self.dropped = dropped

    class Broken(Slow):
        name = "broken"

        def log(self, step, values):
            raise OSError("disk full")

    slow, broken = Slow(), Broken()
    m = Mirror(lambda: [slow, broken], maxsize=4)
    t0 = time.perf_counter()
    m.feed(
        [{"kind": "step", "rank": r, "step": s, "loss": 1.0} for s in range(1, 101) for r in (0, 1)]
    )
    assert time.perf_counter() - t0 < 1.0
    gate.set()
    m.close()
    assert m.dropped > 0 and len(slow.logged) == 100 - m.dropped and slow.dropped == m.dropped
    assert m.sinks == [slow] and "broken: OSError: disk full" in m.failures[0]

    def cannot_start():
        raise RuntimeError("no tracking server")

    m = Mirror(cannot_start)
    m.put("step", {"step": 1, "loss": 1.0})
    m.close()
    assert m.sinks == [] and "RuntimeError: no tracking server" in m.failures[0]


def test_a_tracker_that_hangs_as_it_closes_never_holds_the_agent(monkeypatch):
    """Closing (W&B's finish waits on its own service) runs under close()'s time limit."""
    import tunedeck.core.trackers as trackers

    monkeypatch.setattr(trackers, "CLOSE_TIMEOUT_S", 0.5)
    release = threading.Event()

    class Stuck:
        name = "stuck"
        closed = False

        def log(self, step, values): ...
        def note(self, step, tag, text): ...
        def close(self, dropped):
            release.wait(30)
            self.closed = True

    stuck = Stuck()
    m = Mirror(lambda: [stuck])
    m.put("step", {"step": 1, "loss": 1.0})
    t0 = time.perf_counter()
    m.close()
    try:
        assert time.perf_counter() - t0 < 5
        assert "still writing after" in m.failures[-1] and not stuck.closed
    finally:
        release.set()


def test_tracking_folder_is_only_tunedecks(script_run):
    """`tunedeck tb` names the run's own folder (the user's TensorBoard over many runs)."""
    home, run_id, run_dir = script_run
    assert str(run_dir / "tracking" / "tensorboard") in cli("tb", run_id, home=home).stdout
    assert Path(run_dir / "tracking" / "tensorboard").is_dir()


def test_findings_and_telemetry_reach_the_trackers(tmp_path):
    """What is not an event (run.db's findings and telemetry snapshot) goes through the
    mirror's poll: GPU and rank scalars at the newest step, each finding once as a note."""
    from tunedeck.core.diagnose.finding import Finding
    from tunedeck.core.rundir import RunDir
    from tunedeck.core.store.store import Store
    from tunedeck.core.supervisor.trackfeed import RunDbPoll

    run = RunDir(tmp_path)
    store = Store(run, write=True)
    tel = store.telemetry
    tel.set_latest("gpus", 1.0, [{"gpu": 0, "t": 1.0, "util": 95.0, "mem_used_mib": 2048.0}])
    tel.set_latest("procs", 1.0, {"ranks": [{"rank": 1, "cpu_pct": 50.0, "rss_mib": 512.0}]})
    tel.set_latest("host", 1.0, {"cpu_pct": 20.0, "mem_used_mib": 4096.0})
    tel.commit()
    store.save_finding(
        Finding("dataloader_starvation", "warning", "rank 1 waits", "slow loader", "workers", 1)
    )

    class Sink:
        name = "memory"

        def __init__(self):
            self.logged, self.notes = [], []

        def log(self, step, values):
            self.logged.append((step, values))

        def note(self, step, tag, text):
            self.notes.append((step, tag, text))

        def close(self, dropped): ...

    sink = Sink()
    m = Mirror(lambda: [sink], poll=RunDbPoll(tmp_path), poll_s=0.05)
    m.put("step", {"step": 7, "loss": 1.0})
    time.sleep(0.5)
    store.save_finding(Finding("stall", "error", "no step for 60 s", "hang", "stacks"))
    m.close()
    store.close()
    tel_points = [(s, v) for s, v in sink.logged if "gpu0/util_pct" in v]
    assert tel_points and tel_points[-1] == (
        7,
        {
            "gpu0/util_pct": 95.0,
            "gpu0/mem_gib": 2.0,
            "host/cpu_pct": 20.0,
            "host/mem_used_gib": 4.0,
            "rank1/cpu_pct": 50.0,
            "rank1/rss_gib": 0.5,
        },
    )
    tags = [t for _, t, _ in sink.notes]
    assert tags == ["finding/dataloader_starvation", "finding/stall"]  # each once
    assert sink.notes[0][2].startswith("warning rank 1: rank 1 waits")
