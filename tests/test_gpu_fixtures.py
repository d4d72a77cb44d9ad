"""Faults recorded on 2xH200 with real demo runs under the real agent (NCCL), diagnosed on CPU.

tests/fixtures/h200/<scenario>/ are run directories made by `bench/gpu_faults.sh` on
2026-11-30 and trimmed by `bench/fault_tools.py trim` (logs, event streams, run.db reduced to
the agent's findings and its telemetry). Each is looked at three ways:
  - what the agent stored while the run went (run.db findings, merged by `tunedeck diagnose`),
  - the logs diagnosed now (tunedeck.core.diagnose),
  - the recorded events and GPU telemetry replayed through today's live detectors on the
    recorded clock, as the agent feeds them (update on new events, check every second).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli
from tunedeck.core.detect.stall import StallDetector
from tunedeck.core.detect.starvation import StarvationDetector
from tunedeck.core.detect.straggler import StragglerDetector
from tunedeck.core.diagnose.engine import diagnose_files, diagnose_run
from tunedeck.core.diagnose.finding import Finding
from tunedeck.core.store.store import Store, read_events, read_findings
from tunedeck.core.api import diagnose as collect


def _series(run_dir, kind, *args, **kw):
    with Store(run_dir) as store:
        return store.telemetry_series(kind, *args, **kw)


H200 = Path(__file__).resolve().parent / "fixtures" / "h200"
FAULT_CATEGORIES = {"straggler", "dataloader_starvation", "stall"}


def run_dir(name: str) -> Path:
    return H200 / name


def state(name: str) -> dict:
    return json.loads((run_dir(name) / "state.json").read_text())


def stored(name: str, category: str | None = None) -> list[dict]:
    return [f for f in read_findings(run_dir(name)) if category in (None, f["category"])]


def roots(fs: list[Finding]) -> list[Finding]:
    return [f for f in fs if f.severity == "error" and f.root_cause]


def steady(name: str, rank: int, key: str, skip: int = 10) -> float:
    """Median of a step field after the first `skip` steps (a GPU's first steps take seconds)."""
    xs = sorted(e[key] for e in read_events(run_dir(name), "step", rank=rank) if e["step"] > skip)
    return xs[len(xs) // 2]


class RecordedTelemetry:
    """The run's recorded 1 s GPU samples, answering what the detectors ask of the sampler."""

    def __init__(self, d: Path, t0: float, t1: float, local_world: int = 2):
        ser = _series(d, "gpu", t0, t1, max_points=10**6, metrics=["util"])
        assert ser["resolution_s"] == 1, ser["resolution_s"]
        self.util = {g: list(zip(s["t"], s["util"])) for g, s in ser["series"].items()}
        self.local_world = local_world

    def gpu_util(self, gpu: int, t0: float, t1: float) -> float | None:
        v = [u for t, u in self.util.get(gpu, []) if t0 <= t <= t1 and u is not None]
        return sum(v) / len(v) if v else None

    def gpu_for_rank(self, rank: int, local_world: int | None = None) -> int | None:
        return rank % (local_world or self.local_world)


def replay(name: str, stall_floor_s: float = 60.0) -> tuple[list[Finding], float]:
    """Today's detectors over the recorded events and telemetry; (findings, first step t)."""
    d = run_dir(name)
    events = sorted(read_events(d), key=lambda e: e["t"])
    t0, t1 = events[0]["t"], state(name)["ended"]
    tel = RecordedTelemetry(d, t0, t1)
    detectors = [
        StarvationDetector(telemetry=tel, local_world=2),
        StallDetector(floor_s=stall_floor_s, telemetry=tel, local_world=2),
        StragglerDetector(telemetry=tel, local_world=2),
    ]
    found: list[Finding] = []
    i, now = 0, t0
    while now <= t1:
        new = []
        while i < len(events) and events[i]["t"] <= now:
            new.append(events[i])
            i += 1
        for det in detectors:
            det.update(new)
            found += det.check(now)
        now += 1.0
    first = min(e["t"] for e in events if e["kind"] == "step")
    return found, first


def test_fixtures_are_gpu_runs_and_small():
    total = sum(f.stat().st_size for f in H200.rglob("*") if f.is_file())
    assert total < 2_000_000
    for name in (
        "slow_rank",
        "starved_loader",
        "hung_rank",
        "loader_killed",
        "loader_killed_hang",
        "rank_killed",
    ):
        starts = read_events(run_dir(name), "start")
        assert {e["device"] for e in starts} == {"cuda:0", "cuda:1"}, name
        assert {e["world_size"] for e in starts} == {2}


def test_slow_rank_is_the_straggler_by_compute_time_not_step_time():
    # rank 1's forward sleeps 50 ms: its CUDA-event forward time shows it ...
    c0, c1 = steady("slow_rank", 0, "compute_s"), steady("slow_rank", 1, "compute_s")
    assert 0.04 < c1 - c0 < 0.08 and c0 < 0.03
    # ... while under DDP both ranks' step times are the same: rank 0 waits in the all-reduce
    s0, s1 = steady("slow_rank", 0, "step_s"), steady("slow_rank", 1, "step_s")
    assert abs(s1 - s0) / s0 < 0.05 and s0 > c1

    recorded = stored("slow_rank")
    assert recorded and {(f["category"], f["rank"], f["severity"]) for f in recorded} == {
        ("straggler", 1, "warning")
    }

    found, first = replay("slow_rank")
    # once: noisy warm-up steps must not make it "recover" and report again (it did, live)
    assert [(f.category, f.rank) for f in found] == [("straggler", 1)]
    f = found[0]
    assert f.t - first < 15  # named within seconds of the first step
    assert any("GPU utilisation, last 60 s: GPU 0 (rank 0)" in e for e in f.evidence)
    # healthy logs: nothing wrong in them
    assert [x for x in diagnose_run(run_dir("slow_rank")) if x.severity != "info"] == []


def test_starved_loader_names_rank_1_and_gpu_telemetry_shows_the_idle_gpu():
    assert steady("starved_loader", 1, "data_wait_s") == pytest.approx(0.30, abs=0.01)
    assert steady("starved_loader", 0, "data_wait_s") < 0.01

    [rec] = stored("starved_loader")
    assert (rec["category"], rec["rank"], rec["severity"]) == (
        "dataloader_starvation",
        1,
        "warning",
    )

    found, first = replay("starved_loader")
    assert [(f.category, f.rank) for f in found] == [("dataloader_starvation", 1)]
    f = found[0]
    assert f.t - first < 15 and "num_workers" in f.fix
    # the share is that of steady steps (0.30 s of 0.34 s): warm-up steps must not dilute it
    # (the first version reported 23 %)
    share = int(f.summary.split(": ")[1].split("%")[0])
    assert share >= 60, f.summary
    gpu_line = next(e for e in f.evidence if e.startswith("GPU 1 (rank 1) utilisation"))
    starved_util = float(gpu_line.split("mean ")[1].split(" %")[0])
    waiting_util = float(gpu_line.split("GPU 0 (rank 0) ")[1].split(" %")[0])
    # the starved rank's GPU idles; the waiting rank's GPU spins in the NCCL all-reduce
    assert starved_util < 20 and waiting_util > starved_util + 30
    assert "GPU utilisation confirms it" in f.cause
    assert [x for x in diagnose_run(run_dir("starved_loader")) if x.severity != "info"] == []


def test_hung_rank_nccl_timeout_names_rank_1_and_stall_is_reported_first():
    fs = diagnose_run(run_dir("hung_rank"))
    [root] = roots(fs)
    assert (root.category, root.rank, root.node) == ("rank_missing_from_collective", 1, 0)
    timeout = next(f for f in fs if f.category == "nccl_timeout")
    assert "ALLREDUCE" in timeout.summary and "after 20 s" in timeout.summary
    assert "rank 1 never started it" in timeout.summary and timeout.rank == 0
    cons = {(f.category, f.rank) for f in fs if not f.root_cause}
    assert cons == {("nccl_timeout", 0), ("worker_sigabrt", 0), ("worker_sigkill", 1)}
    stderr1 = next(run_dir("hung_rank").glob("logs/node0/*/attempt_0/1/stderr.log"))
    assert "TUNEDECK_TEST_HANG_RANK: rank 1 hangs after step 30" in stderr1.read_text()

    # on the day (before the GPU split existed) the agent could only say "all at step 30"
    first_stall = stored("hung_rank", "stall")[0]
    assert first_stall["rank"] is None and "all at step 30" in first_stall["summary"]

    found, first = replay("hung_rank", stall_floor_s=10)
    stall = [f for f in found if f.category == "stall"][0]
    last30 = max(e["t"] for e in read_events(run_dir("hung_rank"), "step") if e["step"] == 30)
    assert 10 <= stall.t - last30 < 12
    assert stall.rank == 1 and stall.severity == "error"
    assert "all at step 30" in stall.summary and "rank 1 idle on the GPU" in stall.summary
    split = next(e for e in stall.evidence if e.startswith("GPU utilisation since"))
    # rank 0's GPU spins in the NCCL all-reduce it waits in; rank 1's does nothing
    assert float(split.split("GPU 0 (rank 0) ")[1].split(" %")[0]) >= 80
    assert "GPU 1 (rank 1) 0 %" in split
    assert not [f for f in found if f.category in ("straggler", "dataloader_starvation")]
    assert state("hung_rank")["status"] == "failed"


def test_hung_rank_through_the_cli(tmp_path):
    out = cli("diagnose", str(run_dir("hung_rank")), "--json", home=tmp_path)
    fs = json.loads(out.stdout)
    cats = {(f["category"], f["rank"]) for f in fs}
    assert ("nccl_timeout", 0) in cats and ("stall", None) in cats
    assert [
        f["category"]
        for f in fs
        if f["root_cause"] and f["severity"] == "error" and f["source"] != "events"
    ] == ["rank_missing_from_collective"]


def test_killed_loader_worker_fails_the_run_with_rank_1_as_root_cause():
    fs = diagnose_run(run_dir("loader_killed"))
    [root] = roots(fs)
    assert (root.category, root.rank) == ("dataloader_worker_killed", 1)
    assert any("is killed by signal: Killed" in e for e in root.evidence)
    # rank 0 sat in the NCCL all-reduce until torchrun SIGKILLed it: a consequence
    assert {(f.category, f.rank) for f in fs if not f.root_cause} == {("worker_sigkill", 0)}
    st = state("loader_killed")
    assert st["status"] == "failed" and st["exit_code"] == 1
    assert {f["category"] for f in stored("loader_killed")} == {
        "dataloader_worker_killed",
        "worker_sigkill",
    }
    found, _ = replay("loader_killed")
    assert not [f for f in found if f.category in FAULT_CATEGORIES]


def test_killed_loader_worker_before_the_teardown_fix_hung_the_rank():
    """Recorded before the trainer aborted NCCL on failure: rank 1 hung in its teardown, so its
    stderr stayed empty and torchrun never saw it fail; the event stream still names it."""
    d = run_dir("loader_killed_hang")
    assert next(d.glob("logs/node0/*/attempt_0/1/stderr.log")).stat().st_size == 0
    fs = diagnose_run(d)
    [root] = roots(fs)
    assert (root.category, root.rank) == ("dataloader_worker_killed", 1)
    assert root.source.endswith("rank1.jsonl:24")
    [stall] = stored("loader_killed_hang", "stall")
    assert stall["rank"] == 1 and "others reached step 23" in stall["summary"]
    found, _ = replay("loader_killed_hang")
    assert [(f.category, f.rank) for f in found] == [("stall", 1)]
    assert state("loader_killed_hang")["status"] == "stopped"


def test_killed_rank_is_the_root_cause_and_its_peer_a_consequence():
    fs = diagnose_run(run_dir("rank_killed"))
    [root] = roots(fs)
    assert (root.category, root.rank) == ("worker_sigkill", 1)
    assert "exitcode -9" in root.evidence[0]
    assert {(f.category, f.rank) for f in fs if not f.root_cause} == {("worker_sigkill", 0)}
    found, _ = replay("rank_killed")
    assert not [f for f in found if f.category in FAULT_CATEGORIES]


def test_diagnose_merges_stored_and_log_findings_without_duplicates():
    fs = collect([str(run_dir("loader_killed"))])
    keys = [f.key() for f in fs]
    assert len(keys) == len(set(keys))
    assert ("dataloader_worker_killed", 1) in {(f.category, f.rank) for f in fs}


def test_worker_killed_with_a_batch_in_flight_is_a_dead_loader_worker(tmp_path):
    """On CPU, a real DataLoader: the batch a killed worker had queued cannot be fetched.
    Seen first in the CPU try-out of bench/gpu_faults.sh, where it left no root cause."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parent / "scripts" / "loader_killed_in_flight.py"
    log = tmp_path / "stderr.log"
    with log.open("wb") as f:
        rc = subprocess.run(
            [sys.executable, str(script)], stdout=f, stderr=subprocess.STDOUT, timeout=120
        ).returncode
    text = log.read_text()
    assert rc == 1 and "resource_sharer.py" in text, text[-2000:]
    [root] = roots(diagnose_files([log]))
    assert root.category == "dataloader_worker_killed" and root.severity == "error"
    assert "batches still queued" in root.cause
    assert "exited unexpectedly" in root.evidence[-1]
