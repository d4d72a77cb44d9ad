"""The loss chart over a long run: the Store's window query and the widget's drawing, apart.

A run directory gets RANKS x STEPS step events in the built-in trainer's schema (an eval every
500 steps, one loss spike), ingested by the agent's own path (`Store(run, write=True).ingest()`
until it returns nothing). Then:

  query   `Store.step_series` + `Store.eval_series` of a read-only Store (what the plot's worker
          asks) for the whole run and for zoomed windows, on rank 0 and the last rank; best and
          median of REPEATS, and the first call of a fresh Store (opens run.db, reads the tails)
  render  `render_chart` + one Strip per line (what `LossPlot.render_line` does on a redraw)
          from the decimated buckets of the whole run, at 160 x 48 and 80 x 24, with eval,
          learning rate and grad norm shown, linear and log y
  widget  a LossPlot in a headless Textual app at 160 x 48: `refresh_data()` to the lines
          drawn (the worker's query, the message, the redraw), and a redraw alone

    python bench/tui_chart.py OUT [--ranks 8] [--steps 1000000] [--repeats 7]

OUT/run is kept: a second invocation with the same sizes reuses it (the ingest takes minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

T0 = 1.7e9
SPIKE = 0.777777  # where in the run the one spike is (a fraction of the steps)


def spike_at(steps: int) -> int:
    return max(1, int(steps * SPIKE))


def step_line(rank: int, step: int, spike: int) -> str:
    loss = 2.0 + 1.0 / (1 + step / 500) + ((step * 7919) % 97) * 1e-3
    if step == spike:
        loss = 40.0
    return (
        json.dumps(
            {
                "t": T0 + step * 0.5,
                "kind": "step",
                "rank": rank,
                "step": step,
                "loss": loss,
                "lr": 1e-4 * min(1.0, step / 2000),
                "grad_norm": 0.5 + (step % 7) * 0.01,
                "tokens": 8192,
                "step_s": 0.5,
                "data_wait_s": 0.004,
                "compute_s": 0.31,
                "mem_gib": 61.3,
                "tokens_per_s": 16384.0,
                "epoch": step // 100_000,
                "mfu": 0.41,
            }
        )
        + "\n"
    )


def make_run(path: Path, ranks: int, steps: int) -> Path:
    from tunedeck.core.rundir import RunDir
    from tunedeck.core.store.store import Store

    done = path / "made.json"
    if done.exists() and json.loads(done.read_text()) == {"ranks": ranks, "steps": steps}:
        print(f"reusing {path} ({ranks} x {steps:,} steps)", flush=True)
        return path
    run = RunDir(path)
    if path.exists():
        import shutil

        shutil.rmtree(path)
    run.create()
    t = time.time()
    for r in range(ranks):
        with open(run.event_file(r), "w") as f:
            f.write(
                json.dumps(
                    {
                        "t": T0,
                        "kind": "start",
                        "rank": r,
                        "world_size": ranks,
                        "max_steps": steps,
                        "start_step": 0,
                    }
                )
                + "\n"
            )
            chunk = []
            for s in range(1, steps + 1):
                chunk.append(step_line(r, s, spike_at(steps)))
                if s % 500 == 0:
                    chunk.append(
                        json.dumps(
                            {
                                "t": T0 + s * 0.5,
                                "kind": "eval",
                                "rank": r,
                                "step": s,
                                "eval_loss": 1.9 + 1.0 / (1 + s / 500),
                                "eval_tokens": 4096,
                            }
                        )
                        + "\n"
                    )
                if len(chunk) >= 20000:
                    f.write("".join(chunk))
                    chunk = []
            f.write("".join(chunk))
    wrote = time.time() - t
    t = time.time()
    n = 0
    with Store(run, write=True) as store:
        while got := len(store.ingest()):
            n += got
    print(
        f"made {ranks} x {steps:,} steps: events written in {wrote:.0f} s, {n:,} events "
        f"ingested in {time.time() - t:.0f} s; run.db {run.db.stat().st_size / 2**20:.0f} MiB",
        flush=True,
    )
    done.write_text(json.dumps({"ranks": ranks, "steps": steps}))
    return path


def timed(fn, repeats: int) -> tuple[float, float]:
    """(best, median) wall ms."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return min(out), statistics.median(out)


