"""Week-long runs and 1,024 ranks: what each cost of watching a run is at 10^5-10^6 steps.

Synthetic runs in the trainer's exact event schema, written to events/rank<r>.jsonl and
ingested by the agent's own `Store(run, write=True).ingest()` (run directories made by the
real `prepare_run`); the `metrics` rows' runs get their step and eval rows from the Store's
writer directly (`write_rows`: the same run.db tables, minutes instead of ~45 for 8M events):

    8 ranks x 100,000 steps            `metrics --json`, the agent's diagnosis poll
    8 ranks x 1,000,000 steps + a week of 1 Hz telemetry for 8 GPUs
                                       `metrics --json`, `diagnose`, the monitor's first frame
    1,024 ranks x 1,000 steps          `metrics --json`, `diagnose`

and a live agent (the real `Agent`, its Store and monitors, in its own process, ticking every
0.5 s) ingesting LINES_PER_S lines/s spread over 8 rank files for LIVE_S seconds, while
`tunedeck metrics` is called every few seconds. Each command runs in its own process
(CPU and peak RSS from wait4); each figure is the median of REPEATS runs. Built runs are
kept under OUT/<tag> and reused (building the 1M-step run takes minutes).

    python bench/long_run.py OUT [--tag now] [--rows all|metrics,diagnose,poll,monitor,live]
        [--repeats 3] [--live-s 60] [--timeout 240] [--mem-cap-gib 8] [--json FILE]

To measure another checkout's code, put it first on PYTHONPATH
(`PYTHONPATH=$(python OTHER/bench/checkout.py)`): every child inherits it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

TICK_S = 0.5
WINDOW_S = 300  # the live row's windows
WEEK_S = 7 * 86400
TARGETS = {
    "agent_rss": "flat, <= 300 MiB after 1 h",
    "agent_cpu": "<= 10 % of a core",
    "ingest_lag": "p99 <= 1 s",
    "metrics_100k": "<= 1 s, <= 200 MB",
    "metrics_1m": "<= 4 s, <= 300 MB (streamed)",
    "metrics_1024": "<= 1 s",
    "diagnose_1m": "<= 15 s",
    "diagnose_1024": "<= 10 s",
    "metrics_live": "flat",
    "diag_poll": "<= 5 ms",
    "monitor_open": "complete and consistent in the first frame, <= 1 s",
    "monitor_refresh": "<= 50 ms; <= 200 MB",
}


def say(text: str = "") -> None:
    print(text, flush=True)


def _values(rank: int, step: int) -> tuple:
    """Every field of a step varies from step to step and rank to rank, as a real run's do
    (a constant column stores and compresses unlike a real one): loss, a cosine lr, grad norm,
    packed tokens, step/wait/compute times, memory, speed, MFU."""
    h = (step * 2654435761 + rank * 40503) % 1000003 / 1000003.0  # cheap pseudo-noise
    loss = 2.0 + 1.0 / (1 + step / 5000) + 0.02 * math.sin(step / 50) + 0.05 * (h - 0.5)
    lr = 1e-4 * 0.5 * (1 + math.cos(math.pi * (step % 1000000) / 1000000))
    tokens = 7000 + int(1192 * h)
    step_s = 0.55 + 0.1 * h
    wait = 0.002 + 0.004 * ((h * 7) % 1)
    compute = step_s - 0.15 - wait
    mem = 61.0 + 0.6 * ((h * 13) % 1)
    return loss, lr, 0.5 + 0.3 * h, tokens, step_s, wait, compute, mem, tokens / step_s


def step_event(rank: int, step: int, t: float) -> str:
    """One step event as the built-in trainer writes it (core/rundir/events.py)."""
    loss, lr, gn, tokens, step_s, wait, compute, mem, tps = _values(rank, step)
    return (
        json.dumps(
            {
                "t": t,
                "kind": "step",
                "rank": rank,
                "step": step,
                "loss": loss,
                "lr": lr,
                "grad_norm": gn,
                "tokens": tokens,
                "step_s": step_s,
                "data_wait_s": wait,
                "compute_s": compute,
                "mem_gib": mem,
                "tokens_per_s": tps,
                "epoch": step // 100000,
                "mfu": tps / 33000,
            }
        )
        + "\n"
    )


_STEP = (
    '{"t": %r, "kind": "step", "rank": %d, "step": %d, "loss": %r, "lr": %r, '
    '"grad_norm": %r, "tokens": %d, "step_s": %r, "data_wait_s": %r, '
    '"compute_s": %r, "mem_gib": %r, "tokens_per_s": %r, "epoch": %d, '
    '"mfu": %r}\n'
)


def fast_step_event(rank: int, step: int, t: float) -> str:
    """step_event's bytes, formatted without json.dumps (the live writer's 5,000 lines/s
    must not starve the agent it measures of the second core)."""
    loss, lr, gn, tokens, step_s, wait, compute, mem, tps = _values(rank, step)
    return _STEP % (
        t,
        rank,
        step,
        loss,
        lr,
        gn,
        tokens,
        step_s,
        wait,
        compute,
        mem,
        tps,
        step // 100000,
        tps / 33000,
    )


# -- building the runs ---------------------------------------------------------------------


def picked_step(rank: int, step: int, t: float) -> tuple:
    """step_event's line as the agent's native picker hands it to the Store's writer:
    (rank, step, t, *STEP_METRICS values, had loss) (core/store/store.py `_add_series`)."""
    loss, lr, gn, tokens, step_s, wait, compute, mem, tps = _values(rank, step)
    # STEP_METRICS order: loss, lr, grad_norm, tokens_per_s, step_s, data_wait_s, mem_gib,
    # mfu, epoch, tokens
    return (
        rank,
        step,
        t,
        loss,
        lr,
        gn,
        tps,
        step_s,
        wait,
        mem,
        tps / 33000,
        step // 100000,
        tokens,
        True,
    )


def write_rows(store, ranks: int, steps: int, started: float, dt: float, eval_every: int) -> int:
    """The step and eval rows of every rank straight into run.db through the agent's own
    writer (`Store._add_series`, which ingest calls with the same rows: the same tables, rollups
    and max_steps), 20,000 a transaction; the event files hold only the start and end events.
    8 x 1M varying steps take minutes this way, not the ~45 of writing and ingesting 8M lines."""
    from tunedeck.core.store.store import STEP_METRICS

    assert len(STEP_METRICS) == 10 and STEP_METRICS[-1] == "tokens", STEP_METRICS
    n = 0
    for r in range(ranks):
        for a in range(1, steps + 1, 20000):
            chunk: list = []
            for s in range(a, min(a + 20000, steps + 1)):
                chunk.append((r, picked_step(r, s, started + s * dt)))
                if eval_every and s % eval_every == 0:
                    chunk.append((r, _eval(r, s, started + s * dt + 0.1)))
            with store.db:
                store._add_series(chunk)
            n += len(chunk)
    return n


def _eval(rank: int, step: int, t: float) -> dict:
    return {
        "t": t,
        "kind": "eval",
        "rank": rank,
        "step": step,
        "eval_loss": 2.1,
        "eval_tokens": 4096,
    }


def make_run(
    root: Path,
    name: str,
    ranks: int,
    steps: int,
    span_s: float,
    telemetry: bool = False,
    eval_every: int = 0,
    events: bool = True,
) -> Path:
    """A run directory through the real launch path, its events ingested by the agent's
    Store; reused when OUT already has it complete. Without `events`, the steps and evals go
    into run.db by the Store's writer (write_rows), not through event files: what
    `tunedeck metrics` reads is the same, the events table (`diagnose`'s) holds only the
    start and end events."""
    from tunedeck.core.rundir import RunDir
    from tunedeck.core.supervisor.launch import prepare_run
    from tunedeck.core.store.store import Store
    from tunedeck.core.spec import loads_spec

    marker = root / f"{name}.json"
    if marker.exists():
        return Path(json.loads(marker.read_text())["run_dir"])
    spec = loads_spec(
        f'name = "{name}"\n[data]\npath = "/dev/null"\n'
        f'[train]\nmax_steps = {steps}\n[cluster]\ndevice = "cpu"\n'
        f"cpu_procs = {min(ranks, 8)}\n",
        source="<bench>",
    )
    run = RunDir(prepare_run(spec, root / "runs"))
    t_end = time.time()
    started = t_end - span_s
    dt = span_s / steps
    t0 = time.time()
    for r in range(ranks):
        with open(run.event_file(r), "w") as f:
            f.write(
                json.dumps(
                    {
                        "t": started,
                        "kind": "start",
                        "rank": r,
                        "world_size": ranks,
                        "max_steps": steps,
                        "start_step": 0,
                    }
                )
                + "\n"
            )
            for a in range(1, steps + 1, 20000) if events else ():
                chunk = []
                for s in range(a, min(a + 20000, steps + 1)):
                    chunk.append(step_event(r, s, started + s * dt))
                    if eval_every and s % eval_every == 0:
                        chunk.append(json.dumps(_eval(r, s, started + s * dt + 0.1)) + "\n")
                f.write("".join(chunk))
            f.write(
                json.dumps(
                    {
                        "t": t_end,
                        "kind": "end",
                        "rank": r,
                        "step": steps,
                        "reason": "completed",
                        "loss": 2.0,
                    }
                )
                + "\n"
            )
        if r < 8 and events:  # rank logs as the trainer prints them (every max_steps/50), NCCL's
            logs = run.node_log_dir(0) / f"{run.path.name}_x" / "attempt_0" / str(r)
            logs.mkdir(parents=True)
            with open(logs / "stdout.log", "w") as f:
                f.writelines(
                    f"bench:{100 + r}:{100 + r} [{r}] NCCL INFO Channel {c:02d}/0 : "
                    f"{r}[{r}] -> {(r + 1) % 8}[{(r + 1) % 8}] via P2P/CUMEM\n"
                    for c in range(24)
                )
                f.writelines(
                    f"[rank{r}]: step {s} loss 2.5\n"
                    for s in range(1, steps + 1, max(steps // 50, 1))
                )
            (logs / "stderr.log").write_text("")
    say(f"  {name}: {ranks} x {steps:,} steps written in {time.time() - t0:.0f} s")
    t0 = time.time()
    n = 0
    with Store(run, write=True) as store:
        while got := len(store.ingest()):
            n += got
        say(f"  {name}: {n:,} events ingested by Store.ingest in {time.time() - t0:.0f} s")
        if not events:
            t0 = time.time()
            n = write_rows(store, ranks, steps, started, dt, eval_every)
            say(
                f"  {name}: {n:,} step and eval rows written by the Store in {time.time() - t0:.0f} s"
            )
        if telemetry:
            t0 = time.time()
            tel = store.telemetry
            for i in range(int(span_s)):
                t = started + i
                tel.add(
                    "gpu",
                    t,
                    [
                        (
                            g,
                            {
                                "util": 90.0 - 40 * (g == 3),
                                "mem_util": 40.0,
                                "mem_used_mib": 120000.0 + g,
                                "mem_total_mib": 143771.0,
                                "power_w": 600.0,
                                "temp_c": 65.0,
                                "sm_mhz": 1980.0,
                            },
                        )
                        for g in range(8)
                    ],
                )
                tel.add(
                    "rank",
                    t,
                    [(r, {"cpu_pct": 100.0, "rss_mib": 9000.0}) for r in range(min(ranks, 8))],
                )
                if i % 3600 == 0:
                    tel.commit()
            tel.flush_buckets()
            say(f"  {name}: a week of 1 Hz telemetry (8 GPUs, 8 ranks) in {time.time() - t0:.0f} s")
    st = run.read_state() or {}
    st.update(status="succeeded", started=started, ended=t_end, max_steps=steps)
    from tunedeck.core.rundir import write_json_atomic

    write_json_atomic(run.state, st)
    say(f"  {name}: run.db {run.db.stat().st_size / 2**20:.0f} MiB")
    marker.write_text(json.dumps({"run_dir": str(run.path)}))
    return run.path


# -- measuring a command -------------------------------------------------------------------


def measure(argv: list[str], timeout: float, mem_cap: int) -> dict:
    """Run argv (stdout to /dev/null); wall s, CPU s, peak RSS MiB, rc, stderr's last line."""

    def cap() -> None:
        if mem_cap:
            resource.setrlimit(resource.RLIMIT_AS, (mem_cap, mem_cap))

    err = open(os.devnull, "wb") if False else subprocess.PIPE
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=cap)
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    stderr = p.stderr.read() if p.stderr else b""
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    last = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return {
        "wall_s": wall,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "rss_mib": ru.ru_maxrss / 1024,
        "rc": p.returncode,
        "timed_out": wall >= timeout - 0.5,
        "err": last[0][:160],
    }


