"""NVML wrapper (real pynvml without a driver, the fake for the GPU paths), host/process
sampling of real processes, and the sampler's interval."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

from core.telemetry.fake import FakePynvml
from core.telemetry.host import ProcessSampler, host_sample
from core.telemetry.nvml import NA, Nvml
from core.telemetry.sampler import TelemetrySampler
from core.telemetry.store import TelemetryStore, read_gpu_series, read_latest


def test_real_pynvml_without_driver_is_a_state_not_a_crash():
    n = Nvml()
    samples = n.sample()
    if n.status == "ok":       # a machine with a GPU: the real path works too
        assert len(samples) == n.count
        return
    assert samples == [] and n.status in ("no_driver", "error")
    assert "driver" in n.message or "NVML" in n.message


def test_fake_no_driver():
    n = Nvml(FakePynvml(no_driver=True))
    assert n.sample() == [] and n.status == "no_driver"
    assert n.message.startswith("no NVIDIA driver")


def test_unsupported_queries_are_na_and_not_asked_again():
    fake = FakePynvml(2, unsupported={"power", "pcie"})
    n = Nvml(fake)
    s = n.sample(100.0)
    assert s[0]["power_w"] is None and s[0]["pcie_rx_kbs"] is None
    assert s[0]["util"] is not None and s[0]["temp_c"] == 45 and s[1]["temp_c"] == 46
    assert s[0]["nvlink_rx_kbs"] is None             # a rate needs two readings
    calls = fake.calls
    s2 = n.sample(101.0)
    assert s2[0]["nvlink_rx_kbs"] == 5e6             # KiB/s from the cumulative counter
    # power and PCIe (2 counters) x 2 GPUs are not asked again: 6 calls fewer per sample
    per_sample = fake.calls - calls
    fake2 = FakePynvml(2)
    n2 = Nvml(fake2)
    n2.sample(100.0)
    c2 = fake2.calls
    n2.sample(101.0)
    assert (fake2.calls - c2) - per_sample == 6
    assert repr(NA) == "N/A" and not NA


def test_process_list_falls_back_to_older_symbol():
    fake = FakePynvml(1, unsupported={"procs_v3"}, procs={0: [(4242, 2048)]})
    n = Nvml(fake)
    assert n.sample(1.0)[0]["procs"] == [(4242, 2048.0)]
    assert n._proc_fn == "nvmlDeviceGetComputeRunningProcesses_v2"


def test_process_sampler_maps_ranks_and_workers():
    """A real 'rank' process with RANK=3 in its environment and one child (a worker)."""
    code = ("import subprocess,sys,time;"
            "c=subprocess.Popen([sys.executable,'-c','import time;time.sleep(60)']);"
            "time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, RANK="3"))
    try:
        ps = ProcessSampler(rescan_s=0)
        deadline = time.monotonic() + 30
        ranks = []
        while time.monotonic() < deadline:
            ranks, rows = ps.sample([p.pid])
            if ranks and ranks[0]["workers"] == 1:
                break
            time.sleep(0.2)
        assert ranks[0]["rank"] == 3 and ranks[0]["workers"] == 1
        assert {r["role"] for r in rows} == {"rank", "worker"}
        assert all(r["rank"] == 3 and r["threads"] >= 1 and r["rss_mib"] > 0 for r in rows)
    finally:
        for child in __import__("psutil").Process(p.pid).children(recursive=True):
            child.kill()
        p.kill()
        p.wait()
    ranks, rows = ps.sample([p.pid])
    assert ranks == [] and rows == []


def test_host_sample(tmp_path):
    h = host_sample(str(tmp_path / "not" / "yet"))   # output dirs appear late: parent's disk
    assert h["mem_total_mib"] > 0 and h["disk_free_mib"] > 0
    assert h["shm_free_mib"] is None or h["shm_free_mib"] >= 0


def test_sampler_respects_interval_and_stores(tmp_path):
    db = sqlite3.connect(tmp_path / "run.db")
    fake = FakePynvml(2, procs={1: [(os.getpid(), 700)]})
    s = TelemetrySampler(TelemetryStore(db), interval_s=1.0, nvml=Nvml(fake),
                         rank_pids=lambda: [os.getpid()], out_dir=str(tmp_path))
    t = 1_800_000_000.0
    for i in range(20):                   # agent ticks every 0.5 s for 10 s
        s.tick(t + i * 0.5, [])
    assert s.samples == 10
    s.close()
    db.close()
    series = read_gpu_series(tmp_path, t, t + 10, metrics=["util", "mem_used_mib"])
    assert set(series["series"]) == {0, 1} and len(series["series"][1]["t"]) == 10
    latest = read_latest(tmp_path)
    assert latest["status"]["nvml"] == "ok"
    gp = latest["procs"]["gpu_procs"]
    assert gp == [{"gpu": 1, "pid": os.getpid(), "mib": 700.0, "rank": 0}]
    assert s.gpu_for_rank(0) == 1                    # from NVML's process list
    assert s.gpu_util(0, t, t + 10) is not None