def bench_query(run: Path, ranks: int, steps: int, buckets: int, repeats: int) -> list[dict]:
    from tunedeck.core.store.store import Store

    windows = [("whole run", None, None)]
    for frac in (2, 8, 64, 1024):
        span = steps // frac
        mid = spike_at(steps) - span // 2
        windows.append((f"1/{frac} of the run ({span:,} steps)", max(mid, 1), max(mid, 1) + span))
    windows.append(("300 steps", spike_at(steps) - 150, spike_at(steps) + 149))
    rows = []
    for rank in sorted({0, ranks - 1}):
        with Store(run) as store:
            t = time.perf_counter()
            store.step_series(rank, None, None, buckets, ("loss",))
            store.eval_series(rank, None, None, buckets)
            cold = (time.perf_counter() - t) * 1000
            rows.append(
                {
                    "what": f"rank {rank}: first call of a fresh Store (whole run)",
                    "best_ms": round(cold, 2),
                    "median_ms": round(cold, 2),
                }
            )
            for name, a, b in windows:
                for metrics in (("loss",), ("loss", "lr", "grad_norm")):

                    def q():
                        s = store.step_series(rank, a, b, buckets, metrics)
                        store.eval_series(rank, a, b, buckets)
                        q.n = len(s["step"])
                        q.top = max((v for v in s["loss_max"] if v is not None), default=None)

                    best, med = timed(q, repeats)
                    rows.append(
                        {
                            "what": f"rank {rank}: {name}, {'+'.join(metrics)}",
                            "buckets": q.n,
                            "max_loss": q.top,
                            "best_ms": round(best, 2),
                            "median_ms": round(med, 2),
                        }
                    )
    return rows


def bench_render(run: Path, repeats: int) -> list[dict]:
    from textual.strip import Strip

    from tunedeck.tui.widgets.lossplot import Frame, RunSource, TraceView, render_chart

    rows = []
    src = RunSource(run)
    for width, height in ((160, 48), (80, 24)):
        buckets = (width - 7) * 2
        whole = src(None, None, buckets, ("loss", "lr", "grad_norm"))
        first, last = whole.extent()
        for log_y in (False, True):
            frame = Frame(
                first,
                last,
                last,
                [TraceView("loss", "#5fafff", whole)],
                log_y=log_y,
                show_eval=True,
                show_lr=True,
                show_grad=True,
            )

            def draw():
                lines = [Strip(segs, width) for segs in render_chart(frame, width, height)]
                draw.lines = lines

            best, med = timed(draw, repeats * 3)
            # the one spike step reaches the top row (loss alone: nothing else is that high)
            only_loss = Frame(
                first,
                last,
                last,
                [TraceView("loss", "#5fafff", whole)],
                log_y=log_y,
                show_eval=False,
            )
            top = "".join(s.text for s in render_chart(only_loss, width, height)[1])
            rows.append(
                {
                    "what": f"render {width}x{height} from {sum(whole.steps['n']):,} steps "
                    f"in {len(whole.steps['step'])} buckets, eval+lr+grad"
                    f"{', log y' if log_y else ''}",
                    "spike_cells_on_top_row": sum(ch >= "\u2800" and ch <= "\u28ff" for ch in top),
                    "best_ms": round(best, 2),
                    "median_ms": round(med, 2),
                }
            )
    src.close()
    return rows


def bench_widget(run: Path, repeats: int) -> list[dict]:
    from textual.app import App

    from tunedeck.tui.widgets.lossplot import LossPlot

    class ChartApp(App):
        def compose(self):
            yield LossPlot(run, id="plot")

    rows = []

    async def go():
        app = ChartApp()
        async with app.run_test(size=(160, 48)) as pilot:
            plot = app.query_one(LossPlot)
            while not plot.loaded:
                await pilot.pause(0.05)
            await pilot.pause(0.5)
            plot.action_toggle("show_lr")
            round_trips = []
            for _ in range(repeats):
                seen = plot.windows
                t = time.perf_counter()
                plot.refresh_data()
                while plot.windows is seen:
                    await asyncio.sleep(0.001)
                for y in range(48):
                    plot.render_line(y)
                round_trips.append((time.perf_counter() - t) * 1000)
            rows.append(
                {
                    "what": "widget 160x48: refresh_data() -> query in the worker -> "
                    "lines drawn (whole run, loss+lr)",
                    "best_ms": round(min(round_trips), 2),
                    "median_ms": round(statistics.median(round_trips), 2),
                }
            )

            def redraw():
                plot._lines = None
                for y in range(48):
                    plot.render_line(y)

            best, med = timed(redraw, repeats * 3)
            rows.append(
                {
                    "what": "widget 160x48: a redraw (a key like y or e): every line",
                    "best_ms": round(best, 2),
                    "median_ms": round(med, 2),
                }
            )

    asyncio.run(go())
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run = make_run(args.out / "run", args.ranks, args.steps)
    results = {"ranks": args.ranks, "steps": args.steps}
    for name, rows in (
        ("query", bench_query(run, args.ranks, args.steps, 306, args.repeats)),
        ("render", bench_render(run, args.repeats)),
        ("widget", bench_widget(run, args.repeats)),
    ):
        print(f"{name}:")
        for row in rows:
            print("  " + json.dumps(row))
        results[name] = rows
    (args.out / "tui_chart.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