def median_of(argv: list[str], repeats: int, timeout: float, mem_cap: int) -> dict:
    runs = []
    for _ in range(repeats):
        r = measure(argv, timeout, mem_cap)
        runs.append(r)
        if r["rc"] != 0:  # a failure (MemoryError, timeout) is not repeated
            break
    out = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "cpu_s", "rss_mib")}
    out.update(
        rc=runs[-1]["rc"],
        timed_out=runs[-1]["timed_out"],
        err=runs[-1]["err"],
        n=len(runs),
        all_wall=[round(r["wall_s"], 2) for r in runs],
        all_cpu=[round(r["cpu_s"], 2) for r in runs],
        best_cpu_s=min(r["cpu_s"] for r in runs),
    )
    return out


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tunedeck.cli", *args]


def fmt_cmd(r: dict) -> str:
    if r["rc"] != 0:
        why = "timed out" if r["timed_out"] else (r["err"] or f"exit {r['rc']}")
        return f"FAILED after {r['wall_s']:.1f} s ({why}); peak {r['rss_mib']:.0f} MiB"
    # CPU is the figure to compare: the wall counts whatever else the machine runs
    return (
        f"{r['cpu_s']:.2f} s CPU median, {r['best_cpu_s']:.2f} best ({r['all_cpu']}); "
        f"{r['wall_s']:.2f} s wall, {r['rss_mib']:.0f} MiB peak (median of {r['n']})"
    )


