"""The monitor as plain text at a terminal size, for side-by-side captures in the docs.

It opens the monitor's test fixture run (tests/test_tui_monitor.py `build_run`: two H200 ranks,
a failed run with findings, NCCL logs and 200 steps) in a headless app and prints the screen as
text, exactly what a terminal of that size shows, less the colours.

    python bench/tui_capture.py [--size 160x48] [--keys "tab tab"] > monitor.txt
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed


async def capture(size: tuple[int, int], keys: list[str]) -> str:
    import os

    from rich.console import Console

    from tests.test_tui_monitor import RUN_ID, _ready, build_run
    from tunedeck.tui.app import TunedeckApp

    home = Path(tempfile.mkdtemp(prefix="tunedeck-capture-"))
    os.environ["TUNEDECK_HOME"] = str(home)
    build_run(home)
    app = TunedeckApp(open_run=RUN_ID, refresh_s=3600)
    async with app.run_test(size=size) as pilot:
        t = time.monotonic()
        while not _ready(app):
            if time.monotonic() - t > 30:
                raise SystemExit("the monitor showed no data in 30 s")
            await pilot.pause(0.05)
        for k in keys:
            await pilot.press(k)
        await pilot.pause(0.3)
        console = Console(
            width=size[0], height=size[1], file=io.StringIO(), record=True, color_system=None
        )
        console.print(app.screen._compositor.render_update(full=True))
        return console.export_text()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="160x48")
    ap.add_argument("--keys", default="", help="keys pressed before the capture")
    a = ap.parse_args()
    w, h = (int(x) for x in a.size.split("x"))
    sys.stdout.write(asyncio.run(capture((w, h), a.keys.split())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
