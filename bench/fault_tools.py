"""Helpers for bench/gpu_faults.sh: wait on a live run, hurt one of its processes, summarise
what it recorded, and trim a recorded run directory into a test fixture.

    python3 bench/fault_tools.py wait-step RUN_DIR STEP TIMEOUT_S
    python3 bench/fault_tools.py wait-finding RUN_DIR CATEGORY TIMEOUT_S
    python3 bench/fault_tools.py wait-end RUN_DIR TIMEOUT_S
    python3 bench/fault_tools.py ended RUN_DIR               (exit 0 when it has ended)
    python3 bench/fault_tools.py kill RUN_DIR RANK loader|rank
    python3 bench/fault_tools.py summary RUN_DIR            (prints lines, then one JSON line)
    python3 bench/fault_tools.py trim RUN_DIR FIXTURE_DIR

Waits poll the run directory only (what any viewer reads) and exit 1 on timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

from tunedeck.core.views.registry import read_run  # noqa: E402
from tunedeck.core.store.state import TERMINAL  # noqa: E402
from tunedeck.core.store.store import read_events, read_findings  # noqa: E402

POLL_S = 0.5
TRIM_BYTES = 60_000  # per log file kept in a fixture (its end: where failures are)
MAX_STEPS = 400  # step events kept per rank in a fixture (the last ones)
WARMUP_STEPS = 10  # left out of the steady-state medians of `summary`


def _steps(run_dir: Path, rank: int | None = None) -> list[dict]:
    return read_events(run_dir, "step", rank=rank)


def _first_step_t(run_dir: Path) -> float | None:
    ts = [e["t"] for e in _steps(run_dir) if e.get("step") == 1]
    return min(ts) if ts else None


def _last_step_t(run_dir: Path) -> float | None:
    ts = [e["t"] for e in _steps(run_dir)]
    return max(ts) if ts else None


def wait_step(run_dir: Path, step: int, timeout: float) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        done = [e["step"] for e in _steps(run_dir, 0)]
        if done and max(done) >= step:
            print(f"rank 0 at step {max(done)} after {time.monotonic() - t0:.1f} s")
            return 0
        run = read_run(run_dir)
        if run is not None and run.status in TERMINAL:
            print(f"run ended before step {step}: {run.status} ({run.message})")
            return 1
        time.sleep(POLL_S)
    print(f"timeout: step {step} not reached in {timeout:.0f} s")
    return 1


def wait_finding(run_dir: Path, category: str, timeout: float) -> int:
    """Until the agent stored a finding of `category`; prints when it came, relative to the
    first step (slow/starved ranks) and to the last step before it (hangs, kills)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        hits = [f for f in read_findings(run_dir) if f["category"] == category]
        if hits:
            f = hits[0]
            first = _first_step_t(run_dir)
            before = [e["t"] for e in _steps(run_dir) if e["t"] <= (f.get("t") or 0)]
            since = []
            if first is not None and f.get("t"):
                since.append(f"{f['t'] - first:.1f} s after step 1")
            if before:
                since.append(f"{f['t'] - max(before):.1f} s after the last step before it")
            print(
                f"found {category} (rank {f.get('rank')}, {f['severity']}) "
                f"{'; '.join(since)}: {f['summary']}"
            )
            return 0
        run = read_run(run_dir)
        if run is not None and run.status in TERMINAL and time.monotonic() - t0 > 10:
            # the agent's last diagnosis pass runs as it closes; give it those seconds
            print(f"run ended ({run.status}: {run.message}) without a {category} finding")
            return 1
        time.sleep(POLL_S)
    print(f"timeout: no {category} finding in {timeout:.0f} s")
    return 1


def wait_end(run_dir: Path, timeout: float) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        run = read_run(run_dir)
        if run is not None and run.status in TERMINAL:
            print(
                f"run {run.status} after {time.monotonic() - t0:.1f} s: {run.message} "
                f"(exit code {run.state.get('exit_code')})"
            )
            return 0
        time.sleep(POLL_S)
    print(f"timeout: run still going after {timeout:.0f} s")
    return 1


def _run_procs(run_dir: Path, rank: int):
    """The rank's process and its DataLoader workers (children carrying the same RANK)."""
    import psutil

    run_id = run_dir.name
    mine = []
    for p in psutil.process_iter(["pid", "ppid"]):
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("TUNEDECK_RUN_ID") == run_id and env.get("RANK") == str(rank):
            mine.append(p)
    pids = {p.pid for p in mine}
    ranks = [p for p in mine if p.info["ppid"] not in pids]
    workers = [p for p in mine if p.info["ppid"] in pids]
    return ranks, workers


def kill(run_dir: Path, rank: int, what: str) -> int:
    ranks, workers = _run_procs(run_dir, rank)
    targets = workers[:1] if what == "loader" else ranks
    if not targets:
        print(
            f"no {what} process of rank {rank} found (ranks {[p.pid for p in ranks]}, "
            f"workers {[p.pid for p in workers]})"
        )
        return 1
    for p in targets:
        desc = " ".join(p.cmdline()[:4])  # before the kill: a zombie has no command line
        os.kill(p.pid, signal.SIGKILL)
        print(f"SIGKILL -> {what} of rank {rank}: pid {p.pid} ({desc})")
    return 0


