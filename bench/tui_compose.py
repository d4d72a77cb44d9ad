"""Compose screen preview latency: a form edit -> the preview of that edit on screen.

Runs the real ComposeScreen headless (Textual Pilot), edits train.max_steps N times (one
keystroke-sized change each, 150 ms apart like typing, waiting for its preview), and reads
the screen's own record
(ComposeScreen.latencies: from the edit event to the PreviewReady handler having updated the
pane; includes the 30 ms debounce). Also times build_preview alone (the worker's part).
Usage: python bench/tui_compose.py [N] [--real-gpus]
"""

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

from textual.app import App
from textual.widgets import Input

from tunedeck.core.paths import PRESETS_DIR
from tunedeck.core.spec import load_spec, set_values
from tunedeck.core.telemetry.gpus import Gpu, GpuFacts, probe_gpus
from tunedeck.tui.screens import compose as C

N = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 30
REAL = "--real-gpus" in sys.argv
H200 = GpuFacts(gpus=[Gpu(i, "NVIDIA H200", 139.8, (9, 0)) for i in range(2)])
if not REAL:
    C.ComposeScreen.gpu_probe = staticmethod(lambda: H200)


class Host(App):
    def __init__(self, s):
        super().__init__()
        self.s = s
        self.readonly = False
        self.refresh_s = 1.0

    def on_mount(self):
        self.push_screen(self.s)


async def settle(pilot, s, timeout=300):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        await asyncio.sleep(
            0.002
        )  # not pilot.pause: it pings every widget, which the screen would pay for
        if s.preview is not None and not s.preview_pending:
            return
    raise TimeoutError


async def run(name, spec):
    s = C.ComposeScreen(spec, title=name)
    t0 = time.perf_counter()
    async with Host(s).run_test(size=(160, 48)) as pilot:
        await settle(pilot, s)
        first = time.perf_counter() - t0
        s.latencies.clear()
        inp = s.query_one("#" + C.widget_id("train.max_steps"), Input)
        for i in range(N):
            await asyncio.sleep(0.15)  # a typist's pace between edits
            g0 = s.generation
            inp.value = str(100 + i)
            while s.generation == g0:  # the edit reached the screen
                await asyncio.sleep(0.001)
            await settle(pilot, s)
            assert f"{100 + i}" in s.preview_text()
        lat = sorted(x * 1000 for x in s.latencies)
    return first, lat


def row(name, first, lat):
    def q(p):
        return lat[min(int(p * len(lat)), len(lat) - 1)]

    return (
        f"| {name} | {first * 1000:.0f} | {len(lat)} | {statistics.median(lat):.1f} | "
        f"{q(0.9):.1f} | {max(lat):.1f} |"
    )


def worker_only(spec, facts, n=30):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        C.build_preview(spec, facts)
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out), max(out)


async def main():
    demo = load_spec(PRESETS_DIR / "demo.toml")
    swift = set_values(
        load_spec(PRESETS_DIR / "demo.toml"), {"backend": "swift", "name": "swift-demo"}
    )
    swift7b = load_spec(PRESETS_DIR / "swift-ddp-lora-2gpu.toml")
    print(
        f"# python {sys.version.split()[0]}, {os.cpu_count()} cpus, N={N} edits per spec, "
        f"GPU facts: {'this machine (NVML)' if REAL else 'recorded 2x H200'}"
    )
    print(
        "| spec | first preview ms (mount, incl. flag table) | edits | median ms | p90 ms | max ms |"
    )
    print("|---|---|---|---|---|---|")
    for name, spec in (
        ("builtin demo", demo),
        ("swift demo (tiny, CPU)", swift),
        ("swift 7B DDP preset", swift7b),
    ):
        first, lat = await run(name, spec)
        print(row(name, first, lat))
    facts = probe_gpus(topology=False) if REAL else H200
    for name, spec in (("builtin demo", demo), ("swift 7B DDP preset", swift7b)):
        med, mx = worker_only(set_values(spec, {"cluster.master_port": 29500}), facts)
        print(
            f"build_preview alone (the worker's part), {name}: median {med:.1f} ms, max {mx:.1f} ms"
        )
    from tunedeck.core.telemetry.gpus import list_gpus

    ts = []
    for _ in range(10):
        t = time.perf_counter()
        n = len(list_gpus())
        ts.append((time.perf_counter() - t) * 1000)
    print(
        f"list_gpus() (NVML init+query+shutdown; estimate_spec calls it once per preview): "
        f"{n} GPU(s), median {statistics.median(ts):.1f} ms, max {max(ts):.1f} ms"
    )


asyncio.run(main())
