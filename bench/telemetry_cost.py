"""Cost of the agent's telemetry sampler: CPU time per sample (GPUs + run processes + host).

    python bench/telemetry_cost.py OUTDIR [--duration 30] [--ranks 8] [--workers 4] [--fake N]
                                          [--slow-s 10]

Samples at 1 Hz for --duration seconds through the same TelemetrySampler + TelemetryStore the
agent uses (writing a scratch run.db), with --ranks stand-in rank processes (RANK set), each
with --workers child processes, so the process pass is as large as a real 8-GPU run's. NVML is
real when a driver is present; --fake N uses core/telemetry/fake.py (no GPU machines).

Every NVML call is counted and timed (CPU) by name, so the 8-GPU extrapolation is
    non-NVML CPU per sample + 8 x sum over calls (calls per GPU per second x CPU per call)
and the fast tier (every sample) and the slow tier (every --slow-s, spread over the samples)
are reported apart. Writes OUTDIR/telemetry_cost.json and prints it.
Target: < 1 % of one core at 1 Hz, 8 GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

from tunedeck.core.telemetry.fake import FakePynvml  # noqa: E402
from tunedeck.core.telemetry.nvml import Nvml  # noqa: E402
from tunedeck.core.telemetry.sampler import TelemetrySampler  # noqa: E402
from tunedeck.core.telemetry.store import TelemetryStore  # noqa: E402

# the NVML functions of each tier (core/telemetry/nvml.py: Nvml.sample / _slow_sample)
FAST_FNS = {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo"}


class TimedLib:
    """pynvml (or the fake) with every call counted and its CPU time summed, by name."""

    def __init__(self, lib):
        self._lib = lib
        self.calls: dict[str, int] = {}
        self.cpu: dict[str, float] = {}

    def __getattr__(self, name):
        attr = getattr(self._lib, name)
        if not callable(attr) or not name.startswith("nvmlDevice") or isinstance(attr, type):
            return attr

        def timed(*args, **kw):
            c0 = time.process_time()
            try:
                return attr(*args, **kw)
            finally:
                self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c0
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed

    def snapshot(self) -> tuple[dict[str, int], dict[str, float]]:
        return dict(self.calls), dict(self.cpu)


RANK_CODE = (
    "import subprocess,sys,time;"
    "kids=[subprocess.Popen([sys.executable,'-c','import time;time.sleep(3600)'])"
    " for _ in range({workers})];time.sleep(3600)"
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--fake", type=int, default=0, help="use a fake NVML with N GPUs")
    ap.add_argument("--slow-s", type=float, default=10.0, help="seconds between slow reads")
    a = ap.parse_args(argv)
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)

    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_CODE.format(workers=a.workers)],
            env=dict(os.environ, RANK=str(r)),
        )
        for r in range(a.ranks)
    ]
    try:
        time.sleep(2.0)  # let the stand-ins start their workers
        if a.fake:
            lib = FakePynvml(a.fake)
        else:
            try:
                import pynvml as lib
            except ImportError:
                lib = None
        timed = TimedLib(lib) if lib is not None else None
        nvml = Nvml(timed)
        nvml.init()
        db_path = out / "telemetry_cost_run.db"
        for p in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
            p.unlink(missing_ok=True)
        db = sqlite3.connect(db_path)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        sampler = TelemetrySampler(
            TelemetryStore(db),
            interval_s=1.0,
            nvml=nvml,
            rank_pids=lambda: {i: p.pid for i, p in enumerate(ranks)},
            out_dir=str(out),
            slow_s=a.slow_s,
        )
        first_c = time.process_time()
        sampler.sample()  # the first sample reads everything (slow tier of every GPU)
        first_ms = (time.process_time() - first_c) * 1e3
        calls0, cpu0 = timed.snapshot() if timed else ({}, {})
        cpu, wall, parts = [], [], []
        t_start = time.monotonic()
        end = t_start + a.duration
        while time.monotonic() < end:
            tick = time.monotonic()
            c0, w0 = time.process_time(), time.perf_counter()
            last = sampler.sample()
            c1, w1 = time.process_time(), time.perf_counter()
            cpu.append(c1 - c0)
            wall.append(w1 - w0)
            parts.append(dict(sampler.costs))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        seconds = len(cpu)  # one sample per second
        db.close()
        sampler.procs.close()
        gpus = nvml.count
        calls1, cpu1 = timed.snapshot() if timed else ({}, {})
        per_fn = {}
        for name, n in calls1.items():
            dn = n - calls0.get(name, 0)
            if dn <= 0:
                continue
            per_call = (cpu1[name] - cpu0.get(name, 0.0)) / dn
            per_fn[name] = {
                "tier": "fast" if name in FAST_FNS else "slow",
                "calls_per_gpu_per_s": round(dn / (gpus * seconds), 3),
                "cpu_ms_per_call": round(per_call * 1e3, 4),
            }

        def tier_ms(tier):  # CPU ms per GPU per second spent in one tier's calls
            return sum(
                f["calls_per_gpu_per_s"] * f["cpu_ms_per_call"]
                for f in per_fn.values()
                if tier in (None, f["tier"])
            )

        def mean_part(k):
            return statistics.mean(pt.get(k, 0.0) for pt in parts) * 1e3

        nvml_ms = mean_part("nvml")
        rest_ms = statistics.mean(cpu) * 1e3 - nvml_ms
        per_gpu_ms = tier_ms(None) if per_fn else (nvml_ms / gpus if gpus else 0.0)
        calls_per_gpu_s = sum(f["calls_per_gpu_per_s"] for f in per_fn.values())
        res = {
            "host": platform.node(),
            "python": platform.python_version(),
            "nvml": nvml.status,
            "nvml_message": nvml.message,
            "driver": nvml.driver,
            "gpu_names": nvml.names,
            "gpus": gpus,
            "fake_nvml": bool(a.fake),
            "slow_s": sampler.slow_s,
            "samples": seconds,
            "processes_sampled": len(last["procs"]),
            "cpu_ms_first_sample": round(first_ms, 3),
            "cpu_ms_per_sample_mean": round(statistics.mean(cpu) * 1e3, 3),
            "cpu_ms_per_sample_p95": round(sorted(cpu)[int(0.95 * (len(cpu) - 1))] * 1e3, 3),
            "cpu_ms_per_sample_max": round(max(cpu) * 1e3, 3),
            "wall_ms_per_sample_max": round(max(wall) * 1e3, 3),
            "parts_cpu_ms_mean": {
                k: round(mean_part(k), 3) for k in ("nvml", "procs", "host", "store")
            },
            "nvml_calls_per_gpu_per_s": round(calls_per_gpu_s, 3),
            "nvml_by_function": per_fn,
            "nvml_cpu_ms_per_gpu_per_s": round(per_gpu_ms, 3),
            "nvml_fast_tier_cpu_ms_per_gpu_per_s": round(tier_ms("fast"), 3),
            "nvml_slow_tier_cpu_ms_per_gpu_per_s": round(tier_ms("slow"), 3),
            "host_procs_store_cpu_ms": round(rest_ms, 3),
            "core_pct_at_1hz": round(statistics.mean(cpu) * 100, 3),
            "core_pct_at_1hz_8gpus_extrapolated": round((rest_ms + 8 * per_gpu_ms) / 10, 3),
            "target_core_pct": 1.0,
            "db_bytes": db_path.stat().st_size,
        }
        res["meets_target"] = res["core_pct_at_1hz_8gpus_extrapolated"] < 1.0
        (out / "telemetry_cost.json").write_text(json.dumps(res, indent=2))
        print(json.dumps(res, indent=2))
        return 0
    finally:
        for p in ranks:
            try:
                import psutil

                for k in psutil.Process(p.pid).children(recursive=True):
                    k.kill()
            except Exception:
                pass
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
