"""Ingest speed: our parsers vs `grep -c` on the same files, and the cost of one poll.

    python bench/ingest_bench.py [OUT_DIR] [--lines 200000] [--big-mb 100] [--no-python]

1. Writes an NCCL-INFO-like log (init lines, per-channel transport lines, WARNs, torch glog
   lines) and a metrics-dict log (ms-swift console dicts glued to tqdm bars by \\r), each
   --lines long, then times `grep -c` and our full read (diagnosis scanner for the NCCL log,
   metrics parser for the dict log) on the same file, best of 3.
2. Poll cost: a file of 1 MB and one of --big-mb MB, both already read; append 200 new dict
   lines and time one incremental poll. It must not grow with the size already read.
Prints a markdown table; with OUT_DIR also writes ingest_bench.json there. CPU only.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

from tunedeck.core.diagnose.scan import FileScanner  # noqa: E402
from tunedeck.core.rundir import Source  # noqa: E402
from tunedeck.core.ingest.metrics import FileMetrics  # noqa: E402


def nccl_text(n: int, rng: random.Random) -> str:
    out = []
    templates = [
        "{h}:{p}:{p} [{d}] NCCL INFO Channel {c:02d}/0 : {d}[{d}] -> {e}[{e}] via P2P/CUMEM",
        "{h}:{p}:{p} [{d}] NCCL INFO Channel {c:02d}/24 : 0 1",
        "{h}:{p}:{p} [{d}] NCCL INFO comm 0x25972ff0 rank {d} nRanks 8 nNodes 1 localRanks 8 "
        "localRank {d} MNNVL 0",
        "{h}:{p}:{p} [{d}] NCCL INFO NCCL version 2.28.9+cuda13.0",
        "{h}:{p}:{p} [{d}] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>",
        "{h}:{p}:{q} [{d}] NCCL INFO [Proxy Service] Device {d} CPU core {c}",
        "{h}:{p}:{p} [{d}] NCCL INFO Trees [0] -1/-1/-1->1->0 [1] -1/-1/-1->1->0 [2] 0/-1/-1->1->-1",
        "W1130 09:40:13.281000 761 torch/distributed/run.py:851] Setting OMP_NUM_THREADS "
        "environment variable for each process to be 1 in default",
        "[rank{d}]:[W1130 09:44:07.868464778 ProcessGroupNCCL.cpp:{c}] Warning: something benign",
    ]
    weights = [60, 15, 5, 3, 3, 4, 5, 2, 3]
    for i in range(n):
        d = rng.randrange(8)
        t = rng.choices(templates, weights)[0]
        out.append(t.format(h="gpu-node-07", p=800 + d, q=900 + d, d=d, e=(d + 1) % 8, c=i % 24))
    return "\n".join(out) + "\n"


def dict_text(n: int, start: int = 1) -> str:
    out = []
    for i in range(start, start + n):
        bar = f"Train: {i % 100:3d}%|████      | {i}/{start + n} [01:02<03:04,  3.21s/it]"
        d = {
            "loss": f"{6.9 - (i % 1000) / 1000:.4g}",
            "grad_norm": "1.552",
            "learning_rate": "9.045e-05",
            "token_acc": "0.015",
            "epoch": f"{i / 1000:.4g}",
            "global_step/max_steps": f"{i}/{start + n}",
            "elapsed_time": "1h 2m 3s",
            "remaining_time": "4m 14s",
            "memory(GiB)": "18.42",
            "train_speed(s/it)": "0.2286",
        }
        out.append(bar + "\r" + str(d) if i % 2 else str(d))
    return "\n".join(out) + "\n"


def time_grep(path: Path, pattern: str) -> tuple[float, int]:
    best, count = float("inf"), 0
    for _ in range(3):
        t0 = time.perf_counter()
        r = subprocess.run(["grep", "-c", pattern, str(path)], capture_output=True, text=True)
        best = min(best, time.perf_counter() - t0)
        count = int(r.stdout.strip() or 0)
    return best, count


def time_ours(path: Path, kind: str, native: bool = True) -> tuple[float, float]:
    """Best of 3: (seconds to ingest, seconds to ingest and build every record as a dict).
    Ingest is the scanner's full poll (NCCL text) or the metrics poll, whose records stay
    columns until read (metrics text); the second figure adds FileMetrics.records()."""
    best, best_dicts = float("inf"), float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        if kind == "nccl":
            sc = FileScanner(Source(path))
            sc.native = native
            sc.poll(final=True)
            t1 = t2 = time.perf_counter()
        else:
            fm = FileMetrics(path)
            fm.native = native
            new = fm.poll(final=True)
            t1 = time.perf_counter()
            recs = fm.records()
            t2 = time.perf_counter()
            assert len(new) == len(recs) > 0
            del new, recs
        best = min(best, t1 - t0)
        best_dicts = min(best_dicts, t2 - t0)
    return best, best_dicts


def poll_cost(tmp: Path, size_mb: int) -> float:
    """Seconds for one poll after 200 new lines, once `size_mb` MB have been read."""
    p = tmp / f"poll_{size_mb}.log"
    block = dict_text(2000)
    with open(p, "w") as f:
        while f.tell() < size_mb << 20:
            f.write(block)
    fm = FileMetrics(p)
    fm.poll()  # catch up with what is there (not timed)
    costs = []
    for k in range(5):
        with open(p, "a") as f:
            f.write(dict_text(200, start=10_000_000 + 200 * k))
        t0 = time.perf_counter()
        new = fm.poll()
        costs.append(time.perf_counter() - t0)
        assert len(new) == 200, len(new)
    p.unlink()
    return sorted(costs)[len(costs) // 2]


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0]) if argv and not argv[0].startswith("--") else None
    lines = int(argv[argv.index("--lines") + 1]) if "--lines" in argv else 200_000
    big = int(argv[argv.index("--big-mb") + 1]) if "--big-mb" in argv else 100
    tmp = Path(tempfile.mkdtemp(prefix="tunedeck-ingest-bench-"))
    rng = random.Random(7)
    results = {
        "lines": lines,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "rows": [],
    }
    try:
        for kind, text, pattern in (
            ("nccl", nccl_text(lines, rng), "NCCL"),
            ("metrics dict", dict_text(lines), "loss"),
        ):
            p = tmp / f"{kind.replace(' ', '_')}.log"
            p.write_text(text)
            g, count = time_grep(p, pattern)
            fmt = "nccl" if kind == "nccl" else "metrics"
            ours, ours_dicts = time_ours(p, fmt)
            py, _ = time_ours(p, fmt, native=False) if "--no-python" not in argv else (0, 0)
            results["rows"].append(
                {
                    "file": kind,
                    "lines": lines,
                    "mb": round(p.stat().st_size / 2**20, 1),
                    "grep_lines_per_s": round(lines / g),
                    "grep_matches": count,
                    "ours_lines_per_s": round(lines / ours),
                    "ratio": round(g / ours, 3),
                    "with_dicts_lines_per_s": round(lines / ours_dicts),
                    "python_lines_per_s": round(lines / py) if py else None,
                    "native": FileScanner.native and FileMetrics.native,
                }
            )
        results["poll_s_after_1mb"] = poll_cost(tmp, 1)
        results["poll_s_after_big"] = poll_cost(tmp, big)
        results["big_mb"] = big
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        "| file | lines | MB | grep -c lines/s | tunedeck lines/s | ratio | "
        "+ every record as a dict | pure-Python path |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results["rows"]:
        py = f"{r['python_lines_per_s']:,}" if r["python_lines_per_s"] else "-"
        print(
            f"| {r['file']} | {r['lines']} | {r['mb']} | {r['grep_lines_per_s']:,} | "
            f"{r['ours_lines_per_s']:,} | {r['ratio']:.3f} | "
            f"{r['with_dicts_lines_per_s']:,} | {py} |"
        )
    if not results["rows"][0]["native"]:
        print("\n(native scanner not built: the pure-Python path was timed)")
    print(
        f"\none poll of 200 new lines: {results['poll_s_after_1mb'] * 1e3:.2f} ms after 1 MB, "
        f"{results['poll_s_after_big'] * 1e3:.2f} ms after {big} MB already read"
    )
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "ingest_bench.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
