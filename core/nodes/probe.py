"""`python -m tunedeck.core.nodes.probe HOST PORT [PATH...]`, run on a node over ssh by the
preflight: what that node has, as one JSON line. Imports nothing heavy (versions come from the
installed distributions' metadata, GPUs from the driver's /proc entries, never NVML or torch).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from importlib import metadata

from tunedeck.core.nodes.iface import facts


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _reach(host: str, port: int, timeout_s: float = 3.0) -> str:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return "ok"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def _gpu_procs() -> int | None:
    """Processes holding a GPU now (nvidia-smi's compute apps); None without the driver."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return None
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return len([x for x in r.stdout.splitlines() if x.strip()]) if r.returncode == 0 else None


def probe(host: str, port: int, paths: list[str]) -> dict:
    try:
        gpus = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        gpus = 0
    return {
        "host": os.uname().nodename,
        "python": sys.executable,
        "tunedeck": _version("tunedeck"),
        "torch": _version("torch"),
        "gpus": gpus,
        "gpu_procs": _gpu_procs() if gpus else None,
        "reach": _reach(host, port) if port else "not asked",
        "missing": [p for p in paths if not os.path.exists(p)],
        # the address its ranks would talk from, the interface to the master (iface.py)
        "net": facts(host) if host else None,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(json.dumps(probe(argv[0], int(argv[1]), argv[2:])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
