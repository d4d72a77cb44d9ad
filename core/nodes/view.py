"""Every node of a run in one table, from the head's run directory only (what the links
wrote there): for `tunedeck nodes`, the monitor and `tunedeck stop`'s report.

For each node: its host, status (its agent's, as last streamed), whether the head reaches
it now, its ranks, the newest step of each rank and the slowest one, GPUs (count and mean
utilisation, from its telemetry) and how many findings name it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tunedeck.core.nodes.remote import TERMINAL
from tunedeck.core.rundir import RunDir, read_json
from tunedeck.core.telemetry.store import read_latest_file

STEP_TAIL = 2048  # a step event line is ~250 bytes: the last few are enough


def last_step(path: str | Path) -> tuple[int | None, float | None]:
    """(newest step, its step time) of one rank's event file, read from its end only: one
    pread, and only the line of the newest step event is parsed (1,024 ranks per frame)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None, None
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, STEP_TAIL, max(0, size - STEP_TAIL))
    finally:
        os.close(fd)
    end = len(data)
    while end > 0:
        start = data.rfind(b"\n", 0, end - 1) + 1
        line = data[start:end]
        end = start
        if b'"step"' not in line or (start == 0 and size > STEP_TAIL):
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("kind") == "step" and isinstance(e.get("step"), int):
            s = e.get("step_s")
            return e["step"], float(s) if isinstance(s, (int, float)) else None
    return None, None


def _gpus(snapshot: dict[str, Any]) -> dict[str, Any]:
    gpus = [g for g in snapshot.get("gpus") or [] if isinstance(g, dict)]
    utils = [g.get("util") for g in gpus if isinstance(g.get("util"), (int, float))]
    return {"gpus": len(gpus), "gpu_util": sum(utils) / len(utils) if utils else None}


def node_telemetry(run: RunDir, node: int, line: dict[str, Any] | None = None) -> dict[str, Any]:
    """The newest telemetry sample the head holds for node `node` (>= 1), shaped as run.db's
    latest snapshot plus its time `t`: {"t", "status", "gpus", "procs", "host"}; {} when it
    holds none. Over ssh, the last line of nodes/node<k>/telemetry.jsonl, which the node's
    streamer appends a line to per new sample of its agent (written in place on a shared
    filesystem; `line`: that line, when the caller read it already); under Slurm nothing
    streams, so the node's own run.db, in its folder `<run id>.node<k>` beside the run's on
    the shared filesystem. Read-only, one pread or one query per node."""
    if line is None:
        line = last_json_line(run.path / "nodes" / f"node{node}" / "telemetry.jsonl")
    if line:
        return line
    db_path = run.path.parent / f"{run.path.name}.node{node}" / "run.db"
    if not db_path.exists():
        return {}
    snap, times = read_latest_file(db_path)
    out: dict[str, Any] = dict(snap)
    stamped = [times[k] for k in snap if k in times and k != "status"]  # status: when it changed
    if stamped:
        out["t"] = max(stamped)
    return out if set(out) - {"t"} else {}


NODE_TEL_TAIL = (16 << 10, 256 << 10)  # a node of 8 GPUs and 8 ranks: ~3 KiB a line


