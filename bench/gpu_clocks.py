"""The GPU's SM clock, power and temperature while a benchmark runs, from tunedeck's own NVML
reader (core/telemetry/nvml.py, every sample reading the clocks and power).

A GEMM timed alone for a few milliseconds runs at the boost clock; a training step keeps the
tensor cores busy for seconds and the GPU may lower its clock to hold its power limit. Whether
it does says how much of a kernel's isolated rate a whole step can keep.

  python3 bench/gpu_clocks.py sample FILE [--every S] &   # one JSON line a sample, until killed
  python3 bench/gpu_clocks.py summary FILE [--gpu N]      # the busy samples' medians
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

__import__("checkout").use()  # tunedeck from this checkout unless installed

from tunedeck.core.telemetry.nvml import Nvml  # noqa: E402

KEEP = ("gpu", "t", "util", "power_w", "temp_c", "sm_mhz", "mem_mhz")
BUSY = 90  # % utilisation: a sample inside the benchmark's work, not its start or its gaps


def sample(path: Path, every: float, lib=None, count: int | None = None) -> int:
    """Append one line per GPU every `every` s until SIGTERM (or `count` rounds), each with a
    fresh read of the clocks and power (`lib`: pynvml by default); rounds taken."""
    nvml = Nvml(lib=lib, slow_every=1)
    stop = []
    before = signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    taken = 0
    try:
        with open(path, "a", encoding="utf-8") as f:
            while not stop and (count is None or taken < count):
                for s in nvml.sample():
                    f.write(json.dumps({k: s.get(k) for k in KEEP}) + "\n")
                f.flush()
                taken += 1
                time.sleep(every)
    finally:
        signal.signal(signal.SIGTERM, before)
        nvml.close()
    return taken


def summary(rows: list[dict], gpu: int = 0) -> dict:
    """Over one GPU's busy samples: median and lowest SM clock, median power and temperature,
    and the share of them below the highest clock seen (the clock the GPU boosts to)."""
    mine = [r for r in rows if r.get("gpu") == gpu and r.get("sm_mhz") is not None]
    busy = [r for r in mine if (r.get("util") or 0) >= BUSY]
    out: dict = {"samples": len(mine), "busy": len(busy)}
    if not busy:
        return out
    top = max(r["sm_mhz"] for r in mine)
    clocks = [r["sm_mhz"] for r in busy]
    power = [r["power_w"] for r in busy if r.get("power_w") is not None]
    temp = [r["temp_c"] for r in busy if r.get("temp_c") is not None]
    out.update(
        top_mhz=top,
        median_mhz=statistics.median(clocks),
        min_mhz=min(clocks),
        below_top=round(sum(c < top for c in clocks) / len(clocks), 3),
        median_w=statistics.median(power) if power else None,
        median_c=statistics.median(temp) if temp else None,
    )
    return out


def read(path: Path) -> list[dict]:
    """The samples, skipping a last line the sampler was killed while writing."""
    text = path.read_text(encoding="utf-8")
    return [json.loads(x) for x in text.split("\n")[:-1] if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("sample")
    s.add_argument("file", type=Path)
    s.add_argument("--every", type=float, default=0.2)
    m = sub.add_parser("summary")
    m.add_argument("file", type=Path)
    m.add_argument("--gpu", type=int, default=0)
    a = ap.parse_args(argv)
    if a.verb == "sample":
        sample(a.file, a.every)
        return 0
    print(json.dumps(summary(read(a.file), a.gpu)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
