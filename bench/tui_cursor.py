"""A chart frame with the cursor over one 1M-step run, and a compare frame of 8 runs.

  cursor   one run of STEPS steps (bench/tui_chart.py's events, ingested by the agent's
           path): the plot's worker query for the whole run (loss, lr, grad norm: what the
           cursor's readout needs) plus `render_chart` of a 160 x 48 frame whose header is the
           cursor's readout, the cursor in the middle
  compare  RUNS runs of COMPARE_STEPS steps: every run's query plus the render of one
           160 x 48 frame with a trace per run and a cursor

Each: best and median of REPEATS, wall and this process's CPU ms, query and render apart
and together.

    python bench/tui_cursor.py OUT [--steps 1000000] [--runs 8] [--compare-steps 100000]

OUT keeps the runs: a second invocation with the same sizes reuses them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

from tui_chart import make_run, timed  # noqa: E402


def cpu_timed(fn, repeats: int) -> tuple[float, float]:
    """(best, median) CPU ms of this process: on a shared, loaded machine the wall time
    counts the other tenants' work too."""
    out = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        out.append((time.process_time() - t) * 1000)
    return min(out), sorted(out)[len(out) // 2]


def frame_ms(fetches, labels, width, height, repeats, metrics) -> dict:
    from rich.segment import Segment  # noqa: F401 - the render's types

    from tunedeck.tui.widgets.lossplot import PALETTE, Frame, TraceView, render_chart

    buckets = (width - 7) * 2
    windows: list = []

    def query():
        windows[:] = [f(None, None, buckets, metrics) for f in fetches]

    query()
    first = min(w.steps["first"] for w in windows)
    last = max(w.steps["last"] for w in windows)

    def render():
        views = [
            TraceView(lab, PALETTE[i % len(PALETTE)], w)
            for i, (lab, w) in enumerate(zip(labels, windows))
        ]
        f = Frame(first, last, last, views, cursor=(first + last) // 2, smoothing=0.9)
        lines = render_chart(f, width, height)
        assert lines[0][1].text.startswith("step"), "the header is the cursor's readout"

    both = lambda: (query(), render())  # noqa: E731
    return {
        "query": timed(query, repeats) + cpu_timed(query, repeats),
        "render": timed(render, repeats) + cpu_timed(render, repeats),
        "frame": timed(both, repeats) + cpu_timed(both, repeats),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--compare-steps", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    from tunedeck.tui.widgets.lossplot import RunSource

    a.out.mkdir(parents=True, exist_ok=True)
    t = time.time()
    one = make_run(a.out / "one", 1, a.steps)
    runs = [make_run(a.out / f"cmp{i}", 1, a.compare_steps) for i in range(a.runs)]
    print(f"runs ready in {time.time() - t:.0f} s", flush=True)

    src = RunSource(one)
    res = frame_ms([src], ["loss"], 160, 48, a.repeats, ("loss", "lr", "grad_norm"))
    src.close()
    srcs = [RunSource(r) for r in runs]
    cmp = frame_ms(srcs, [f"run{i}" for i in range(a.runs)], 160, 48, a.repeats, ("loss",))
    for s in srcs:
        s.close()
    print("| what | wall best | wall median | CPU best | CPU median |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, d in (
        (f"cursor, 1 run x {a.steps:,} steps", res),
        (f"compare, {a.runs} runs x {a.compare_steps:,} steps", cmp),
    ):
        for part in ("query", "render", "frame"):
            cells = " | ".join(f"{v:.1f} ms" for v in d[part])
            print(f"| {name}: {part} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