def last_json_line(path: str | Path) -> dict[str, Any]:
    """The last whole JSON object line of a file, read from its end (one pread; a second,
    longer one only for a line longer than the first read)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return {}
    try:
        size = os.fstat(fd).st_size
        for tail in NODE_TEL_TAIL:
            data = os.pread(fd, tail, max(0, size - tail))
            lines = data.split(b"\n")
            if size > tail:
                lines = lines[1:]  # the first may be cut
            for raw in reversed(lines[:-1]):  # the last has no newline yet: being written
                try:
                    d = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(d, dict):
                    return d
            if size <= tail:
                break
    finally:
        os.close(fd)
    return {}


def node_rows(
    run_dir: str | Path,
    findings: list[dict[str, Any]] | None = None,
    now: float | None = None,
    plan: dict[str, Any] | None = None,
    samples: bool = False,
) -> list[dict[str, Any]]:
    """`plan`: plan.json as the caller read it once (it never changes after launch);
    `samples`: each other node's newest telemetry sample as its row's `telemetry`."""
    run = RunDir(run_dir)
    now = time.time() if now is None else now
    plan = run.read_plan() if plan is None else plan
    nproc = int(plan.get("nproc_per_node") or 0)
    nodes = plan.get("nodes") or []
    head = run.read_state() or {}
    base = str(run.path)
    rows = []
    for n in nodes:
        k = int(n.get("node_rank") or 0)
        ranks = list(range(k * nproc, (k + 1) * nproc))
        row: dict[str, Any] = {"node": k, "host": n.get("host"), "ranks": ranks}
        src, st = run, head
        if k == 0:
            row.update(status=head.get("status"), reach="here", message=head.get("message"))
            if head.get("slurm_job") and head.get("status") not in (
                "succeeded",
                "failed",
                "stopped",
            ):
                from tunedeck.core.nodes.slurm import queue_state

                row["slurm"] = queue_state(str(head["slurm_job"])) or {
                    "job": str(head["slurm_job"]),
                    "state": "gone",
                }
            row.update(_gpus(read_latest_file(run.db)[0]))
        else:
            nd = f"{base}/nodes/node{k}"  # strings: 128 nodes per frame
            link = read_json(f"{nd}/link.json") or {}
            st = read_json(f"{nd}/state.json") or {}
            if not link and os.path.exists(f"{base}.node{k}/state.json"):
                # Slurm: node k's run folder is next to the run's, on the shared filesystem
                src = RunDir(f"{base}.node{k}")
                st = src.read_state() or {}
            if link.get("ended"):
                reach = "done"
            elif link.get("gone"):  # its streamer may still answer; its agent is dead
                reach = "lost"
            elif link.get("connected"):
                reach = "connected"
            elif link:
                reach = "reconnecting" if link.get("started") else "unreached"
            elif src is not run:
                reach = "shared fs"
            elif head.get("slurm_job"):  # Slurm starts the node's task; its folder comes then
                reach = "never started" if head.get("status") in TERMINAL else "waiting for Slurm"
            else:
                reach = "not started by tunedeck"
            status = st.get("status") or ("unreached" if link else None)
            if link.get("gone") and status not in TERMINAL:
                status = "lost"  # its agent died: the last state it sent is stale
            elif reach == "reconnecting" and head.get("status") in TERMINAL:
                reach = "unreached"  # the head has hung up: nothing reconnects any more
            row.update(
                status=status,
                reach=reach,
                # a dead agent is the cause; the ssh error that may follow it is a consequence
                message="; ".join(str(x) for x in (link.get("gone"), link.get("error")) if x)
                or st.get("message"),
                drops=link.get("drops", 0),
                shared_fs=bool(link.get("shared")),
                last_seen_s=(now - link["last_seen"])
                if isinstance(link.get("last_seen"), (int, float))
                else None,
            )
            line = last_json_line(f"{nd}/telemetry.jsonl")
            row.update(_gpus(line))
            if samples:  # the monitor's hardware pane: the whole sample, read once
                row["telemetry"] = node_telemetry(run, k, line)
        ev = f"{base}/events" if src is run else str(src.events)
        steps = {r: last_step(f"{ev}/rank{r}.jsonl") for r in ranks}
        done = {r: s for r, (s, _) in steps.items() if s is not None}
        row["step"] = max(done.values()) if done else None
        if done:
            slow = max(steps, key=lambda r: ((steps[r][1] or 0.0), -(steps[r][0] or 0)))
            row["slowest_rank"] = (
                slow if steps[slow][1] is not None else min(done, key=lambda r: done[r])
            )
        else:
            row["slowest_rank"] = None
        # under Slurm the plan knew no host: each node's task recorded its own name
        named = st.get("net")
        if isinstance(named, dict) and named.get("host"):
            row["host"] = named["host"]
        row["findings"] = sum(1 for f in findings or [] if f.get("node") == k)
        rows.append(row)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> list[str]:
    """`tunedeck nodes` as text; a link marked +fs shares the head's filesystem (the node's
    records are written in place, not streamed)."""
    out = [
        f"{'node':>4}  {'host':<16} {'status':<10} {'link':<13} {'ranks':<9} {'step':>7} "
        f"{'slowest':>7} {'gpus':>4} {'finds':>5}"
    ]
    for r in rows:
        ranks = f"{r['ranks'][0]}-{r['ranks'][-1]}" if r["ranks"] else "-"
        reach = str(r.get("reach")) + ("+fs" if r.get("shared_fs") else "")
        out.append(
            f"{r['node']:>4}  {str(r.get('host') or '')[:16]:<16} "
            f"{str(r.get('status') or '-')[:10]:<10} {reach[:13]:<13} "
            f"{ranks:<9} {r['step'] if r['step'] is not None else '-':>7} "
            f"{r['slowest_rank'] if r['slowest_rank'] is not None else '-':>7} "
            f"{r.get('gpus', 0):>4} {r['findings']:>5}"
        )
        if r.get("slurm"):
            q = r["slurm"]
            out.append(
                f"      Slurm job {q['job']}: {q['state']}"
                + (f" ({q['reason']})" if q.get("reason") not in (None, "", "None") else "")
            )
        if r.get("message") and r.get("status") not in ("running", "succeeded"):
            out.append(f"      {str(r['message'])[:90]}")
    return out