def _median(xs: list[float]) -> float | None:
    s = sorted(x for x in xs if isinstance(x, (int, float)))
    return s[len(s) // 2] if s else None


def summary(run_dir: Path) -> dict:
    """Per-rank step timings, findings with their detection delay, GPU utilisation."""
    steps = _steps(run_dir)
    first = _first_step_t(run_dir)
    out: dict = {"run": run_dir.name, "ranks": {}, "findings": []}
    run = read_run(run_dir)
    if run is not None:
        out["status"], out["message"] = run.status, run.message
    for rank in sorted({e["rank"] for e in steps}):
        mine = [e for e in steps if e["rank"] == rank]
        # the first steps on a GPU take seconds (kernel selection, allocator growth)
        steady = [e for e in mine if e["step"] > WARMUP_STEPS]
        out["ranks"][rank] = {
            "steps": len(mine),
            "last_step": max(e["step"] for e in mine),
            **{
                f"median_{k}": _median([e.get(k) for e in mine])
                for k in ("step_s", "compute_s", "data_wait_s")
            },
            **{
                f"steady_{k}": _median([e.get(k) for e in steady])
                for k in ("step_s", "compute_s", "data_wait_s")
            },
        }
        start = [e for e in read_events(run_dir, "start", rank=rank)]
        if start:
            out["ranks"][rank]["device"] = start[-1].get("device")
    for f in read_findings(run_dir):
        item = {k: f.get(k) for k in ("category", "severity", "rank", "root_cause", "summary")}
        if first is not None and f.get("t"):
            item["after_first_step_s"] = round(f["t"] - first, 1)
        out["findings"].append(item)
    if steps:
        from tunedeck.core.store.store import Store

        t0, t1 = min(e["t"] for e in steps), max(e["t"] for e in steps)
        with Store(run_dir) as store:
            ser = store.telemetry_series("gpu", t0, t1, metrics=["util"])["series"]
        out["gpu_util_mean"] = {
            g: round(
                sum(v for v in s["util"] if v is not None)
                / max(1, sum(v is not None for v in s["util"])),
                1,
            )
            for g, s in ser.items()
        }
    for rank, r in out["ranks"].items():
        print(
            f"rank {rank} ({r.get('device')}): {r['steps']} steps (last {r['last_step']}); "
            f"median step_s {_fmt(r['median_step_s'])} compute_s "
            f"{_fmt(r['median_compute_s'])} data_wait_s {_fmt(r['median_data_wait_s'])}; "
            f"after step {WARMUP_STEPS}: step_s {_fmt(r['steady_step_s'])} compute_s "
            f"{_fmt(r['steady_compute_s'])} data_wait_s {_fmt(r['steady_data_wait_s'])}"
        )
    for f in out["findings"]:
        tag = "root cause" if f["root_cause"] and f["severity"] == "error" else f["severity"]
        print(
            f"finding [{tag}] {f['category']} rank {f['rank']} "
            f"(+{f.get('after_first_step_s')} s): {f['summary']}"
        )
    if out.get("gpu_util_mean"):
        print(
            "GPU utilisation while stepping (mean %): "
            + ", ".join(f"GPU {g} {u}" for g, u in sorted(out["gpu_util_mean"].items()))
        )
    return out


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _tail(src: Path, dst: Path) -> None:
    data = src.read_bytes()
    if len(data) > TRIM_BYTES:
        data = data[-TRIM_BYTES:]
        data = data[data.find(b"\n") + 1 :]
    dst.write_bytes(data)


def trim(run_dir: Path, dest: Path) -> None:
    """What diagnosis reads, small: logs (their ends), the last step events of each rank,
    spec/plan/state, and run.db reduced to findings and telemetry (events live in the
    jsonl files; the offsets table goes too, so readers take every event from the files)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in ("spec.toml", "plan.json", "state.json"):
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, dest / name)
    for src in sorted((run_dir / "logs").rglob("*")):
        if src.is_file():
            dst = dest / src.relative_to(run_dir)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.suffix == ".json":
                shutil.copy2(src, dst)
            else:
                _tail(src, dst)
    (dest / "events").mkdir()
    for src in sorted((run_dir / "events").glob("*.jsonl")):
        lines = src.read_text().splitlines(keepends=True)
        steps = [i for i, ln in enumerate(lines) if '"kind": "step"' in ln]
        cut = set(steps[:-MAX_STEPS]) if len(steps) > MAX_STEPS else set()
        (dest / "events" / src.name).write_text(
            "".join(ln for i, ln in enumerate(lines) if i not in cut)
        )
    if (run_dir / "run.db").exists():
        db_path = dest / "run.db"
        src_db = sqlite3.connect(f"file:{run_dir / 'run.db'}?mode=ro", uri=True)
        db = sqlite3.connect(db_path)
        src_db.backup(db)
        src_db.close()
        db.execute("DROP TABLE IF EXISTS events")
        db.execute("DROP TABLE IF EXISTS offsets")
        db.commit()
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute("VACUUM")
        db.close()


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, run_dir = argv[0], Path(argv[1]) if len(argv) > 1 else None
    if cmd == "wait-step":
        return wait_step(run_dir, int(argv[2]), float(argv[3]))
    if cmd == "wait-finding":
        return wait_finding(run_dir, argv[2], float(argv[3]))
    if cmd == "wait-end":
        return wait_end(run_dir, float(argv[2]))
    if cmd == "ended":
        run = read_run(run_dir)
        return 0 if run is not None and run.status in TERMINAL else 1
    if cmd == "kill":
        return kill(run_dir, int(argv[2]), argv[3])
    if cmd == "summary":
        print(json.dumps(summary(run_dir)))
        return 0
    if cmd == "trim":
        trim(run_dir, Path(argv[2]))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
