"""128 nodes × 8 GPUs by simulation: is a 1,024-rank run ingested live, and is the per-node
view cheap enough for the monitor?

A run folder laid out as the head of an ssh-launched run holds it (plan.json with 128 nodes,
nodes/node<k>/{link,state}.json as the links write them). A writer process appends, every
second for every rank, one step event (the trainer's schema) to events/rank<r>.jsonl and one
log line to its rank log, and per node one telemetry line with 8 GPUs to
nodes/node<k>/telemetry.jsonl: what the head's links write as the nodes' frames arrive.
Meanwhile this process does what the head's agent does every 0.5 s (Store.ingest of every
event file into run.db), timing the lag from each event's write to its ingest, and renders
the per-node table (tunedeck.core.nodes.view: node_rows + format_rows) as the monitor would,
timing each frame.

    python bench/multinode_sim.py [--nodes 128] [--gpus 8] [--seconds 30] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

TICK_S = 0.5


def layout(root: Path, nodes: int, gpus: int) -> None:
    from tunedeck.core.rundir import write_json_atomic

    (root / "events").mkdir(parents=True)
    write_json_atomic(
        root / "plan.json",
        {
            "run_id": root.name,
            "backend": "builtin",
            "nproc_per_node": gpus,
            "nnodes": nodes,
            "nodes": [
                {"node_rank": k, "host": f"gpu{k:03d}", "argv": [], "env": {}, "cwd": ""}
                for k in range(nodes)
            ],
        },
    )
    write_json_atomic(
        root / "state.json",
        {"run_id": root.name, "status": "running", "message": "", "created": time.time()},
    )
    for k in range(1, nodes):
        d = root / "nodes" / f"node{k}"
        d.mkdir(parents=True)
        write_json_atomic(
            d / "link.json",
            {
                "node": k,
                "host": f"gpu{k:03d}",
                "connected": True,
                "started": True,
                "drops": 0,
                "last_seen": time.time(),
                "error": "",
                "gone": "",
                "ended": False,
            },
        )
        write_json_atomic(d / "state.json", {"status": "running", "message": ""})


def writer(root: str, nodes: int, gpus: int, seconds: float) -> None:
    root_p = Path(root)
    ranks = nodes * gpus
    ev = [open(root_p / "events" / f"rank{r}.jsonl", "a", buffering=1) for r in range(ranks)]
    logs = []
    for r in range(ranks):
        d = root_p / "logs" / f"node{r // gpus}" / "sim_0" / "attempt_0" / str(r % gpus)
        d.mkdir(parents=True, exist_ok=True)
        logs.append(open(d / "stdout.log", "a", buffering=1))
    tel = [
        open(root_p / "nodes" / f"node{k}" / "telemetry.jsonl", "a", buffering=1)
        for k in range(1, nodes)
    ]
    end = time.time() + seconds
    step = 0
    while time.time() < end:
        t0 = time.time()
        step += 1
        for r in range(ranks):
            t = time.time()
            ev[r].write(
                json.dumps(
                    {
                        "t": t,
                        "kind": "step",
                        "rank": r,
                        "step": step,
                        "loss": 2.0 + 1.0 / step,
                        "lr": 1e-4,
                        "grad_norm": 0.5,
                        "tokens": 8192,
                        "step_s": 1.0 + (r == 777) * 0.3,
                        "data_wait_s": 0.004,
                        "mem_gib": 61.3,
                    }
                )
                + "\n"
            )
            logs[r].write(f"step {step} loss {2.0 + 1.0 / step:.4f}\n")
        for i, f in enumerate(tel):
            f.write(
                json.dumps(
                    {
                        "t": time.time(),
                        "node": i + 1,
                        "gpus": [
                            {"index": g, "util": 95.0, "mem_used_mib": 70000.0} for g in range(gpus)
                        ],
                    }
                )
                + "\n"
            )
        time.sleep(max(0.0, 1.0 - (time.time() - t0)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--dir")
    a = ap.parse_args()
    from tunedeck.core.nodes.view import format_rows, node_rows
    from tunedeck.core.store.store import Store

    base = Path(a.dir or tempfile.mkdtemp(prefix="td-multinode-"))
    root = base / "20260101-000000-sim-0000"
    layout(root, a.nodes, a.gpus)
    w = mp.Process(target=writer, args=(str(root), a.nodes, a.gpus, a.seconds))
    w.start()
    store = Store(root, write=True)
    from tunedeck.core.rundir import RunDir

    plan = RunDir(root).read_plan()  # the monitor reads it once (it never changes)
    lags: list[float] = []
    ticks: list[float] = []
    frames: list[float] = []
    events = 0
    next_frame = 0.0
    while w.is_alive() or events < a.nodes * a.gpus:
        t0 = time.time()
        new = store.ingest()
        now = time.time()
        ticks.append(now - t0)
        events += len(new)
        lags.extend(now - e["t"] for e in new if isinstance(e.get("t"), float))
        if now >= next_frame:  # the monitor refreshes about once a second
            next_frame = now + 1.0
            f0 = time.perf_counter()
            rows = node_rows(root, [], plan=plan)
            lines = format_rows(rows)
            frames.append(time.perf_counter() - f0)
            assert len(rows) == a.nodes and len(lines) >= a.nodes
        if not w.is_alive():
            if not new:
                break
        time.sleep(max(0.0, TICK_S - (time.time() - t0)))
    w.join()
    store.close()
    lags.sort()
    q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    out = {
        "nodes": a.nodes,
        "gpus_per_node": a.gpus,
        "ranks": a.nodes * a.gpus,
        "seconds": a.seconds,
        "events_ingested": events,
        "lag_s": {
            "p50": round(q(lags, 0.5), 3),
            "p99": round(q(lags, 0.99), 3),
            "max": round(lags[-1], 3),
        },
        "ingest_tick_s": {"p50": round(statistics.median(ticks), 3), "max": round(max(ticks), 3)},
        "node_view_frame_ms": {
            "p50": round(statistics.median(frames) * 1e3, 1),
            "max": round(max(frames) * 1e3, 1),
            "frames": len(frames),
        },
        "slowest_rank_seen": [r["slowest_rank"] for r in rows if r["node"] == 97],
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