# -- the agent's idle diagnosis poll -------------------------------------------------------


def diag_poll(run_dir: Path, repeats: int) -> dict:
    """The log diagnosis and loss monitors of a real Agent on a long run: the cost of a poll
    after the first, and the memory they keep."""
    import gc
    import tracemalloc

    from tunedeck.core.supervisor.agent import Agent
    from tunedeck.core.supervisor.monitors import DiagnosisMonitor, LossMonitor
    from tunedeck.core.store.store import Store

    agent = Agent(run_dir)
    agent.store = Store(agent.rundir, write=True)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    monitors = agent.make_monitors()
    while agent.ingest():
        pass
    mine = [m for m in monitors if isinstance(m, (DiagnosisMonitor, LossMonitor))]
    for m in mine:
        m.close([])  # the first poll reads everything once
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    costs = []
    for _ in range(max(repeats, 3) * 3):
        t0 = time.perf_counter()
        for m in mine:
            m.last = 0.0
            m.tick(time.time(), [])
        costs.append(time.perf_counter() - t0)
    agent.store.close()
    return {"poll_ms": statistics.median(costs) * 1000, "kept_mib": kept / 2**20}


# -- the monitor's first frame -------------------------------------------------------------


def monitor_open(run_dir: Path) -> dict:
    """The monitor's first poll (RunWatcher) and the loss chart's whole-run query
    (LossPlot's), in a fresh process: time, whether the curve covers the whole run and
    whether the stats line's step and loss agree with the progress line."""
    code = (
        "import json, time, sys, resource\n"
        "t0 = time.perf_counter()\n"
        "from tunedeck.core.views.watch import RunWatcher\n"
        "w = RunWatcher(sys.argv[1])\n"
        "snap = w.poll(history=False)\n"  # the monitor's first frame (strips follow)
        "t1 = time.perf_counter()\n"
        "s = w.store.step_series(0, buckets=320, metrics=('loss', 'lr', 'grad_norm'))\n"
        "t2 = time.perf_counter()\n"
        "a = time.perf_counter(); w.poll(history=True); hist = time.perf_counter() - a\n"
        "polls = []\n"
        "for _ in range(10):\n"
        "    a = time.perf_counter(); w.poll(history=False); polls.append(time.perf_counter() - a)\n"
        "st = snap.loss_stats\n"
        "print(json.dumps({'first_poll_s': t1 - t0, 'series_s': t2 - t1,\n"
        "  'progress_step': snap.progress.step, 'stats_step': st.get('steps'),\n"
        "  'curve_first': s['step'][0] if s['step'] else None,\n"
        "  'curve_last': s['step_max'][-1] if s['step'] else None, 'run_last': s['last'],\n"
        "  'buckets': len(s['step']), 'poll_ms': sorted(polls)[5] * 1000,\n"
        "  'history_s': hist,\n"
        "  'rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, timeout=300
    )
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# -- a live agent --------------------------------------------------------------------------


