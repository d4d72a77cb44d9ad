"""The agent's telemetry monitor: one sample (GPUs, run processes, host) per interval.

Called from the agent's tick (~0.5 s); it does nothing between intervals, so NVML is touched
only at run.telemetry_interval_s. Budget: < 1 % of one core at 1 Hz on 8 GPUs. So each sample
reads only what the monitor and the starvation detector need every second (GPU utilisation
and memory; per-process CPU/RSS); the rest (power, temperature, clocks, PCIe/NVLink, GPU
process lists, /dev/shm and disk free, the search for new DataLoader workers) is read every
`slow_s`, spread over the samples, and stored samples carry the last known value in between
("slow_t" in each latest GPU record says when it was read). `costs` holds the CPU seconds of
the last sample's parts; bench/telemetry_cost.py measures the whole on real GPUs.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any
from collections.abc import Callable

from tunedeck.core.telemetry.host import ProcessSampler, host_sample
from tunedeck.core.telemetry.nvml import Nvml
from tunedeck.core.telemetry.store import TelemetryStore


class TelemetrySampler:
    def __init__(
        self,
        tstore: TelemetryStore | None,
        interval_s: float = 1.0,
        rank_pids: Callable[[], dict[int, int]] = dict,
        out_dir: str | None = None,
        nvml: Nvml | None = None,
        keep_recent_s: float = 120.0,
        slow_s: float = 10.0,
    ):
        self.tstore = tstore
        self.interval_s = max(0.1, float(interval_s))
        self.slow_s = max(self.interval_s, float(slow_s))
        self.rank_pids = rank_pids
        self.out_dir = out_dir
        self.nvml = nvml or Nvml()
        self.nvml.slow_every = max(1, round(self.slow_s / self.interval_s))
        self.procs = ProcessSampler(rescan_s=self.slow_s)
        self.costs: dict[str, float] = {}
        self.last_t = 0.0
        self.samples = 0
        # recent GPU utilisation and the pid → GPU map, for the live detectors
        self.recent_util: dict[int, deque] = {}
        self.keep_recent_s = keep_recent_s
        self.gpu_of_rank: dict[int, int] = {}
        self._status_saved = None

    def tick(self, now: float, new_events: list[dict] | None = None) -> None:
        if now - self.last_t < self.interval_s:
            return
        self.last_t = now
        self.sample(now)

    def close(self, new_events: list[dict] | None = None) -> None:
        if self.tstore is not None:
            self.tstore.flush_buckets()
        self.nvml.close()
        self.procs.close()

    def sample(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        c0 = time.process_time()
        gpus = self.nvml.sample(now)
        c1 = time.process_time()
        ranks, rows = self.procs.sample(dict(self.rank_pids() or {}))
        c2 = time.process_time()
        host = host_sample(self.out_dir, self.slow_s)
        c3 = time.process_time()
        rank_of_pid = {r["pid"]: r["rank"] for r in rows}
        gpu_procs = []
        for g in gpus:
            for pid, mib in g.pop("procs", []):
                rank = rank_of_pid.get(pid)
                gpu_procs.append({"gpu": g["gpu"], "pid": pid, "mib": mib, "rank": rank})
                if rank is not None and rank_of_pid and pid in rank_of_pid:
                    self.gpu_of_rank[rank] = g["gpu"]
            dq = self.recent_util.setdefault(g["gpu"], deque())
            dq.append((now, g["util"]))
            while dq and dq[0][0] < now - self.keep_recent_s:
                dq.popleft()
        status = {
            "nvml": self.nvml.status,
            "message": self.nvml.message,
            "driver": self.nvml.driver,
            "gpus": self.nvml.names,
            "interval_s": self.interval_s,
        }
        if self.tstore is not None:
            st = self.tstore
            st.add("gpu", now, [(g["gpu"], g) for g in gpus])
            st.add("rank", now, [(r["rank"], r) for r in ranks])
            st.add("host", now, [(0, host)])
            if status != self._status_saved:
                st.set_latest("status", now, status)
                self._status_saved = status
            st.set_latest("gpus", now, gpus)
            st.set_latest("procs", now, {"ranks": ranks, "procs": rows, "gpu_procs": gpu_procs})
            st.set_latest("host", now, host)
            st.commit()
        self.costs = {
            "nvml": c1 - c0,
            "procs": c2 - c1,
            "host": c3 - c2,
            "store": time.process_time() - c3,
        }
        self.samples += 1
        return {
            "gpus": gpus,
            "ranks": ranks,
            "procs": rows,
            "host": host,
            "gpu_procs": gpu_procs,
            "status": status,
        }

    # -- for the detectors ----------------------------------------------------------------
    def gpu_util(self, gpu: int, t0: float, t1: float) -> float | None:
        """Mean GPU utilisation between t0 and t1 from the recent samples (None: no data)."""
        vals = [u for t, u in self.recent_util.get(gpu, ()) if t0 <= t <= t1 and u is not None]
        return sum(vals) / len(vals) if vals else None

    def gpu_for_rank(self, rank: int, local_world: int | None = None) -> int | None:
        """The GPU a rank holds memory on; without NVML process info, GPU == local rank."""
        if rank in self.gpu_of_rank:
            return self.gpu_of_rank[rank]
        if not self.recent_util:
            return None
        g = rank % local_world if local_world else rank
        return g if g in self.recent_util else None
