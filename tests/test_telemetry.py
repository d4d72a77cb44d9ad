"""NVML wrapper (real pynvml without a driver, the fake for the GPU paths), host/process
sampling of real processes, and the sampler's interval."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import pytest

from tunedeck.core.telemetry.fake import FakePynvml, pynvml
from tunedeck.core.telemetry.gpus import GpuInfo, list_gpus, probe_gpus, visible_gpu_count
from tunedeck.core.telemetry.host import ProcessSampler, host_sample
from tunedeck.core.telemetry.nvml import NA, Nvml, NvmlUnavailable, nvml_session, nvml_start
from tunedeck.core.telemetry.sampler import TelemetrySampler
from tunedeck.core.store.store import Store
from tunedeck.core.telemetry.store import TelemetryStore


def _series(run_dir, kind, *args, **kw):
    with Store(run_dir) as store:
        return store.telemetry_series(kind, *args, **kw)


def test_real_pynvml_without_driver_is_a_state_not_a_crash():
    n = Nvml()
    samples = n.sample()
    if n.status == "ok":  # a machine with a GPU: the real path works too
        assert len(samples) == n.count
        return
    assert samples == [] and n.status in ("no_driver", "error")
    assert "driver" in n.message or "NVML" in n.message


def test_fake_no_driver():
    n = Nvml(FakePynvml(no_driver=True))
    assert n.sample() == [] and n.status == "no_driver"
    assert n.message.startswith("no NVIDIA driver")


def test_nvml_session_starts_stops_and_turns_every_failure_into_a_reason(monkeypatch):
    fake = FakePynvml(1)
    with nvml_session(fake) as nv:
        assert nv is fake and fake.inits == 1
    assert fake.inits == 0
    with pytest.raises(NvmlUnavailable) as e:
        with nvml_session(fake) as nv:
            nv.nvmlDeviceGetHandleByIndex(5)  # an NVMLError inside the block
    assert e.value.status == "error" and e.value.reason.startswith("NVML query failed")
    assert fake.inits == 0  # shut down all the same
    with pytest.raises(NvmlUnavailable) as e:
        nvml_start(FakePynvml(init_error=pynvml.NVML_ERROR_UNKNOWN))
    assert e.value.status == "error" and e.value.reason.startswith("NVML failed to start")
    n = Nvml(FakePynvml(init_error=pynvml.NVML_ERROR_UNKNOWN))
    assert n.sample() == [] and n.status == "error" and "NVML failed to start" in n.message
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    with pytest.raises(NvmlUnavailable) as e:
        nvml_start()
    assert (e.value.status, e.value.reason) == ("no_driver", "nvidia-ml-py is not installed")
    assert probe_gpus().error == "nvidia-ml-py is not installed" and list_gpus() == []


def test_only_the_entry_point_imports_pynvml():
    import ast
    from pathlib import Path

    core = Path(__file__).resolve().parents[1] / "core"
    importers = set()
    for path in core.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n.split(".")[0] == "pynvml" for n in names):
                importers.add(path.relative_to(core).as_posix())
    assert importers == {"telemetry/nvml.py"}


def test_probe_reads_two_nvlinked_fake_h200s():
    fake = FakePynvml(2, driver="580.65", cuda_version=12080)
    facts = probe_gpus(fake)
    assert facts.error == "" and (facts.driver, facts.cuda_driver) == ("580.65", (12, 8))
    assert [(g.index, g.name, g.memory_total_gib, g.cc) for g in facts.gpus] == [
        (0, "Fake H200", 140.4, (9, 0)),
        (1, "Fake H200", 140.4, (9, 0)),
    ]
    assert facts.links == {(0, 1): ("NVLink", True)}
    assert fake.inits == 0  # NVML shut down after the probe


def test_probe_degrades_unsupported_queries_as_before():
    facts = probe_gpus(
        FakePynvml(3, unsupported={"cc", "nvlink", "p2p", "cuda_version"}, topology=30)
    )
    assert [g.cc for g in facts.gpus] == [(0, 0)] * 3 and facts.cuda_driver is None
    assert facts.links == {k: ("PCIe host bridge", True) for k in [(0, 1), (0, 2), (1, 2)]}
    facts = probe_gpus(FakePynvml(2, nvlinks=0, unsupported={"topology"}, p2p=False))
    assert facts.links == {(0, 1): ("unknown", False)}
    assert probe_gpus(FakePynvml(2, nvlinks=0, topology=77)).links == {(0, 1): ("PCIe", True)}


def test_probe_without_usable_nvml_gives_a_reason_and_no_gpus():
    facts = probe_gpus(FakePynvml(4, no_driver=True))
    assert facts.gpus == [] and facts.links == {}
    assert facts.error == "no NVIDIA driver (NVML Shared Library Not Found)"
    fake = FakePynvml(4, unsupported={"mem"})  # fails half way through the GPUs
    facts = probe_gpus(fake)
    assert facts.gpus == [] and facts.error.startswith("NVML query failed")
    assert fake.inits == 0 and list_gpus(fake) == []


def test_list_gpus_and_visible_count_on_the_fake(monkeypatch):
    fake = FakePynvml(4, total_mib=81559)
    gpus = list_gpus(fake)
    assert [g.index for g in gpus] == [0, 1, 2, 3] and isinstance(gpus[0], GpuInfo)
    assert gpus[0].name == "Fake H200" and gpus[0].memory_total_gib == 79.6
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpu_count(lib=fake) == 4
    for sel, want in [("0,2", 2), ("3", 1), ("-1", 0), ("", 0), ("0,1,2,3,4,5", 4)]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", sel)
        assert visible_gpu_count(lib=fake) == want, sel
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert visible_gpu_count("1", lib=fake) == 1  # the spec's list wins
    assert visible_gpu_count(lib=FakePynvml(4, no_driver=True)) == 0


def test_unsupported_queries_are_na_and_not_asked_again():
    fake = FakePynvml(2, unsupported={"power", "pcie"})
    n = Nvml(fake, slow_every=1)  # every field on every sample
    s = n.sample(100.0)
    assert s[0]["power_w"] is None and s[0]["pcie_rx_kbs"] is None
    assert s[0]["util"] is not None and s[0]["temp_c"] == 45 and s[1]["temp_c"] == 46
    assert s[0]["nvlink_rx_kbs"] is None  # a rate needs two readings
    calls = fake.calls
    s2 = n.sample(101.0)
    assert s2[0]["nvlink_rx_kbs"] == 5e6  # KiB/s from the cumulative counter
    # power and PCIe (2 counters) x 2 GPUs are not asked again: 6 calls fewer per sample
    per_sample = fake.calls - calls
    fake2 = FakePynvml(2)
    n2 = Nvml(fake2, slow_every=1)
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


def test_a_worker_of_unknown_rank_never_hides_a_known_one():
    """Until a worker has exec'd its rank is unknown; the state still lists it, under a rank
    no read worker holds, so the monitors find every rank that was read."""
    from tunedeck.core.telemetry import proctree

    assert proctree.rank_table({101: None, 102: 0, 103: 2}) == {"0": 102, "2": 103, "1": 101}
    assert proctree.rank_table({101: None, 102: None}) == {"0": 101, "1": 102}
    assert proctree.rank_table({101: 1, 102: 0}) == {"0": 102, "1": 101}
    assert proctree.rank_table({}) == {}


def test_a_rank_read_before_its_exec_is_asked_again():
    """The agent records which rank each of torchrun's children runs as. A child read before
    it has exec'd shows its parent's environment (no RANK); that None must not stick."""
    from tunedeck.core.telemetry import proctree

    # the parent's environment has no RANK; the process takes one only when it execs
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    code = (
        "import os,sys,time;time.sleep(1.5);"
        "os.execve(sys.executable,[sys.executable,'-c','import time;time.sleep(60)'],"
        "dict(os.environ,RANK='2'))"
    )
    p = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        known = proctree.ranks_of([p.pid], {})
        assert known == {p.pid: None}  # not exec'd yet
        deadline = time.monotonic() + 30
        while known[p.pid] is None and time.monotonic() < deadline:
            time.sleep(0.1)
            known = proctree.ranks_of([p.pid], known)
        assert known == {p.pid: 2}
        # a rank once read is kept, and a pid that is gone drops out
        assert proctree.ranks_of([p.pid], {p.pid: 7}) == {p.pid: 7}
        assert proctree.ranks_of([], known) == {}
    finally:
        p.kill()
        p.wait()


def test_process_sampler_maps_ranks_and_workers():
    """A real 'rank' process with RANK=3 in its environment and one child (a worker): its rank
    read from /proc as the agent does, its worker found under it."""
    from tunedeck.core.telemetry import proctree

    code = (
        "import subprocess,sys,time;"
        "c=subprocess.Popen([sys.executable,'-c','import time;time.sleep(60)']);"
        "time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, RANK="3"))
    try:
        ps = ProcessSampler(rescan_s=0)
        deadline = time.monotonic() + 30
        ranks = []
        # until the child has exec'd, /proc shows the environment it forked with (no RANK)
        while proctree.rank_of(p.pid) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proctree.rank_of(p.pid) == 3 and proctree.rank_of(os.getpid()) is None
        while time.monotonic() < deadline:
            ranks, rows = ps.sample({proctree.rank_of(p.pid): p.pid})
            if ranks and ranks[0]["workers"] == 1:
                break
            time.sleep(0.2)
        assert ranks[0]["rank"] == 3 and ranks[0]["workers"] == 1
        kids = proctree.children(p.pid)
        assert len(kids) == 1 and proctree.descendants(p.pid) == kids
        assert proctree.walk_table([p.pid]) == {p.pid: kids}
        assert {r["role"] for r in rows} == {"rank", "worker"}
        assert all(r["rank"] == 3 and r["threads"] >= 1 and r["rss_mib"] > 0 for r in rows)
    finally:
        for child in __import__("psutil").Process(p.pid).children(recursive=True):
            child.kill()
        p.kill()
        p.wait()
    ranks, rows = ps.sample({0: p.pid})
    assert ranks == [] and rows == []


def test_host_sample(tmp_path):
    h = host_sample(str(tmp_path / "not" / "yet"))  # output dirs appear late: parent's disk
    assert h["mem_total_mib"] > 0 and h["disk_free_mib"] > 0
    assert h["shm_free_mib"] is None or h["shm_free_mib"] >= 0


def test_sampler_respects_interval_and_stores(tmp_path):
    db = sqlite3.connect(tmp_path / "run.db")
    fake = FakePynvml(2, procs={1: [(os.getpid(), 700)]})
    s = TelemetrySampler(
        TelemetryStore(db),
        interval_s=1.0,
        nvml=Nvml(fake),
        rank_pids=lambda: {0: os.getpid()},
        out_dir=str(tmp_path),
    )
    t = 1_800_000_000.0
    for i in range(20):  # agent ticks every 0.5 s for 10 s
        s.tick(t + i * 0.5, [])
    assert s.samples == 10
    s.close()
    db.close()
    series = _series(tmp_path, "gpu", t, t + 10, metrics=["util", "mem_used_mib"])
    assert set(series["series"]) == {0, 1} and len(series["series"][1]["t"]) == 10
    latest = Store(tmp_path).telemetry_latest()
    assert latest["status"]["nvml"] == "ok"
    gp = latest["procs"]["gpu_procs"]
    assert gp == [{"gpu": 1, "pid": os.getpid(), "mib": 700.0, "rank": 0}]
    assert s.gpu_for_rank(0) == 1  # from NVML's process list
    assert s.gpu_util(0, t, t + 10) is not None


def test_nvml_calls_per_gpu_stay_within_budget_at_1hz(tmp_path):
    """Each NVML call costs ~0.4 ms of CPU on a virtualised H200: at 1 Hz the sampler makes at
    most 3 per GPU per second on average, never bunches every GPU's slow queries into one
    tick, and still reads utilisation and memory every second."""
    db = sqlite3.connect(tmp_path / "run.db")
    fake = FakePynvml(8, procs={5: [(os.getpid(), 900)]})
    s = TelemetrySampler(
        TelemetryStore(db),
        interval_s=1.0,
        nvml=Nvml(fake),
        rank_pids=lambda: {0: os.getpid()},
        out_dir=str(tmp_path),
        slow_s=10.0,
    )
    t = 1_800_000_000.0
    s.sample(t)  # the first sample reads everything
    first = fake.calls
    per_tick, samples = [], []
    for i in range(1, 101):
        c = fake.calls
        samples.append(s.sample(t + i))
        per_tick.append(fake.calls - c)
    s.close()
    per_gpu_s = (fake.calls - first) / (8 * 100)
    assert per_gpu_s <= 3.0, f"{per_gpu_s:.2f} NVML calls per GPU per second"
    assert fake.calls_by["util"] == fake.calls_by["mem"] == 8 * 101  # every GPU, every s
    assert fake.calls_by["power"] < fake.calls_by["util"] / 5  # the slow tier
    slow_set = 8  # power, temp, 2 clocks, 2 PCIe, NVLink, procs
    assert max(per_tick) <= 2 * 8 + slow_set  # at most one GPU's slow set per tick
    # slow fields carry the last known value; each GPU's is refreshed every 10 samples
    for smp in samples:
        assert all(g["power_w"] is not None and g["temp_c"] is not None for g in smp["gpus"])
    slow_ts = {g["slow_t"] for smp in samples for g in smp["gpus"] if g["gpu"] == 3}
    assert len(slow_ts) in (10, 11)
    assert all(
        smp["gpu_procs"] == [{"gpu": 5, "pid": os.getpid(), "mib": 900.0, "rank": 0}]
        for smp in samples
    )
    # NVLink rates come from counter deltas across the 10 s between two slow reads
    rates = {g["nvlink_rx_kbs"] for smp in samples[20:] for g in smp["gpus"]}
    assert rates == {5e5}
    series = _series(tmp_path, "gpu", t, t + 101, max_points=1000, metrics=["power_w"])
    assert all(v is not None for v in series["series"][0]["power_w"])


def test_process_sampler_reads_dead_and_live_processes_cheaply():
    """CPU % from two readings of a busy real process; a dead one drops out at once."""
    p = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: pass"])
    try:
        ps = ProcessSampler()
        ps.sample({0: p.pid})
        time.sleep(1.0)
        ranks, rows = ps.sample({0: p.pid})
        assert rows[0]["role"] == "rank" and rows[0]["cpu_pct"] > 10  # a spinning loop
        assert rows[0]["rss_mib"] > 1 and rows[0]["threads"] >= 1
    finally:
        p.kill()
        p.wait()
    assert ps.sample({0: p.pid}) == ([], [])
    ps.close()


def test_cost_bench_runs_on_the_fake_and_reports_tiers(tmp_path):
    """bench/telemetry_cost.py's CPU-runnable path (the lead runs it on real GPUs)."""
    import json
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench" / "telemetry_cost.py"
    r = subprocess.run(
        [
            sys.executable,
            str(bench),
            str(tmp_path),
            "--duration",
            "3",
            "--fake",
            "4",
            "--ranks",
            "2",
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "telemetry_cost.json").read_text())
    assert res["gpus"] == 4 and res["processes_sampled"] == 4
    fns = res["nvml_by_function"]
    assert fns["nvmlDeviceGetUtilizationRates"]["calls_per_gpu_per_s"] == 1.0
    assert fns["nvmlDeviceGetUtilizationRates"]["tier"] == "fast"
    assert res["nvml_calls_per_gpu_per_s"] <= 3.0
    assert set(res["parts_cpu_ms_mean"]) == {"nvml", "procs", "host", "store"}