def _live_ingest() -> bool:
    """Whether this checkout's Agent.supervise asks the Store only for the step events its
    monitors read (Agent.ingest(live=True)): the bench calls it as supervise does."""
    import inspect

    from tunedeck.core.supervisor.agent import Agent

    return "live" in inspect.signature(Agent.ingest).parameters


def _paced() -> bool:
    """Whether this checkout's Agent.supervise sleeps to the next tick (not a whole tick
    after its work): the bench's loop does what the agent it measures does."""
    import inspect

    from tunedeck.core.supervisor.agent import Agent

    return "began" in inspect.getsource(Agent.supervise)


_SUPERVISE_PACED = False


def agent_child(run_dir: Path, stop_file: Path) -> None:
    """The agent's supervise loop without torchrun: ingest, pids, stop check, monitors,
    then sleep to the next 0.5 s tick."""
    from tunedeck.core.supervisor.agent import Agent
    from tunedeck.core.store.store import Store

    global _SUPERVISE_PACED
    _SUPERVISE_PACED = _paced()
    live_kw = {"live": True} if _live_ingest() else {}
    agent = Agent(run_dir)
    agent.store = Store(agent.rundir, write=True)
    last_pids = 0.0
    while not stop_file.exists():
        began = time.monotonic()  # as Agent.supervise: ticks TICK_S apart
        new = agent.ingest(**live_kw)
        if agent.monitors is None:
            agent.monitors = agent.make_monitors()
        agent.check_stop()
        now = time.time()
        if now - last_pids >= 1.0:
            agent.record_pids()
            last_pids = now
        agent.tick_monitors(now, new)
        agent._sleep(max(TICK_S - (time.monotonic() - began), 0.05) if _SUPERVISE_PACED else TICK_S)
    agent.store.close()


