"""Record the corpus's real cases: torchrun + gloo on CPU, the console kept as a user pastes it.

    .venv/bin/python tests/corpus/record.py [NAME ...]

Writes tests/corpus/recorded/<name>.log and the expectations in tests/corpus/recorded.json.
Some runs use `--tee 3` (every child line prefixed `[defaultN]:`), the others print as torchrun
does by default (children's output mixed into the console, unprefixed).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
OUT = HERE / "recorded"

# name: (worker mode, tee, expected category, expected rank, note)
SCENARIOS = {
    "raise": ("raise", False, "rank_crashed", 1, ""),
    "raise_tee": ("raise", True, "rank_crashed", 1, ""),
    "sigkill": ("sigkill", False, "worker_sigkill", 1, ""),
    "sigkill_tee": ("sigkill", True, "worker_sigkill", 1, ""),
    "segfault": ("segfault", False, "worker_segfault", 1, ""),
    "segfault_faulthandler": ("segfault_fh", True, "worker_segfault", 1, ""),
    "abort": ("abort", False, "worker_sigabrt", 1, ""),
    "exit_abort": ("exit_abort", False, "exit_abort", 1, "std::terminate after the last step"),
    "oom_host": ("oom_host", True, "oom_host", 1, ""),
    "too_many_open_files": ("fds", False, "too_many_open_files", 1, ""),
    "hang_gloo_timeout": ("hang", True, "nccl_timeout", 0, "gloo's timeout wording"),
    "loader_killed": ("loader_killed", False, "dataloader_worker_killed", 1, ""),
    "loader_raise": ("loader_raise", True, "rank_crashed", 1, "KeyError in a worker"),
    "exit1_everywhere": ("exit1", False, "rank_crashed", None, "no traceback at all"),
    "sighup_launcher": ("sighup", False, "launcher_signal", None, ""),
    "ddp_unused": ("unused", True, "ddp_unused_parameters", None, ""),
    "bad_flag": ("--no-such-flag", False, "flag_error", None, ""),
    "port_clash": ("ok", False, "port_in_use", None, "a listener holds the port"),
    "rendezvous_timeout": ("ok", False, "rendezvous_unreachable", None, "second node never starts"),
    "sigterm_rank_outside": (
        "sigterm_outside",
        False,
        "worker_sigterm",
        1,
        "a kill -TERM to rank 1 from outside",
    ),
    "healthy": ("ok", False, None, None, ""),
    "healthy_tee": ("ok", True, None, None, ""),
    "healthy_nan": ("nan", False, "loss_anomaly", None, "the loss turns NaN; the run goes on"),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    e.pop("TORCHELASTIC_ERROR_FILE", None)
    return e


def record(name: str) -> None:
    mode, tee, *_ = SCENARIOS[name]
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--max_restarts",
        "0",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
    ]
    if name == "rendezvous_timeout":
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc_per_node",
            "1",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"127.0.0.1:{port}",
            "--rdzv_conf",
            "join_timeout=5",
            "--rdzv_id",
            "corpus",
        ]
    if tee:
        argv += ["--tee", "3"]
    worker_mode = "ok" if mode == "sigterm_outside" else mode
    argv += [str(WORKER), worker_mode]
    if mode == "sigterm_outside":
        argv += ["--steps", "60"]
    holder = None
    if name == "port_clash":
        holder = socket.socket()
        holder.bind(("127.0.0.1", port))
        holder.listen()
    OUT.mkdir(exist_ok=True)
    with open(OUT / f"{name}.log", "wb") as f:
        p = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env(), cwd=HERE
        )
        if mode == "sigterm_outside":
            time.sleep(6)
            kids = subprocess.run(
                ["pgrep", "-P", str(p.pid)], capture_output=True, text=True
            ).stdout.split()
            if len(kids) >= 2:
                os.kill(int(sorted(kids, key=int)[1]), signal.SIGTERM)
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if holder is not None:
        holder.close()
    # the machine's paths are the recorder's business, not the corpus's
    text = (OUT / f"{name}.log").read_text(errors="replace")
    text = text.replace(str(HERE), "/home/user/job").replace(sys.prefix, "/opt/venv")
    (OUT / f"{name}.log").write_text(text)


def main(names: list[str]) -> None:
    for n in names or list(SCENARIOS):
        t0 = time.time()
        record(n)
        print(f"{n}: {time.time() - t0:.1f} s", flush=True)
    manifest = {
        n: {
            "category": c,
            "rank": r,
            "source": "recorded: tests/corpus/record.py "
            f"({m}{', --tee 3' if tee else ''}; torch {torch_version()})",
            "note": note,
        }
        for n, (m, tee, c, r, note) in SCENARIOS.items()
    }
    (HERE / "recorded.json").write_text(json.dumps(manifest, indent=1) + "\n")


def torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main(sys.argv[1:])
