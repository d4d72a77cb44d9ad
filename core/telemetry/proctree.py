"""A run's process tree, read cheaply: direct children from /proc/<pid>/task/*/children (one
small read per thread) instead of psutil's children(), which walks the whole process table;
and the rank a process runs as, from the RANK variable torchrun gives it."""

from __future__ import annotations

import itertools
import os

import psutil


def task_children(pid: int) -> list[int] | None:
    """Direct children of pid; [] when it is gone; None where the kernel has no
    /proc/<pid>/task/<tid>/children (then walk_table is the way)."""
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return [] if os.path.isdir("/proc/self/task") else None
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"{base}/{tid}/children", "rb") as fh:
                out.extend(int(x) for x in fh.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"{base}/{tid}"):
                continue  # the thread ended meanwhile
            return None  # kernel without CONFIG_PROC_CHILDREN
        except OSError:
            continue
    return out


def children(pid: int) -> list[int]:
    kids = task_children(pid)
    return kids if kids is not None else walk_table([pid], depth=1).get(pid, [])


def descendants(pid: int) -> list[int]:
    """Every descendant of pid, parents before their children."""
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = task_children(todo.pop())
        if kids is None:
            return walk_table([pid]).get(pid, [])
        out.extend(kids)
        todo.extend(kids)
    return out


def walk_table(roots: list[int], depth: int | None = None) -> dict[int, list[int]]:
    """Descendants of each root by one walk over the whole process table (the fallback)."""
    by_parent: dict[int, list[int]] = {}
    for p in psutil.process_iter(["ppid"]):
        ppid = p.info.get("ppid")
        if ppid:
            by_parent.setdefault(ppid, []).append(p.pid)
    kids: dict[int, list[int]] = {}
    for root in roots:
        out: list[int] = []
        level, todo = 0, list(by_parent.get(root, ()))
        while todo and (depth is None or level < depth):
            out.extend(todo)
            todo = [c for pid in todo for c in by_parent.get(pid, ())]
            level += 1
        kids[root] = out
    return kids


def rank_of(pid: int) -> int | None:
    """The global rank a torchrun worker runs as (its RANK variable); None when it has none,
    is gone or is not ours to read."""
    try:
        value = psutil.Process(pid).environ().get("RANK")
        return int(value) if value is not None else None
    except (psutil.Error, OSError, ValueError):
        return None


def ranks_of(pids: list[int], known: dict[int, int | None]) -> dict[int, int | None]:
    """Each pid's rank: the one read before where there was one, else read now. A worker
    read between its fork and its exec still shows its parent's environment (no RANK):
    that None is asked again next time, never kept."""
    return {pid: known[pid] if known.get(pid) is not None else rank_of(pid) for pid in pids}


def rank_table(ranks: dict[int, int | None]) -> dict[str, int]:
    """rank → pid, as the run's state records it. A worker whose rank is not known yet takes
    the lowest rank no known worker holds, so it never hides a rank that was read."""
    table = {str(r): pid for pid, r in ranks.items() if r is not None}
    free = (i for i in itertools.count() if str(i) not in table)
    for pid, r in ranks.items():
        if r is None:
            table[str(next(free))] = pid
    return table
