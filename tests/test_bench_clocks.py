"""bench/gpu_clocks.py: the clock and power samples bench/h200_gemm.sh takes around a training
step. The sampler runs tunedeck's NVML reader (here on the fake NVML, the GPU machine runs the
real one); the summary is plain arithmetic over the samples it wrote."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from gpu_clocks import read, sample, summary  # noqa: E402

from tunedeck.core.telemetry.fake import FakePynvml  # noqa: E402


def test_each_sample_reads_the_clock_and_power_of_every_gpu(tmp_path):
    out = tmp_path / "clocks.jsonl"
    lib = FakePynvml(gpus=2, util=lambda gpu, t: 100)
    before = signal.getsignal(signal.SIGTERM)
    assert sample(out, 0.0, lib, count=3) == 3
    rows = read(out)
    assert [r["gpu"] for r in rows] == [0, 1] * 3
    assert all(r["sm_mhz"] == 1980 and r["power_w"] is not None for r in rows), rows
    # every sample read the clocks (SM and memory) and the power afresh, not every tenth
    assert lib.calls_by["clocks"] == 2 * 3 * 2 and lib.calls_by["power"] == 2 * 3
    assert lib.inits == 0  # NVML shut down when the sampler ends
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler back
    assert summary(rows, gpu=1)["busy"] == 3


def test_the_summary_counts_only_busy_samples_and_the_share_below_the_boost(tmp_path):
    def row(util, mhz, w, gpu=0):
        return {"gpu": gpu, "t": 0, "util": util, "power_w": w, "temp_c": 60, "sm_mhz": mhz}

    rows = [
        row(0, 1980, 90),  # idle before the work: sets the boost clock, is not counted
        row(100, 1980, 690),
        row(100, 1755, 700),
        row(97, 1710, 700),
        row(95, 1830, 698),
        row(40, 1400, 300),  # a gap between cases
        row(100, 1200, 700, gpu=1),  # another GPU
    ]
    got = summary(rows)
    assert got["samples"] == 6 and got["busy"] == 4
    assert got["top_mhz"] == 1980 and got["min_mhz"] == 1710
    assert got["median_mhz"] == (1755 + 1830) / 2
    assert got["below_top"] == 0.75
    assert got["median_w"] == 699
    assert summary(rows, gpu=2) == {"samples": 0, "busy": 0}
    # a line cut by the sampler's kill is not a sample
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]) + '{"gpu": 0, "t"')
    assert read(path) == rows[:2]
