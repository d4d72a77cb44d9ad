"""PyTorch's Flight Recorder in the ranks: on by default, dumped on a timeout and on request.

`flight_env` turns it on at launch (every backend): a ring of the last collectives per rank,
dumped by NCCL's watchdog on a timeout into the run's flight/ folder. A hang under a long
timeout never reaches the watchdog, so each rank also runs `serve`: a thread that polls
flight/request and, when the agent touches it (a stall), writes the rank's dump to
flight/rank<r> at once. A thread, not a signal: a rank blocked in a collective runs no Python
signal handler until the collective returns, but it releases the GIL while it waits.
Read by core/diagnose/flight.py.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

BUFFER = "2000"  # entries per rank: a few steps of FSDP's collectives
POLL_S = 0.5


def folder(run_dir: str | Path) -> Path:
    return Path(run_dir) / "flight"


def flight_env(run_dir: str | Path) -> dict[str, str]:
    """The variables that turn the recorder on (torch >= 2.8 names)."""
    return {
        "TORCH_FR_BUFFER_SIZE": BUFFER,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(folder(run_dir) / "rank"),
    }


def request(run_dir: str | Path) -> float:
    """Ask every rank of the run for a dump now; returns the request's time."""
    d = folder(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / "request"
    p.touch()
    os.utime(p)
    return p.stat().st_mtime


def _dump(out: Path) -> None:
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d

    if not dist.is_initialized():
        return
    # NCCL keeps its own recorder; gloo's is the generic one. No stack traces: symbolising
    # them from a second thread while the main one waits takes seconds to minutes.
    fn = getattr(c10d, "_dump_nccl_trace", None) if dist.get_backend() == "nccl" else None
    fn = fn or c10d._dump_fr_trace
    data = fn(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)


def answer_requests(request: Path, answer, name: str, poll_s: float = POLL_S) -> None:
    """Start a daemon thread that calls `answer()` each time `request`'s mtime moves on (a
    reader touched it). Used for the recorder's dumps and the rank's stack dumps: a thread,
    not a signal handler (module docstring; core/train/trainer.py `_register_stack_dump`)."""

    def loop() -> None:
        seen = _mtime(request)
        ev = threading.Event()
        while not ev.wait(poll_s):
            t = _mtime(request)
            if t > seen:
                seen = t
                try:
                    answer()
                except Exception as e:  # never break the rank over a diagnostic
                    print(f"tunedeck: {name} failed: {e}", file=sys.stderr)

    threading.Thread(target=loop, name=name, daemon=True).start()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def serve(run_dir: str | Path | None = None, rank: int | None = None) -> None:
    """Start the dump thread of this rank (a daemon; no-op outside a tunedeck run)."""
    run_dir = run_dir or os.environ.get("TUNEDECK_RUN_DIR")
    if not run_dir or "TORCH_FR_BUFFER_SIZE" not in os.environ:
        return
    rank = int(os.environ.get("RANK", "0") or 0) if rank is None else rank
    out = folder(run_dir) / f"rank{rank}"
    answer_requests(folder(run_dir) / "request", lambda: _dump(out), "tunedeck-flight")
