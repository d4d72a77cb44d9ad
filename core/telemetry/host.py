"""Host and per-process samples through psutil: the ranks of a run and their DataLoader workers.

psutil.Process objects are kept between samples, so `cpu_percent()` measures the interval
since the previous sample without sleeping. A rank's number comes from its RANK environment
variable (read once per pid); its children are its DataLoader workers.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import psutil

HOST_METRICS = ("cpu_pct", "mem_used_mib", "mem_total_mib", "shm_free_mib", "disk_free_mib")
RANK_METRICS = ("cpu_pct", "rss_mib", "threads", "workers", "workers_cpu_pct",
                "workers_rss_mib")

_MIB = 1 / 2**20


def host_sample(out_dir: str | None) -> dict[str, Any]:
    """Host CPU %, memory, /dev/shm free and disk free under the run's output directory."""
    vm = psutil.virtual_memory()
    s: dict[str, Any] = {
        "cpu_pct": round(psutil.cpu_percent(None), 1),   # since the previous call
        "mem_used_mib": round((vm.total - vm.available) * _MIB),
        "mem_total_mib": round(vm.total * _MIB),
        "shm_free_mib": _free_mib("/dev/shm"),
        "disk_free_mib": _free_mib(_existing(out_dir)) if out_dir else None,
    }
    return s


def _free_mib(path: str | None) -> float | None:
    if not path:
        return None
    try:
        return round(shutil.disk_usage(path).free * _MIB)
    except OSError:
        return None


def _existing(path: str) -> str | None:
    """The directory itself, or its nearest existing parent (output dirs appear late)."""
    p = os.path.abspath(path)
    while p and not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent
    return p


class ProcessSampler:
    """Samples known pids every time; looks for new DataLoader workers only every
    `rescan_s`, in one pass over the process table (psutil's children() walks the whole
    table once per call, which at 8 ranks was 90 % of the sampler's cost)."""

    def __init__(self, rescan_s: float = 10.0):
        self._procs: dict[int, psutil.Process] = {}
        self._rank: dict[int, int | None] = {}
        self.rescan_s = rescan_s
        self._kids: dict[int, list[int]] = {}
        self._kids_at = -1e18
        self._kids_for: list[int] = []

    def _children(self, rank_pids: list[int]) -> dict[int, list[int]]:
        now = time.monotonic()
        if rank_pids == self._kids_for and now - self._kids_at < self.rescan_s:
            return self._kids
        by_parent: dict[int, list[int]] = {}
        for p in psutil.process_iter(["ppid"]):
            ppid = p.info.get("ppid")
            if ppid:
                by_parent.setdefault(ppid, []).append(p.pid)
        kids: dict[int, list[int]] = {}
        for root in rank_pids:
            out, todo = [], list(by_parent.get(root, ()))
            while todo:
                pid = todo.pop()
                out.append(pid)
                todo.extend(by_parent.get(pid, ()))
            kids[root] = out
        self._kids, self._kids_at, self._kids_for = kids, now, list(rank_pids)
        return kids

    def _proc(self, pid: int) -> psutil.Process | None:
        p = self._procs.get(pid)
        if p is None:
            try:
                p = psutil.Process(pid)
                p.cpu_percent(None)  # prime: the first reading is meaningless
            except psutil.Error:
                return None
            self._procs[pid] = p
        return p

    def rank_of(self, pid: int) -> int | None:
        if pid not in self._rank:
            rank = None
            p = self._proc(pid)
            try:
                env = p.environ() if p else {}
                rank = int(env["RANK"]) if "RANK" in env else None
            except (psutil.Error, ValueError, KeyError):
                rank = None
            self._rank[pid] = rank
        return self._rank[pid]

    def sample(self, rank_pids: list[int]) -> tuple[list[dict], list[dict]]:
        """(per-rank aggregates, per-process rows) for the rank processes and their workers."""
        ranks, rows = [], []
        alive: set[int] = set()
        children = self._children(list(rank_pids))
        for i, pid in enumerate(rank_pids):
            p = self._proc(pid)
            if p is None:
                continue
            rank = self.rank_of(pid)
            if rank is None:
                rank = i
            row = self._one(p, rank, "rank")
            if row is None:
                continue
            alive.add(pid)
            rows.append(row)
            agg = {"rank": rank, "pid": pid, "cpu_pct": row["cpu_pct"],
                   "rss_mib": row["rss_mib"], "threads": row["threads"], "workers": 0,
                   "workers_cpu_pct": 0.0, "workers_rss_mib": 0.0}
            for kid in children.get(pid, ()):
                kp = self._proc(kid)
                w = self._one(kp, rank, "worker") if kp else None
                if w is None:
                    continue
                alive.add(kid)
                rows.append(w)
                agg["workers"] += 1
                agg["workers_cpu_pct"] = round(agg["workers_cpu_pct"] + w["cpu_pct"], 1)
                agg["workers_rss_mib"] = round(agg["workers_rss_mib"] + w["rss_mib"], 1)
            ranks.append(agg)
        for pid in list(self._procs):     # forget the dead: pids get reused
            if pid not in alive:
                self._procs.pop(pid, None)
                self._rank.pop(pid, None)
        return ranks, rows

    @staticmethod
    def _one(p: psutil.Process, rank: int, role: str) -> dict | None:
        try:
            with p.oneshot():
                return {"pid": p.pid, "rank": rank, "role": role,
                        "cpu_pct": round(p.cpu_percent(None), 1),
                        "rss_mib": round(p.memory_info().rss * _MIB, 1),
                        "threads": p.num_threads()}
        except psutil.Error:
            return None