def rss_self() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def proc_stat(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MiB) of a live process from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return cpu, rss


def live(root: Path, lines_per_s: int, seconds: float, metrics_argv: list[str]) -> dict:
    """A live agent ingesting `lines_per_s` lines/s over 8 rank files."""
    import sqlite3

    from tunedeck.core.rundir import RunDir
    from tunedeck.core.supervisor.launch import prepare_run
    from tunedeck.core.spec import loads_spec

    ranks = 8
    spec = loads_spec(
        'name = "live"\n[data]\npath = "/dev/null"\n[train]\n'
        'max_steps = 100000000\n[cluster]\ndevice = "cpu"\ncpu_procs = 8\n',
        source="<bench>",
    )
    run = RunDir(prepare_run(spec, root / "runs"))
    files = []
    for r in range(ranks):
        f = open(run.event_file(r), "a")
        f.write(
            json.dumps(
                {
                    "t": time.time(),
                    "kind": "start",
                    "rank": r,
                    "world_size": ranks,
                    "max_steps": 100000000,
                    "start_step": 0,
                }
            )
            + "\n"
        )
        f.flush()
        files.append(f)
    stop_file = root / "live.stop"
    stop_file.unlink(missing_ok=True)
    child = subprocess.Popen(
        [sys.executable, __file__, "--agent-child", str(run.path), str(stop_file)],
        stdout=subprocess.DEVNULL,
        stderr=open(root / "live-agent.err", "wb"),
    )
    written: dict[int, float] = {}  # rank 0's step -> when its line was written
    done = threading.Event()

    def writer() -> None:
        step, per_tick, tick = 0, lines_per_s / ranks / 100, 0.01  # every 10 ms
        owed = 0.0
        nxt = time.perf_counter()
        while not done.is_set():
            owed += per_tick
            n, owed = int(owed), owed - int(owed)
            if n:
                now = time.time()
                for f_r, f in enumerate(files):
                    f.write("".join(fast_step_event(f_r, step + i + 1, now) for i in range(n)))
                    f.flush()
                for i in range(n):
                    written[step + i + 1] = now
                step += n
            nxt += tick
            time.sleep(max(nxt - time.perf_counter(), 0))

    time.sleep(1.0)  # the agent opens run.db and makes its monitors
    th = threading.Thread(target=writer, daemon=True)
    lags: list[float] = []
    lag_at: list[tuple[float, float]] = []  # (seconds in, lag) for the windows
    rss: list[tuple[float, float]] = []
    cpu_at: list[tuple[float, float, float]] = []  # (seconds in, agent CPU s, load 1 min)
    metrics_calls: list[tuple[float, float]] = []
    th.start()
    t_start = time.time()
    cpu0, _ = proc_stat(child.pid)
    db = None
    seen = 0
    next_sample = next_metrics = t_start
    caller = threading.Thread()
    while time.time() - t_start < seconds:
        now = time.time()
        if db is None and run.db.exists():
            db = sqlite3.connect(f"file:{run.db}?mode=ro", uri=True, timeout=10)
        if db is not None:
            try:
                top = db.execute("SELECT MAX(step) FROM steps WHERE rank = 0").fetchone()[0]
            except sqlite3.Error:
                top = None
            if top and top > seen:
                t_seen = time.time()
                new = [
                    t_seen - written.pop(s) for s in range(seen + 1, top + 1) if s in written
                ]  # popped: an hour's steps are not all kept
                lags.extend(new)
                if new:
                    lag_at.append((t_seen - t_start, max(new)))
                seen = top
        if now >= next_sample:
            c, r = proc_stat(child.pid)
            rss.append((now - t_start, r))
            cpu_at.append((now - t_start, c, os.getloadavg()[0]))
            next_sample += 1.0
        if now >= next_metrics and now - t_start > 2 and not caller.is_alive():
            # in a thread: the lag probe keeps polling while the command runs
            def call(at: float = now - t_start) -> None:
                m = measure(metrics_argv + [str(run.path)], 120, 0)
                metrics_calls.append((at, m["wall_s"]))

            caller = threading.Thread(target=call, daemon=True)
            caller.start()
            next_metrics = now + 5.0
        time.sleep(0.02)
    cpu1, _ = proc_stat(child.pid)
    elapsed = time.time() - t_start
    done.set()
    th.join()
    if caller.is_alive():
        caller.join()
    stop_file.write_text("1")
    child.wait(timeout=60)
    for f in files:
        f.close()
    if db is not None:
        db.close()
    lags.sort()

    def pct(q: float) -> float:
        return lags[min(int(q * len(lags)), len(lags) - 1)] if lags else float("nan")

    first_rss = statistics.median(r for _, r in rss[2:7]) if len(rss) > 7 else rss[0][1]
    slope = 0.0
    if len(rss) > 10:  # least squares over the samples after the first 5 s
        xs, ys = [x for x, _ in rss[5:]], [y for _, y in rss[5:]]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    # per window (WINDOW_S): the agent's CPU and the worst lag a poll saw, to tell a cost
    # that grows with the run from one that follows the machine
    windows = []
    for w0 in range(0, int(elapsed), WINDOW_S):
        cs = [(t, c, ld) for t, c, ld in cpu_at if w0 <= t <= w0 + WINDOW_S]
        ls = sorted(x for t, x in lag_at if w0 <= t < w0 + WINDOW_S)
        if len(cs) > 1:
            windows.append(
                {
                    "from_s": w0,
                    "cpu_pct": round(100 * (cs[-1][1] - cs[0][1]) / (cs[-1][0] - cs[0][0]), 1),
                    "lag_p99_poll": round(ls[min(int(0.99 * len(ls)), len(ls) - 1)], 3)
                    if ls
                    else None,
                    "load1_end": round(cs[-1][2], 2),
                }
            )
    return {
        "seconds": elapsed,
        "lines": seen * ranks,
        "windows": windows,
        "cpu_pct": 100 * (cpu1 - cpu0) / elapsed,
        "rss_start_mib": first_rss,
        "rss_end_mib": rss[-1][1],
        "rss_max_mib": max(r for _, r in rss),
        "rss_slope_mib_per_min": slope * 60,
        "lag_p50": pct(0.5),
        "lag_p90": pct(0.9),
        "lag_p99": pct(0.99),
        "lag_max": lags[-1] if lags else float("nan"),
        "lag_n": len(lags),
        "metrics_calls": metrics_calls,
    }


