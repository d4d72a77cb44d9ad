"""Compose form: how long a Tab (focus to the next field) takes, with tunedeck's footer and
with Textual's, which is rebuilt on every focus move (and the remount lays out the form).

Runs the real ComposeScreen headless (Textual Pilot) on the demo preset; each press is timed
with pilot's own wait for every widget to go idle, so a no-op key is timed too: the
difference is the Tab's own work.
Usage: python bench/tui_focus.py [N]
"""

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

import textual.widgets  # noqa: E402
from textual.app import App  # noqa: E402

from tunedeck.core.paths import PRESETS_DIR  # noqa: E402
from tunedeck.core.spec import load_spec  # noqa: E402
from tunedeck.core.telemetry.gpus import Gpu, GpuFacts  # noqa: E402
from tunedeck.tui.screens import compose as C  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 30
H200 = GpuFacts(gpus=[Gpu(i, "NVIDIA H200", 139.8, (9, 0)) for i in range(2)])
C.ComposeScreen.gpu_probe = staticmethod(lambda: H200)


class Host(App):
    def __init__(self, s):
        super().__init__()
        self.s, self.readonly, self.refresh_s = s, False, 1.0

    def on_mount(self):
        self.push_screen(self.s)


async def timed(pilot, key: str) -> float:
    t = time.perf_counter()
    await pilot.press(key)
    await pilot.pause()
    return (time.perf_counter() - t) * 1000


async def run(footer) -> tuple[float, float, int]:
    C.Footer = footer
    s = C.ComposeScreen(load_spec(PRESETS_DIR / "demo.toml"), title="demo")
    async with Host(s).run_test(size=(160, 48)) as pilot:
        while s.preview is None or s.preview_pending:
            await asyncio.sleep(0.01)
        widgets = len(list(s.walk_children()))
        tabs = [await timed(pilot, "tab") for _ in range(N)]
        idle = [await timed(pilot, "f24") for _ in range(N)]
    return statistics.median(tabs), statistics.median(idle), widgets


async def main():
    ours = C.Footer
    print(f"# python {sys.version.split()[0]}, {os.cpu_count()} cpus, N={N} presses each")
    print("| footer | widgets | Tab ms (median) | no-op key ms (median) | Tab's own ms |")
    print("|---|---|---|---|---|")
    for name, footer in (("Textual's", textual.widgets.Footer), ("tunedeck's", ours)):
        tab, idle, widgets = await run(footer)
        print(f"| {name} | {widgets} | {tab:.0f} | {idle:.0f} | {tab - idle:.0f} |")


asyncio.run(main())
