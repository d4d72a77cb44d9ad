"""The monitor on big runs: a 1 GB rank log, and a 1M-step, 8-GPU, week-long run.

  log    a rank whose stdout.log is LOG_GB GiB (trainer lines, NCCL INFO at the start, a
         traceback near the end). The core index alone (`RankLog.update` until caught up,
         the last window, 200 random windows, a whole-log search, bytes read, RSS), then the
         monitor in a headless Textual app (a child process, so its RSS is its own): time
         to the log's last lines on screen, and to lines on screen after Home, PageUp x 20
         and End, with the bytes the scrolling read (never the file).
  week   RANKS x STEPS step events in the built-in trainer's schema, ingested by the
         agent's path (`Store(run, write=True).ingest()`), and a week of 1 Hz telemetry for
         8 GPUs, RANKS rank processes and the host through `TelemetryStore` on the same
         Store's connection. While an "agent" thread keeps appending a step per rank, a
         telemetry sample and log lines every 0.5 s (and ingests them), the monitor runs in
         a child process for REFRESHES refreshes at 0.5 s: the UI thread's time per refresh
         (the SnapshotReady handler, and the longest the event loop was held: a probe
         coroutine that wakes every 2 ms records how late it woke, which counts rendering
         and any GIL the worker threads hold), the worker's poll, the RSS, and the first
         frame (process start to the monitor painted, and to its data shown).

    python bench/tui_monitor.py OUT [--log-gb 1] [--ranks 8] [--steps 1000000]
                                    [--days 7] [--refreshes 40] [--md /tmp/bench-monitor.md]

OUT/log and OUT/week are kept and reused by a later invocation with the same sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

T_END = 1.7e9  # the week-long run "now" ends here; the bench shifts it to the wall clock
OUT_LINES: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    OUT_LINES.append(text)


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


# -- building the runs ---------------------------------------------------------------------


def write_state(run_dir: Path, run_id: str, started: float, max_steps: int, ranks: int) -> None:
    """A running run whose agent is this process (alive, so readers see it running)."""
    import psutil

    from tunedeck.core.rundir import RunDir

    me = psutil.Process()
    rd = RunDir(run_dir)
    rd.write_state(
        {
            "run_id": run_id,
            "name": run_id.split("-", 2)[-1],
            "status": "running",
            "message": "",
            "created": started - 60,
            "started": started,
            "host": "bench",
            "agent_pid": me.pid,
            "agent_create_time": me.create_time(),
            "attempt": 0,
            "progress": {"step": 0, "max_steps": max_steps},
        }
    )
    (run_dir / "plan.json").write_text(
        json.dumps({"nproc_per_node": ranks, "nnodes": 1, "world_size": ranks, "nodes": []})
    )
    (run_dir / "spec.toml").write_text('name = "bench"\nbackend = "builtin"\n')


def make_log_run(root: Path, gib: float) -> Path:
    from tunedeck.core.rundir import RunDir

    run_id = f"20261201-000000-biglog-{int(gib * 1000):04d}"
    run_dir = root / "runs" / run_id
    out = run_dir / "logs" / "node0" / f"{run_id}_x" / "attempt_0" / "0" / "stdout.log"
    size = int(gib * 2**30)
    if out.exists() and out.stat().st_size >= size:
        write_state(run_dir, run_id, time.time() - 3600, 10**9, 1)
        return run_dir
    RunDir(run_dir).create()
    write_state(run_dir, run_id, time.time() - 3600, 10**9, 1)
    out.parent.mkdir(parents=True)
    rng = random.Random(1)
    t = time.time()
    with open(out, "w") as f:
        f.writelines(
            f"bench:101:101 [0] NCCL INFO Channel {c:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM\n"
            for c in range(24)
        )
        step, written = 0, 0
        while written < size:
            block = []
            for _ in range(10000):
                step += 1
                line = (
                    f"step {step}/1000000000 loss {2 + 1 / (1 + step / 1e5):.4f} lr "
                    f"1.00e-04 grad_norm {0.5 + rng.random():.3f} "
                    f"{rng.randint(300, 900)} ms\n"
                )
                if step % 5000 == 0:
                    line += (
                        "W1201 00:00:00.000000 101 torch/utils/data/dataloader.py:1] "
                        + "x" * rng.randint(100, 3000)
                        + "\n"
                    )
                block.append(line)
            text = "".join(block)
            f.write(text)
            written += len(text)
        f.write(
            'Traceback (most recent call last):\n  File "train.py", line 1, in <module>\n'
            "RuntimeError: the bench's one error\n"
        )
    (out.parent / "stderr.log").write_text("")
    say(f"  made {out.stat().st_size / 2**30:.2f} GiB rank log in {time.time() - t:.0f} s")
    return run_dir


def step_line(rank: int, step: int, t: float) -> str:
    """One step event as the built-in trainer writes it (tunedeck.core.rundir.events)."""
    loss = 2.0 + 1.0 / (1 + step / 5000) + 0.02 * math.sin(step / 50)
    return (
        json.dumps(
            {
                "t": t,
                "kind": "step",
                "rank": rank,
                "step": step,
                "epoch": step / 1e5,
                "loss": loss,
                "lr": 1e-4,
                "grad_norm": 0.5,
                "tokens": 8192,
                "step_s": 0.6,
                "data_wait_s": 0.004 + 0.1 * (rank == 3),
                "compute_s": 0.4,
                "mem_gib": 61.3,
                "tokens_per_s": 13653.0,
                "mfu": 0.41,
            }
        )
        + "\n"
    )


def make_week_run(root: Path, ranks: int, steps: int, days: float) -> tuple[Path, dict]:
    from tunedeck.core.rundir import RunDir
    from tunedeck.core.store.store import Store

    run_id = f"20261201-000000-week-{ranks}x{steps}"
    run_dir = root / "runs" / run_id
    meta = run_dir / "bench-meta.json"
    if meta.exists():
        info = json.loads(meta.read_text())
        write_state(run_dir, run_id, info["started"], steps * 2, ranks)
        return run_dir, info
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    rd = RunDir(run_dir)
    rd.create()
    span = days * 86400
    # the run ends "now" when made; later invocations carry on from where it ended
    t_end = time.time()
    started = t_end - span
    write_state(run_dir, run_id, started, steps * 2, ranks)
    t0 = time.time()
    dt = span / steps
    for r in range(ranks):
        with open(rd.event_file(r), "w") as f:
            f.write(
                json.dumps(
                    {
                        "t": started,
                        "kind": "start",
                        "rank": r,
                        "world_size": ranks,
                        "max_steps": steps * 2,
                        "start_step": 0,
                    }
                )
                + "\n"
            )
            for a in range(1, steps + 1, 20000):
                f.write(
                    "".join(
                        step_line(r, s, started + s * dt)
                        for s in range(a, min(a + 20000, steps + 1))
                    )
                )
        logs = rd.node_log_dir(0) / f"{run_id}_x" / "attempt_0" / str(r)
        logs.mkdir(parents=True)
        with open(logs / "stdout.log", "w") as f:
            f.writelines(
                f"bench:{100 + r}:{100 + r} [{r}] NCCL INFO Channel {c:02d}/0 : "
                f"{r}[{r}] -> {(r + 1) % ranks}[{(r + 1) % ranks}] via P2P/CUMEM\n"
                for c in range(24)
            )
            f.writelines(f"step {s} loss 2.5\n" for s in range(1, steps + 1, 200))
        (logs / "stderr.log").write_text("")
    say(f"  events: {ranks} x {steps:,} steps written in {time.time() - t0:.0f} s")
    t0 = time.time()
    n = 0
    with Store(rd, write=True) as store:
        while got := len(store.ingest()):
            n += got
        say(f"  ingested {n:,} events in {time.time() - t0:.0f} s")
        t0 = time.time()
        tel = store.telemetry
        samples = int(span)
        for i in range(samples):
            t = started + i
            gpus = [
                (
                    g,
                    {
                        "util": 90.0 - 40 * (g == 3) + 5 * math.sin(i / 300 + g),
                        "mem_util": 40.0,
                        "mem_used_mib": 120000.0 + g,
                        "mem_total_mib": 143771.0,
                        "power_w": 600.0,
                        "temp_c": 65.0,
                        "sm_mhz": 1980.0,
                    },
                )
                for g in range(8)
            ]
            tel.add("gpu", t, gpus)
            tel.add(
                "rank",
                t,
                [
                    (
                        r,
                        {
                            "cpu_pct": 100.0,
                            "rss_mib": 9000.0,
                            "threads": 40,
                            "workers": 4,
                            "workers_cpu_pct": 80.0,
                            "workers_rss_mib": 2000.0,
                        },
                    )
                    for r in range(ranks)
                ],
            )
            tel.add(
                "host",
                t,
                [(0, {"cpu_pct": 40.0, "mem_used_mib": 500000.0, "mem_total_mib": 2000000.0})],
            )
            if i % 3600 == 0:
                tel.commit()
        tel.set_latest(
            "status",
            t_end,
            {
                "nvml": "ok",
                "message": "",
                "driver": "580.159.04",
                "gpus": ["NVIDIA H200"] * 8,
                "interval_s": 1.0,
            },
        )
        tel.flush_buckets()
    say(
        f"  telemetry: {samples:,} samples x (8 GPUs, {ranks} ranks, host) in "
        f"{time.time() - t0:.0f} s; run.db {rd.db.stat().st_size / 2**20:.0f} MiB"
    )
    info = {"started": started, "t_end": t_end, "steps": steps, "dt": dt}
    meta.write_text(json.dumps(info))
    return run_dir, info


class AgentSim(threading.Thread):
    """What the agent does to a live run every 0.5 s: a step per rank, ingested; a telemetry
    sample; a log line per rank."""

    def __init__(self, run_dir: Path, ranks: int, info: dict):
        super().__init__(daemon=True)
        self.run_dir, self.ranks, self.info = run_dir, ranks, info
        self.halt = threading.Event()
        self.ticks = 0

    def run(self) -> None:
        from tunedeck.core.rundir import RunDir
        from tunedeck.core.store.store import Store

        rd = RunDir(self.run_dir)
        logs = [
            p for r in range(self.ranks) for p in rd.rank_log_files(r) if p.name == "stdout.log"
        ]
        step = self.info["steps"] + self.info.get("extra", 0)
        with Store(rd, write=True) as store:
            tel = store.telemetry
            while not self.halt.wait(0.5):
                step += 1
                now = time.time()
                for r in range(self.ranks):
                    with open(rd.event_file(r), "a") as f:
                        f.write(step_line(r, step, now))
                for i, p in enumerate(logs):
                    with open(p, "a") as f:
                        f.write(f"step {step} loss 2.5\n")
                store.ingest()
                tel.add(
                    "gpu",
                    now,
                    [
                        (
                            g,
                            {
                                "util": 90.0,
                                "mem_used_mib": 120000.0,
                                "mem_total_mib": 143771.0,
                                "power_w": 600.0,
                                "temp_c": 65.0,
                            },
                        )
                        for g in range(8)
                    ],
                )
                gpus = [
                    {
                        "gpu": g,
                        "t": now,
                        "util": 90.0 - 40 * (g == 3),
                        "mem_used_mib": 120000.0,
                        "mem_total_mib": 143771.0,
                        "power_w": 600.0,
                        "temp_c": 65.0,
                    }
                    for g in range(8)
                ]
                tel.set_latest("gpus", now, gpus)
                tel.set_latest(
                    "procs",
                    now,
                    {
                        "ranks": [
                            {
                                "rank": r,
                                "pid": 1000 + r,
                                "cpu_pct": 100.0,
                                "rss_mib": 9000.0,
                                "threads": 40,
                                "workers": 4,
                                "workers_cpu_pct": 80.0,
                                "workers_rss_mib": 2000.0,
                            }
                            for r in range(self.ranks)
                        ],
                        "procs": [],
                        "gpu_procs": [
                            {"gpu": g, "pid": 1000 + g, "mib": 120000, "rank": g} for g in range(8)
                        ],
                    },
                )
                tel.set_latest(
                    "host",
                    now,
                    {"cpu_pct": 40.0, "mem_used_mib": 500000.0, "mem_total_mib": 2000000.0},
                )
                tel.commit()
                self.ticks += 1
        self.info["extra"] = step - self.info["steps"]


# -- the child: the monitor in a headless app ----------------------------------------------


def child(args) -> None:
    t_start = time.perf_counter()
    from tunedeck.tui.app import TunedeckApp
    from tunedeck.tui.screens.monitor import MonitorScreen
    from tunedeck.tui.widgets.logview import LogView

    os.environ["TUNEDECK_HOME"] = args.home
    result: dict = {}

    async def main() -> None:
        app = TunedeckApp(open_run=args.run, refresh_s=args.refresh_s)
        lags: list[float] = []
        stop = asyncio.Event()

        async def probe() -> None:  # how late the UI loop wakes a 2 ms sleeper
            while not stop.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.002)
                lags.append(time.perf_counter() - t - 0.002)

        async with app.run_test(size=(160, 48)) as pilot:

            async def until(pred, timeout=60.0):
                end = time.perf_counter() + timeout
                while time.perf_counter() < end:
                    if pred():
                        return time.perf_counter() - t_start
                    await pilot.pause(0.005)
                raise TimeoutError

            screen = lambda: app.screen  # noqa: E731
            result["monitor_mounted_s"] = await until(
                lambda: isinstance(screen(), MonitorScreen) and screen().query(LogView)
            )
            result["data_shown_s"] = await until(lambda: screen().snap is not None)
            view = screen().query_one(LogView)
            result["log_lines_shown_s"] = await until(lambda: any(view.visible_lines()))
            if args.mode == "log":
                result["log_end_shown_s"] = await until(
                    lambda: "the bench's one error" in "".join(view.visible_lines())
                )
                await until(
                    lambda: (
                        view.source is not None
                        and view.source.caught_up
                        and view.total == view.source.total
                    )
                )
                result["log_indexed_s"] = time.perf_counter() - t_start
                result["log_total_lines"] = view.total
                scan = view.source.state().bytes_read
                view.focus()
                steps = []
                for keys in (["home"], ["pagedown"] * 3, ["end"], ["pageup"] * 20, ["G"]):
                    t = time.perf_counter()
                    top = view.scroll_offset.y
                    await pilot.press(*keys)
                    await until(
                        lambda: all(ln for ln in view.visible_lines()[:-1]) and view.visible_lines()
                    )
                    steps.append(
                        (
                            f"{keys[0]} x{len(keys)}",
                            time.perf_counter() - t,
                            top,
                            view.scroll_offset.y,
                        )
                    )
                result["scroll"] = steps
                result["scroll_read_bytes"] = view.source.state().bytes_read - scan
                result["log_file_bytes"] = view.state.size
            else:
                mon = screen()
                await until(lambda: mon.query_one("#gpu-panel").history is not None)
                task = asyncio.create_task(probe())
                mon.show_s.clear()
                lags.clear()
                n0 = len(mon.show_s)
                await until(
                    lambda: len(mon.show_s) >= n0 + args.refreshes,
                    timeout=args.refreshes * args.refresh_s * 10 + 30,
                )
                stop.set()
                await task
                result["show_ms"] = [s * 1000 for s in mon.show_s]
                result["lag_ms"] = sorted(lag * 1000 for lag in lags)[-5:]
                result["lag_p99_ms"] = statistics.quantiles(lags, n=100)[98] * 1000
                w = mon.watcher
                t = time.perf_counter()
                w.poll(history=True)
                result["poll_with_history_ms"] = (time.perf_counter() - t) * 1000
                t = time.perf_counter()
                w.poll(history=False)
                result["poll_ms"] = (time.perf_counter() - t) * 1000
                result["progress"] = mon.query_one("#monitor-stats").text
            result["rss_mib"] = rss_mib()

    asyncio.run(main())
    print("RESULT " + json.dumps(result))


def run_child(mode: str, home: Path, run_id: str, refreshes: int) -> dict:
    argv = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--home",
        str(home),
        "--run",
        run_id,
        "--refreshes",
        str(refreshes),
    ]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(
        f"child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )


# -- the parts -----------------------------------------------------------------------------


def bench_log(out: Path, gib: float) -> None:
    import resource

    from tunedeck.core.rundir import RunDir
    from tunedeck.core.views.watch import RankLog

    say(f"## log: one rank's {gib:g} GiB stdout.log")
    run_dir = make_log_run(out, gib)
    size = sum(p.stat().st_size for p in RunDir(run_dir).rank_log_files(0) if p.exists())
    rss0 = rss_mib()
    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log = RankLog(RunDir(run_dir), 0)
    t = time.perf_counter()
    while True:
        st = log.update(max_bytes=128 << 20)
        if log.caught_up:
            break
    t_index = time.perf_counter() - t
    scan = st.bytes_read
    t = time.perf_counter()
    last = log.lines(st.total - 60, 60)
    t_last = time.perf_counter() - t
    rng = random.Random(3)
    times, reads = [], []
    for _ in range(200):
        b = log.state().bytes_read
        start = rng.randrange(st.total)
        t = time.perf_counter()
        log.lines(start, 60)
        times.append(time.perf_counter() - t)
        reads.append(log.state().bytes_read - b)
    t = time.perf_counter()
    hits = log.search(re.compile(rb"the bench's one error"))
    t_search = time.perf_counter() - t
    t = time.perf_counter()
    first = log.first_error()
    t_first = time.perf_counter() - t
    peak1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ix = log.index[0]
    say(
        f"core  file {size / 2**30:.2f} GiB, {st.total:,} lines; index built in "
        f"{t_index:.2f} s ({scan / 2**30:.2f} GiB scanned once, 1 MB reads), "
        f"{len(ix.cp_line):,} checkpoints ({len(ix.cp_line) * 16 / 1024:.0f} kB)"
    )
    say(
        f"core  last 60 lines {t_last * 1000:.2f} ms ({last[-1][0][:40]!r}); 200 random "
        f"60-line windows: mean {statistics.mean(times) * 1000:.2f} ms, max "
        f"{max(times) * 1000:.2f} ms, read {statistics.mean(reads) / 1024:.0f} kB mean / "
        f"{max(reads) / 1024:.0f} kB max each"
    )
    say(
        f"core  search (one streaming pass) {t_search:.2f} s -> {hits}; first error "
        f"{t_first:.2f} s -> line {first}"
    )
    say(
        f"core  RSS {rss0:.0f} -> {rss_mib():.0f} MiB; peak RSS {peak0:.0f} -> {peak1:.0f} MiB "
        f"(the file is {size / 2**20:.0f} MiB)"
    )
    r = run_child("log", out, run_dir.name, 0)
    say(
        f"tui   monitor mounted {r['monitor_mounted_s']:.2f} s after process start; the "
        f"log's last lines (its true end) on screen {r['log_end_shown_s']:.2f} s, i.e. "
        f"{r['log_end_shown_s'] - r['monitor_mounted_s']:.2f} s after the monitor opened; "
        f"indexed whole (every line reachable) {r['log_indexed_s']:.2f} s "
        f"({r['log_total_lines']:,} lines)"
    )
    for keys, dt, y0, y1 in r["scroll"]:
        say(
            f"tui   {keys:<14} {dt * 1000:7.1f} ms to lines on screen (line {int(y0):,} -> "
            f"{int(y1):,})"
        )
    say(
        f"tui   scrolling read {r['scroll_read_bytes'] / 1024:.0f} kB of the "
        f"{r['log_file_bytes'] / 2**20:.0f} MiB file; TUI RSS {r['rss_mib']:.0f} MiB"
    )


def bench_week(out: Path, ranks: int, steps: int, days: float, refreshes: int) -> None:
    say(f"## week: {ranks} ranks x {steps:,} steps, {days:g} days of 1 Hz telemetry for 8 GPUs")
    run_dir, info = make_week_run(out, ranks, steps, days)
    sizes = sum(p.stat().st_size for p in (run_dir / "events").glob("*.jsonl"))
    say(
        f"  event files {sizes / 2**30:.2f} GiB, run.db "
        f"{(run_dir / 'run.db').stat().st_size / 2**20:.0f} MiB"
    )
    sim = AgentSim(run_dir, ranks, info)
    sim.start()
    try:
        r = run_child("week", out, run_dir.name, refreshes)
    finally:
        sim.halt.set()
        sim.join()
        (run_dir / "bench-meta.json").write_text(json.dumps(info))
    show = r["show_ms"]
    say(
        f"tui   first frame: monitor mounted {r['monitor_mounted_s']:.2f} s after process "
        f"start, run data shown {r['data_shown_s']:.2f} s, log lines "
        f"{r['log_lines_shown_s']:.2f} s"
    )
    say(
        f"tui   {len(show)} refreshes at 0.5 s while the agent appended {sim.ticks} ticks: "
        f"UI handler mean {statistics.mean(show):.2f} ms, max {max(show):.2f} ms"
    )
    say(
        f"tui   UI loop held (probe lateness): p99 {r['lag_p99_ms']:.1f} ms, worst five "
        f"{', '.join(f'{x:.1f}' for x in r['lag_ms'])} ms"
    )
    say(
        f"tui   worker poll {r['poll_ms']:.1f} ms; with the whole-run telemetry strips "
        f"{r['poll_with_history_ms']:.1f} ms (every 10 s, off the UI thread)"
    )
    say(
        f"tui   RSS {r['rss_mib']:.0f} MiB; load average at the end "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    say("tui   progress pane: " + re.sub(r"\[/?[^\]]*\]", "", r["progress"]).replace("\n", " | "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--log-gb", type=float, default=1.0)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--refreshes", type=int, default=40)
    ap.add_argument("--md", type=Path, default=Path("/tmp/bench-monitor.md"))
    ap.add_argument("--only", choices=("log", "week"))
    ap.add_argument("--child", choices=("log", "week"), dest="mode")
    ap.add_argument("--home")
    ap.add_argument("--run")
    ap.add_argument("--refresh-s", type=float, default=0.5)
    args = ap.parse_args()
    if args.mode:
        return child(args)
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    say(f"$ {cmd}")
    say(
        f"  {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the start"
    )
    if args.only in (None, "log"):
        bench_log(args.out, args.log_gb)
    if args.only in (None, "week"):
        bench_week(args.out, args.ranks, args.steps, args.days, args.refreshes)
    args.md.write_text(
        "# tunedeck monitor benchmark (bench/tui_monitor.py)\n\n```\n"
        + "\n".join(OUT_LINES)
        + "\n```\n"
    )
    print(f"written to {args.md}")


if __name__ == "__main__":
    main()
