"""Detector logic on event streams (fast), including the measured 2xH200 starved run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunedeck.core.detect.stall import StallDetector
from tunedeck.core.detect.starvation import StarvationDetector
from tunedeck.core.detect.straggler import StragglerDetector

H200 = Path(__file__).resolve().parent / "fixtures" / "h200" / "recorded"
T = 1_800_000_000.0


def steps(rank, n, step_s, wait_s, t0=T, first=1, **extra):
    return [
        {
            "kind": "step",
            "rank": rank,
            "step": first + i,
            "t": t0 + (i + 1) * step_s,
            "step_s": step_s,
            "data_wait_s": wait_s,
            **extra,
        }
        for i in range(n)
    ]


class SampleTelemetry:
    """GPU utilisation samples as NVML gave them, per GPU; GPU == rank."""

    def __init__(self, samples: dict[int, list[tuple[float, float]]]):
        self.samples = samples

    def gpu_util(self, gpu, t0, t1):
        v = [u for t, u in self.samples.get(gpu, []) if t0 <= t <= t1]
        return sum(v) / len(v) if v else None

    def gpu_for_rank(self, rank, local_world=None):
        return rank if rank in self.samples else None


def test_starvation_names_the_rank_once_per_episode():
    d = StarvationDetector(window_s=30)
    d.update(steps(0, 40, 0.5, 0.01) + steps(1, 40, 0.5, 0.3))
    now = T + 20.5
    (f,) = d.check(now)
    assert f.category == "dataloader_starvation" and f.rank == 1
    assert "60%" in f.summary and "prefetch_factor" in f.fix and "persistent_workers" in f.fix
    assert d.check(now) == []  # reported once
    d.update(steps(1, 80, 0.5, 0.0, t0=T + 20.5, first=41))  # recovered
    assert d.check(T + 60.5) == []
    d.update(steps(1, 80, 0.5, 0.4, t0=T + 60.5, first=121))  # starved again: new episode
    assert [x.rank for x in d.check(T + 100.5)] == [1]


def test_healthy_and_short_runs_are_not_flagged():
    d = StarvationDetector()
    d.update(steps(0, 100, 0.5, 0.02) + steps(1, 100, 0.5, 0.03))
    assert d.check(T + 50.5) == []
    d = StarvationDetector()
    d.update(steps(1, 2, 0.5, 0.45))  # two steps prove nothing
    assert d.check(T + 1) == []


def test_probe_records_feed_starvation():
    d = StarvationDetector(window_s=30)
    d.update(
        [{"kind": "data_wait", "rank": 2, "t": T + i, "wait_s": 0.5, "n": 3} for i in range(1, 21)]
    )
    (f,) = d.check(T + 20.5)
    assert f.rank == 2 and "(probe)" in f.evidence[0]


@pytest.mark.skipif(not H200.exists(), reason="tests/fixtures/h200/recorded not present")
def test_h200_starved_run_flagged_and_corroborated_by_nvml():
    """The measured 7B LoRA run with 1 s of loader delay per step: utilisation 44 %."""

    def load(name):
        return json.loads((H200 / name).read_text())

    for delay, expect in (("1.0", True), ("0.0", False)):
        runs = [load(f"bench_7b_w2_r{r}_d{delay}.json") for r in (0, 1)]
        tel = SampleTelemetry({r["rank"]: [(t, u) for t, u, _ in r["samples"]] for r in runs})
        t0, t1 = runs[0]["samples"][0][0], runs[0]["samples"][-1][0]
        d = StarvationDetector(window_s=t1 - t0, telemetry=tel)
        for r in runs:
            step = r["median_step_s"] + r["mean_wait_s"]
            n = int((t1 - t0) / step)
            d.update(steps(r["rank"], n, step, r["mean_wait_s"], t0=t0))
        found = d.check(t1)
        assert bool(found) == expect, delay
        if expect:
            f = found[0]
            assert "GPU utilisation confirms" in f.cause
            assert any("utilisation mean 4" in e for e in f.evidence)  # ~44 %


def test_stall_names_the_rank_behind():
    d = StallDetector(k=10, floor_s=30, pids={0: 100, 1: 101})
    d.update([{"kind": "start", "rank": 0, "t": T}] + steps(0, 21, 0.2, 0) + steps(1, 20, 0.2, 0))
    last = T + 21 * 0.2
    assert d.check(last + 20) == []  # under the floor
    (f,) = d.check(last + 31)
    assert f.category == "stall" and f.rank == 1 and "rank 1 stopped" in f.summary
    assert "py-spy dump --pid 101" in f.fix and "--pid 100" not in f.fix
    assert d.check(last + 60) == []  # once per episode
    d.update(steps(1, 1, 0.2, 0, t0=last + 60, first=21))
    assert d.check(last + 61) == []  # progress resumed


def test_stall_limit_scales_with_step_time_and_ignores_finished_runs():
    d = StallDetector(k=10, floor_s=30)
    d.update(steps(0, 10, 12.0, 0) + steps(1, 10, 12.0, 0))
    last = T + 120
    assert d.limit() == 120
    assert d.check(last + 100) == []
    assert "all at step 10" in d.check(last + 121)[0].summary
    d = StallDetector(floor_s=30)
    d.update(
        steps(0, 5, 1, 0)
        + steps(1, 5, 1, 0)
        + [{"kind": "end", "rank": r, "t": T + 5, "step": 5} for r in (0, 1)]
    )
    assert d.check(T + 1000) == []


def test_stall_names_the_rank_whose_gpu_idles_while_the_others_spin():
    # all ranks at step 20; NCCL keeps the waiting rank's GPU busy, the stuck one's idles
    last = T + 20 * 0.2
    spin = {
        0: [(last + i, 100.0) for i in range(1, 40)],
        1: [(last + i, 0.0) for i in range(1, 40)],
    }
    d = StallDetector(floor_s=30, telemetry=SampleTelemetry(spin))
    d.update(steps(0, 20, 0.2, 0) + steps(1, 20, 0.2, 0))
    (f,) = d.check(last + 31)
    assert f.rank == 1 and "all at step 20" in f.summary and "rank 1 idle on the GPU" in f.summary
    assert "GPU 0 (rank 0) 100 %, GPU 1 (rank 1) 0 %" in f.evidence[-1]
    # both idle (CPU ranks, or a hang outside any collective): no rank can be named
    idle = {0: spin[1], 1: spin[1]}
    d = StallDetector(floor_s=30, telemetry=SampleTelemetry(idle))
    d.update(steps(0, 20, 0.2, 0) + steps(1, 20, 0.2, 0))
    (f,) = d.check(last + 31)
    assert f.rank is None and "idle on the GPU" not in f.summary


def test_straggler_names_the_slowest_rank():
    d = StragglerDetector(window=20)
    d.update(
        steps(0, 20, 0.50, 0.01)
        + steps(1, 20, 0.52, 0.0)
        + steps(2, 20, 0.9, 0.02)
        + steps(3, 20, 0.51, 0.01)
    )
    (f,) = d.check(T + 20)
    assert f.category == "straggler" and f.rank == 2 and "rank 2" in f.summary
    assert d.check(T + 21) == []
    even = StragglerDetector(window=20)
    even.update(steps(0, 20, 0.5, 0.0) + steps(1, 20, 0.52, 0.0))
    assert even.check(T + 20) == []
    # data waits are starvation's business, not straggling
    starved = StragglerDetector(window=20)
    starved.update(steps(0, 20, 0.5, 0.0) + steps(1, 20, 0.9, 0.4))
    assert starved.check(T + 20) == []


def test_straggler_is_reported_again_only_after_a_lasting_recovery():
    d = StragglerDetector(window=10)
    t, found = T, []

    def run(n, slow_s):
        nonlocal t
        for _ in range(n):
            t += 1.0
            d.update(
                [
                    {"kind": "step", "rank": r, "t": t, "compute_s": slow_s if r == 1 else 0.1}
                    for r in (0, 1)
                ]
            )
            found.extend(d.check(t))

    run(12, 0.3)  # slow: reported
    run(6, 0.1)  # a short dip below the recovery line (6 checks)
    run(12, 0.3)  # slow again: the same episode
    assert [f.rank for f in found] == [1]
    run(20, 0.1)  # a lasting recovery ...
    run(12, 0.3)  # ... then a new episode is reported
    assert [f.rank for f in found] == [1, 1]
