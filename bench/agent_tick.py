"""The agent's CPU per tick on a long run: does it grow with the run's length?

A run directory is made by the real launch path (`prepare_run`: spec, plan, state) and given
HISTORY steps per rank already written by the "trainer" and ingested by an earlier agent life
(events/rank<r>.jsonl in the trainer's exact schema, in run.db with their offsets), plus rank
logs. Then the real `Agent` takes it over (its Store, its monitors: telemetry on 8 fake GPUs,
the live detectors, log diagnosis, the loss watch) and runs TICKS ticks on a simulated 0.5 s
clock while every rank appends one step per tick. Reported: CPU seconds per tick (mean, p50,
p99, max) and what that is as a share of one core at the real tick rate, for each history.

    python bench/agent_tick.py OUT [--ranks 8] [--history 1000,1000000] [--ticks 600]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

TICK_S = 0.5
T0 = 1.7e9


def step_line(rank: int, step: int, t: float) -> str:
    """One step event as the built-in trainer writes it (tunedeck.core.rundir.events)."""
    loss = 2.0 + 1.0 / (1 + step / 500) + (rank % 3) * 1e-4
    return (
        json.dumps(
            {
                "t": t,
                "kind": "step",
                "rank": rank,
                "step": step,
                "loss": loss,
                "lr": 1e-4,
                "grad_norm": 0.5 + (step % 7) * 0.01,
                "tokens": 8192,
                "step_s": 0.5,
                "data_wait_s": 0.004,
                "compute_s": 0.31,
                "mem_gib": 61.3,
                "tokens_per_s": 16384.0,
                "epoch": step // 10000,
                "mfu": 0.41,
            }
        )
        + "\n"
    )


def make_run(root: Path, ranks: int, history: int) -> Path:
    from tunedeck.core.rundir import RunDir
    from tunedeck.core.supervisor.launch import prepare_run
    from tunedeck.core.store.store import Store
    from tunedeck.core.spec import loads_spec

    spec = loads_spec(
        f'name = "bench-{history}"\n[data]\npath = "/dev/null"\n'
        f'[train]\nmax_steps = {history * 10}\n[cluster]\ndevice = "cpu"\n'
        f"cpu_procs = {ranks}\n",
        source="<bench>",
    )
    run = RunDir(prepare_run(spec, root))
    t = T0 - history * TICK_S
    for r in range(ranks):
        with open(run.event_file(r), "w") as f:
            f.write(
                json.dumps(
                    {
                        "t": t,
                        "kind": "start",
                        "rank": r,
                        "world_size": ranks,
                        "max_steps": history * 10,
                        "start_step": 0,
                    }
                )
                + "\n"
            )
            chunk = []
            for s in range(1, history + 1):
                chunk.append(step_line(r, s, t + s * TICK_S))
                if len(chunk) == 10000:
                    f.write("".join(chunk))
                    chunk = []
            f.write("".join(chunk))
        logs = run.node_log_dir(0) / "bench_x" / "attempt_0" / str(r)
        logs.mkdir(parents=True)
        with open(logs / "stdout.log", "w") as f:  # the trainer prints every max_steps/50
            f.writelines(f"[rank{r}]: step {s} loss 2.5\n" for s in range(1, history + 1, 200))
        (logs / "stderr.log").write_text("")
    t1 = time.time()
    n = 0
    with Store(run, write=True) as store:  # an earlier agent life ingested all of it
        while got := len(store.ingest()):
            n += got
    print(
        f"  history: {ranks} x {history:,} steps ({n:,} events) ingested in "
        f"{time.time() - t1:.0f} s; run.db {run.db.stat().st_size / 2**20:.0f} MiB",
        flush=True,
    )
    return run.path


def measure(run_dir: Path, ranks: int, history: int, ticks: int) -> dict:
    from tunedeck.core.supervisor.agent import Agent
    from tunedeck.core.store.store import Store

    agent = Agent(run_dir)
    agent.store = Store(agent.rundir, write=True)
    agent.monitors = agent.make_monitors()
    files = [open(agent.rundir.event_file(r), "a") for r in range(ranks)]
    costs = []
    try:
        for i in range(ticks):
            now = T0 + i * TICK_S
            for r, f in enumerate(files):  # every rank finishes one step per tick
                f.write(step_line(r, history + i + 1, now))
                f.flush()
            c0 = time.process_time()
            new = agent.ingest()
            agent.record_pids()
            agent.check_stop()
            agent.tick_monitors(now, new)
            costs.append(time.process_time() - c0)
    finally:
        for f in files:
            f.close()
        for m in agent.monitors:
            m.close([])
        agent.store.close()
    first_ms = [round(c * 1000, 1) for c in costs[:3]]
    costs_ms = sorted(c * 1000 for c in costs[10:])  # the first ticks open files and tables
    mean = statistics.fmean(costs_ms)
    return {
        "ranks": ranks,
        "history_steps": history,
        "ticks": len(costs_ms),
        "monitors": [type(m).__name__ for m in agent.monitors],
        "cpu_ms_per_tick_mean": round(mean, 3),
        "p50": round(costs_ms[len(costs_ms) // 2], 3),
        "p99": round(costs_ms[int(len(costs_ms) * 0.99)], 3),
        "max": round(costs_ms[-1], 3),
        "first_ticks_ms": first_ms,
        "core_pct_at_2hz": round(100 * mean / 1000 / TICK_S, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--history", default="1000,1000000")
    ap.add_argument("--ticks", type=int, default=600)
    args = ap.parse_args()
    os.environ.setdefault("TUNEDECK_FAKE_NVML", str(args.ranks))  # GPU telemetry path too
    os.environ["TUNEDECK_HOME"] = str(args.out / "home")
    results = []
    for h in (int(x) for x in args.history.split(",")):
        print(f"{args.ranks} ranks, {h:,} steps of history:", flush=True)
        run = make_run(args.out / "home" / "runs", args.ranks, h)
        res = measure(run, args.ranks, h, args.ticks)
        print("  " + json.dumps(res), flush=True)
        results.append(res)
    (args.out / "agent_tick.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