# -- the table -----------------------------------------------------------------------------


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--agent-child":
        agent_child(Path(sys.argv[2]), Path(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument(
        "--tag",
        default="now",
        help="builds are kept in OUT/TAG (one per code "
        "version: the agent's run.db format may differ)",
    )
    ap.add_argument("--rows", default="all")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--live-s", type=float, default=60.0)
    ap.add_argument("--lines-per-s", type=int, default=5000)
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument(
        "--mem-cap-gib",
        type=float,
        default=8.0,
        help="address-space cap per command (the machine is shared)",
    )
    ap.add_argument("--big-steps", type=int, default=1_000_000)
    ap.add_argument("--mid-steps", type=int, default=100_000)
    ap.add_argument("--wide-ranks", type=int, default=1024)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--build-only", action="store_true", help="make the runs, measure nothing")
    args = ap.parse_args()
    rows = set(
        "metrics,diagnose,poll,monitor,live".split(",")
        if args.rows == "all"
        else args.rows.split(",")
    )
    root = (args.out / args.tag).resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ["TUNEDECK_HOME"] = str(root / "home")
    os.environ.setdefault("TUNEDECK_FAKE_NVML", "8")
    cap = int(args.mem_cap_gib * 2**30)
    import tunedeck.core.store.store as store_mod

    say(
        f"# bench/long_run.py, tunedeck from {Path(store_mod.__file__).parents[2]}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    try:  # the metrics verb's module (tunedeck.tui.cli in checkouts before tunedeck.cli)
        from tunedeck.cli import metrics as cli_mod
    except ImportError:
        from tunedeck.tui import cli as cli_mod

    src = Path(cli_mod.__file__).read_text()
    windowed = "--last" in src
    res: dict = {}
    say("## building (reused when already built)")
    mid, wide = args.mid_steps, args.wide_ranks
    if not args.build_only:
        # built in a child: a process started by this one reports at least this one's
        # RSS as its peak (Linux keeps the high-water mark across fork and exec), so the
        # measuring process stays small
        subprocess.run(
            [
                sys.executable,
                __file__,
                str(args.out),
                "--tag",
                args.tag,
                "--build-only",
                "--rows",
                args.rows,
                "--big-steps",
                str(args.big_steps),
                "--mid-steps",
                str(mid),
                "--wide-ranks",
                str(wide),
            ],
            check=True,
        )
        say(f"  measuring process RSS {rss_self():.0f} MiB (a floor of every peak below)")
    big = args.big_steps
    # `metrics` reads only run.db's step tables: its runs get their rows from the Store's
    # writer directly (make_run's `events`); diagnose, the poll and the monitor read the
    # events, so theirs are written as files and ingested
    m100k = m1m = m1024 = None
    if "metrics" in rows:
        m100k = make_run(root, f"r8x{mid}-rows", 8, mid, mid * 0.6, events=False)
        m1m = make_run(root, f"r8x{big}-rows", 8, big, WEEK_S, eval_every=500, events=False)
        m1024 = make_run(root, f"r{wide}x1000-rows", wide, 1000, 600.0, events=False)
    r100k = make_run(root, f"r8x{mid}", 8, mid, mid * 0.6) if "poll" in rows else None
    r1m = (
        make_run(root, f"r8x{big}", 8, big, WEEK_S, telemetry=True, eval_every=500)
        if rows & {"diagnose", "monitor"}
        else None
    )
    r1024 = make_run(root, f"r{wide}x1000", wide, 1000, 600.0) if "diagnose" in rows else None

    if args.build_only:
        return 0
    table: list[tuple[str, str, str]] = []
    if "live" in rows:
        say("## live agent")
        margv = cli("metrics", "--json", "--last", "100") if windowed else cli("metrics", "--json")
        lv = live(root, args.lines_per_s, args.live_s, margv)
        res["live"] = lv
        say("  " + json.dumps(lv))
        table.append(
            (
                "agent RSS while ingesting 5,000 lines/s",
                f"{lv['rss_start_mib']:.0f} -> {lv['rss_end_mib']:.0f} MiB in "
                f"{lv['seconds']:.0f} s (max {lv['rss_max_mib']:.0f}, "
                f"{lv['rss_slope_mib_per_min']:+.1f} MiB/min)",
                TARGETS["agent_rss"],
            )
        )
        table.append(
            ("agent CPU at 5,000 lines/s", f"{lv['cpu_pct']:.1f} % of a core", TARGETS["agent_cpu"])
        )
        table.append(
            (
                "ingest lag (line written -> in run.db)",
                f"median {lv['lag_p50']:.2f} s, p90 {lv['lag_p90']:.2f} s, "
                f"p99 {lv['lag_p99']:.2f} s, max {lv['lag_max']:.2f} s",
                TARGETS["ingest_lag"],
            )
        )
        mc = lv["metrics_calls"]
        if mc:
            table.append(
                (
                    f"`tunedeck {' '.join(margv[3:])}` during the live run",
                    f"{mc[0][1]:.2f} s at {mc[0][0]:.0f} s -> {mc[-1][1]:.2f} s at "
                    f"{mc[-1][0]:.0f} s",
                    TARGETS["metrics_live"],
                )
            )
    if "metrics" in rows:
        say("## metrics")
        for key, run, label in (
            ("metrics_100k", m100k, f"8 x {mid:,} steps"),
            ("metrics_1m", m1m, f"8 x {big:,} steps"),
            ("metrics_1024", m1024, f"{wide:,} ranks x 1,000 steps"),
        ):
            r = median_of(cli("metrics", str(run), "--json"), args.repeats, args.timeout, cap)
            res[key] = r
            say(f"  {label}: {fmt_cmd(r)}")
            table.append((f"`tunedeck metrics RUN --json`, {label}", fmt_cmd(r), TARGETS[key]))
    if "diagnose" in rows:
        say("## diagnose")
        for key, run, label in (
            ("diagnose_1m", r1m, f"8 x {big:,} steps"),
            ("diagnose_1024", r1024, f"{wide:,} ranks x 1,000 steps"),
        ):
            r = median_of(cli("diagnose", str(run)), args.repeats, args.timeout, cap)
            res[key] = r
            say(f"  {label}: {fmt_cmd(r)}")
            table.append((f"`tunedeck diagnose RUN`, {label}", fmt_cmd(r), TARGETS[key]))
    if "poll" in rows:
        say("## the agent's diagnosis poll")
        code = (
            "import sys, json; sys.path.insert(0, %r); import long_run; "
            "print(json.dumps(long_run.diag_poll(__import__('pathlib').Path(sys.argv[1]), %d)))"
            % (str(Path(__file__).parent), args.repeats)
        )
        p = subprocess.run([sys.executable, "-c", code, str(r100k)], capture_output=True, text=True)
        r = (
            json.loads(p.stdout.strip().splitlines()[-1])
            if p.returncode == 0
            else {"error": p.stderr[-300:]}
        )
        res["diag_poll"] = r
        say("  " + json.dumps(r))
        if "poll_ms" in r:
            table.append(
                (
                    f"agent's idle diagnosis + loss poll, 8 x {mid:,} steps",
                    f"{r['poll_ms']:.2f} ms, {r['kept_mib']:.1f} MiB kept",
                    TARGETS["diag_poll"],
                )
            )
    if "monitor" in rows:
        say("## the monitor on the 1M-step run")
        ms = [monitor_open(r1m) for _ in range(args.repeats)]
        ok = [m for m in ms if "error" not in m]
        res["monitor"] = ms
        say("  " + json.dumps(ms))
        if ok:
            med = {
                k: statistics.median(m[k] for m in ok)
                for k in ("first_poll_s", "series_s", "poll_ms", "rss_mib")
            }
            m = ok[0]
            table.append(
                (
                    "monitor's first frame on the 1M-step run",
                    f"{med['first_poll_s'] + med['series_s']:.2f} s (poll "
                    f"{med['first_poll_s']:.2f} + chart {med['series_s']:.3f}); curve "
                    f"{m['curve_first']}..{m['curve_last']} of {m['run_last']}; stats "
                    f"step {m['stats_step']} vs progress {m['progress_step']}",
                    TARGETS["monitor_open"],
                )
            )
            table.append(
                (
                    "monitor refresh at 1M steps (worker poll; RSS)",
                    f"{med['poll_ms']:.1f} ms; {med['rss_mib']:.0f} MiB",
                    TARGETS["monitor_refresh"],
                )
            )
    say("\n| measure | measured | target |\n|---|---|---|")
    for a, b, c in table:
        say(f"| {a} | {b} | {c} |")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
