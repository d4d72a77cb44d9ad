"""The agent's memory over a `builtin:` demo run: launch presets/demo.toml (the tiny model
built on first use, 2 gloo ranks on CPU) in a fresh TUNEDECK_HOME and sample the agent's RSS
twice a second until the run ends.

    python3 bench/agent_rss.py [OUT] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    args = sys.argv[1:]
    out = Path(args.pop(0)) if args and not args[0].startswith("--") else None
    home = Path(tempfile.mkdtemp(prefix="tunedeck-rss-"))
    env = {**os.environ, "TUNEDECK_HOME": str(home), "HOME": str(home), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "tunedeck.cli", "launch", str(REPO / "presets/demo.toml")]
    launched = subprocess.run(
        argv + ["--json", "--no-preflight", *args], env=env, capture_output=True, text=True
    )
    run_dir = Path(json.loads(launched.stdout.splitlines()[0])["run_dir"])
    agent = None
    samples: list[tuple[float, str, float]] = []
    t0 = time.time()
    while time.time() - t0 < 600:
        st = json.loads((run_dir / "state.json").read_text() or "{}")
        if agent is None and st.get("agent_pid"):
            agent = psutil.Process(st["agent_pid"])
        if agent is not None:
            try:
                rss = agent.memory_info().rss / 2**20
            except psutil.NoSuchProcess:
                break
            samples.append((round(time.time() - t0, 1), st.get("status", ""), round(rss, 1)))
        time.sleep(0.5)
    res = {
        "status": st.get("status"),
        "samples": len(samples),
        "rss_max_mib": max(s[2] for s in samples),
        "rss_median_mib": sorted(s[2] for s in samples)[len(samples) // 2],
        "rss_by_status": {
            k: max(s[2] for s in samples if s[1] == k) for k in {s[1] for s in samples}
        },
        "wall_s": round(time.time() - t0, 1),
    }
    print(json.dumps(res))
    if out:
        out.write_text(json.dumps({**res, "trace": samples}, indent=1))


if __name__ == "__main__":
    main()
