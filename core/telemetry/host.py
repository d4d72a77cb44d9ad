"""Host and per-process samples: the ranks of a run and their DataLoader workers.

Cheap at 1 Hz because most of it is not redone each sample. On Linux each process's
/proc/<pid>/stat stays open and is re-read in place (one pread gives CPU times, threads and
RSS; an fd is bound to its process, so a reused pid can never be mistaken for the old one);
elsewhere psutil.Process objects are kept, in oneshot(). Workers are found every `rescan_s`
per rank, one rank's turn per sample, from /proc/<pid>/task/*/children (no walk over the
whole process table, which psutil's children() does). Ranks come numbered (rank → pid, the
agent's record); a rank's children are its DataLoader workers.
/dev/shm and disk free are read every SLOW_HOST_S; samples in between carry the last value.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any

import psutil

from tunedeck.core.telemetry import proctree

HOST_METRICS = ("cpu_pct", "mem_used_mib", "mem_total_mib", "shm_free_mib", "disk_free_mib")
RANK_METRICS = ("cpu_pct", "rss_mib", "threads", "workers", "workers_cpu_pct", "workers_rss_mib")

_MIB = 1 / 2**20
SLOW_HOST_S = 10.0
_LINUX = sys.platform.startswith("linux") and os.path.exists("/proc/self/stat")
_TICK = os.sysconf("SC_CLK_TCK") if _LINUX else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if _LINUX else 4096
_free_cache: dict[str | None, tuple[float, dict]] = {}


def host_sample(out_dir: str | None, slow_s: float = SLOW_HOST_S) -> dict[str, Any]:
    """Host CPU %, memory, /dev/shm free and disk free under the run's output directory
    (these two re-read every `slow_s`; in between the last values)."""
    vm = psutil.virtual_memory()
    s: dict[str, Any] = {
        "cpu_pct": round(psutil.cpu_percent(None), 1),  # since the previous call
        "mem_used_mib": round((vm.total - vm.available) * _MIB),
        "mem_total_mib": round(vm.total * _MIB),
    }
    now = time.monotonic()
    hit = _free_cache.get(out_dir)
    if hit is None or now - hit[0] >= slow_s:
        hit = (
            now,
            {
                "shm_free_mib": _free_mib("/dev/shm"),
                "disk_free_mib": _free_mib(_existing(out_dir)) if out_dir else None,
            },
        )
        _free_cache[out_dir] = hit
    s.update(hit[1])
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


class _StatFile:
    """/proc/<pid>/stat kept open: CPU %, RSS and threads from one pread per sample."""

    __slots__ = ("fd", "last")

    def __init__(self, pid: int):
        self.fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        self.last: tuple[float, float] | None = None
        try:
            self.read()  # prime: CPU % needs two readings
        except OSError:
            self.close()
            raise

    def read(self) -> dict[str, Any]:
        """OSError (ESRCH) once the process is gone, even if its pid was reused."""
        raw = os.pread(self.fd, 4096, 0)
        # the command name may hold spaces and parentheses: fields start after the last ')'
        f = raw[raw.rindex(b")") + 2 :].split()
        # fields 14, 15 (utime, stime), 20 (num_threads), 24 (rss pages), counted from 1
        cpu = (int(f[11]) + int(f[12])) / _TICK
        now = time.monotonic()
        pct = 0.0
        if self.last is not None and now > self.last[0]:
            pct = 100.0 * (cpu - self.last[1]) / (now - self.last[0])
        self.last = (now, cpu)
        return {
            "cpu_pct": round(max(0.0, pct), 1),
            "rss_mib": round(int(f[21]) * _PAGE * _MIB, 1),
            "threads": int(f[17]),
        }

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


class _PsutilStat:
    """The same readings through psutil, where there is no /proc."""

    __slots__ = ("p",)

    def __init__(self, pid: int):
        self.p = psutil.Process(pid)
        self.p.cpu_percent(None)  # prime: the first reading is meaningless

    def read(self) -> dict[str, Any]:
        with self.p.oneshot():
            return {
                "cpu_pct": round(self.p.cpu_percent(None), 1),
                "rss_mib": round(self.p.memory_info().rss * _MIB, 1),
                "threads": self.p.num_threads(),
            }

    def close(self) -> None:
        pass


class ProcessSampler:
    """Samples known pids every time; looks for new DataLoader workers of a rank only every
    `rescan_s` (a new rank at once), one rank per sample, so no tick pays for all ranks."""

    def __init__(self, rescan_s: float = 10.0):
        self._stats: dict[int, _StatFile | _PsutilStat] = {}
        self.rescan_s = rescan_s
        self._kids: dict[int, list[int]] = {}
        self._kids_at: dict[int, float] = {}

    def _children(self, rank_pids: list[int]) -> dict[int, list[int]]:
        now = time.monotonic()
        for pid in list(self._kids):
            if pid not in rank_pids:
                self._kids.pop(pid, None)
                self._kids_at.pop(pid, None)
        new = [p for p in rank_pids if p not in self._kids_at]
        due = [
            p for p in rank_pids if p in self._kids_at and now - self._kids_at[p] >= self.rescan_s
        ]
        # new ranks at once; of the known ones only the most overdue this sample, unless
        # rescan_s is 0 (every sample, as tests ask)
        todo = new + (due if self.rescan_s <= 0 else sorted(due, key=self._kids_at.__getitem__)[:1])
        if not todo:
            return self._kids
        for root in todo:
            self._kids[root] = proctree.descendants(root)
            self._kids_at[root] = now
        return self._kids

    def _stat(self, pid: int):
        st = self._stats.get(pid)
        if st is None:
            try:
                st = _StatFile(pid) if _LINUX else _PsutilStat(pid)
            except (OSError, psutil.Error, ValueError, IndexError):
                return None
            self._stats[pid] = st
        return st

    def sample(self, rank_pids: dict[int, int]) -> tuple[list[dict], list[dict]]:
        """(per-rank aggregates, per-process rows) for the rank processes (rank → pid) and
        their workers."""
        ranks, rows = [], []
        alive: set[int] = set()
        children = self._children(list(rank_pids.values()))
        for rank, pid in sorted(rank_pids.items()):
            row = self._one(pid)
            if row is None:
                continue
            row = {"pid": pid, "rank": rank, "role": "rank", **row}
            alive.add(pid)
            rows.append(row)
            agg = {
                "rank": rank,
                "pid": pid,
                "cpu_pct": row["cpu_pct"],
                "rss_mib": row["rss_mib"],
                "threads": row["threads"],
                "workers": 0,
                "workers_cpu_pct": 0.0,
                "workers_rss_mib": 0.0,
            }
            for kid in children.get(pid, ()):
                w = self._one(kid)
                if w is None:
                    continue
                w = {"pid": kid, "rank": rank, "role": "worker", **w}
                alive.add(kid)
                rows.append(w)
                agg["workers"] += 1
                agg["workers_cpu_pct"] = round(agg["workers_cpu_pct"] + w["cpu_pct"], 1)
                agg["workers_rss_mib"] = round(agg["workers_rss_mib"] + w["rss_mib"], 1)
            ranks.append(agg)
        for pid in list(self._stats):  # forget the dead: pids get reused
            if pid not in alive:
                self._stats.pop(pid).close()
        return ranks, rows

    def _one(self, pid: int) -> dict | None:
        st = self._stat(pid)
        if st is None:
            return None
        try:
            return st.read()
        except (OSError, psutil.Error, ValueError, IndexError):
            return None

    def close(self) -> None:
        for st in self._stats.values():
            st.close()
        self._stats.clear()
