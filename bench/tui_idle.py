"""An idle TUI over a big registry: first-frame time and CPU while nobody touches it.

RUNS finished run directories are written by the real launch path (`prepare_run`: spec.toml,
plan.json, launch.sh, state.json) and ended as the agent ends them (`RunDir.write_state`:
succeeded / failed / stopped, progress, times). Then the real TUI (`python -m tunedeck.tui`)
starts in a private tmux server (its own -L socket and TMUX_TMPDIR, killed at the end) at
160x48. Reported:

- first frame: seconds from starting the TUI until the pane shows the title bar, and until it
  shows the newest run's id (the runs list drawn from the registry);
- idle CPU: the TUI process's user+system CPU over IDLE seconds after SETTLE seconds, as a
  share of one core (1 s refresh, nothing changing);
- the registry alone, in this process: a cold scan and an idle rescan of the same folder.

    python bench/tui_idle.py [--runs 2000] [--idle 60] [--settle 5] [--checkout DIR]

`--checkout DIR` runs the TUI from another checkout of the repository (e.g. a `git worktree`
of an older commit, for a before/after), through a package of links as bench/checkout.py makes.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

REPO = Path(__file__).resolve().parent.parent
STATUSES = ("succeeded", "failed", "stopped")


def synthesize(root: Path, n: int, seed: int = 0) -> list[str]:
    """n finished runs through prepare_run, ended as the agent records an end."""
    from tunedeck.core.rundir import RunDir
    from tunedeck.core.supervisor import launch
    from tunedeck.core.spec import load_spec

    rng = random.Random(seed)
    spec = load_spec(REPO / "presets" / "demo.toml")
    spec.cluster.device = "cpu"
    now = time.time()
    ids = []
    for i in range(n):
        spec.name = rng.choice(("demo", "lora-7b", "qlora-72b", "sweep", "fsdp2-full"))
        spec.train.max_steps = rng.choice((100, 200, 500, 1000))
        run_id = (
            f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now - i * 3600))}-{spec.name}-{i:04x}"
        )
        with mock.patch.object(launch, "new_run_id", lambda _name, r=run_id: r):
            run_dir = launch.prepare_run(spec, root)
        rd = RunDir(run_dir)
        st = rd.read_state()
        status = STATUSES[i % 3]
        created = now - i * 3600 - 600
        steps = (
            spec.train.max_steps if status == "succeeded" else rng.randrange(spec.train.max_steps)
        )
        st.update(
            status=status,
            created=created,
            started=created + 5,
            ended=created + 500,
            exit_code={"succeeded": 0, "failed": 1}.get(status),
            message="" if status == "succeeded" else f"{status} at step {steps}",
        )
        st["progress"].update(step=steps, loss=round(2.5 - steps / 1000, 4), t=created + 500)
        rd.write_state(st)
        ids.append(run_id)
    return ids


def registry_cost(root: Path, rescans: int = 20) -> dict:
    from tunedeck.core.views.registry import Registry

    reg = Registry(root)
    t = time.perf_counter()
    runs = reg.scan()
    cold = time.perf_counter() - t
    reads = reg.reads
    t = time.perf_counter()
    for _ in range(rescans):
        reg.scan()
    warm = (time.perf_counter() - t) / rescans
    return {
        "runs": len(runs),
        "cold_s": cold,
        "rescan_s": warm,
        "cold_reads": reads,
        "rescan_reads": (reg.reads - reads) / rescans,
    }


class Tmux:
    def __init__(self, tmpdir: Path):
        self.socket = f"tunedeck-bench-{os.getpid()}"
        self.env = {**os.environ, "TMUX_TMPDIR": str(tmpdir)}
        self.env.pop("TMUX", None)

    def __call__(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], env=self.env, capture_output=True, text=True
        ).stdout

    def kill(self) -> None:
        self("kill-server")


def run_tui(home: Path, newest: str, idle_s: float, settle_s: float, checkout: Path | None) -> dict:
    import psutil

    tmp = Path(tempfile.mkdtemp(prefix="tunedeck-tmux-"))
    tmux = Tmux(tmp)
    child = {"TUNEDECK_HOME": str(home)}
    if checkout is not None:
        links = tmp / "links" / "tunedeck"
        links.mkdir(parents=True)
        for name in ("core", "tui", "presets"):
            (links / name).symlink_to(checkout / name)
        child["PYTHONPATH"] = str(links.parent)
    env = [f"{k}={v}" for k, v in child.items()]
    try:
        t0 = time.perf_counter()
        subprocess.run(
            [
                "tmux",
                "-L",
                tmux.socket,
                "new-session",
                "-d",
                "-s",
                "tui",
                "-x",
                "160",
                "-y",
                "48",
                "env",
                *env,
                sys.executable,
                "-m",
                "tunedeck.tui",
            ],
            env=tmux.env,
            check=True,
            cwd=tmp,
        )
        painted = listed = None
        while time.perf_counter() - t0 < 60:
            screen = tmux("capture-pane", "-p", "-t", "tui")
            now = time.perf_counter() - t0
            if painted is None and "tunedeck" in screen:
                painted = now
            if newest in screen:
                listed = now
                break
            time.sleep(0.01)
        pane = int(tmux("list-panes", "-t", "tui", "-F", "#{pane_pid}").split()[0])
        proc = psutil.Process(pane)
        # `env` execs the interpreter, so the pane's pid is the TUI itself
        cmd = " ".join(proc.cmdline())
        time.sleep(settle_s)
        c0, w0 = proc.cpu_times(), time.perf_counter()
        time.sleep(idle_s)
        c1, w1 = proc.cpu_times(), time.perf_counter()
        cpu = (c1.user + c1.system) - (c0.user + c0.system)
        rss = proc.memory_info().rss
        code = subprocess.run(
            [sys.executable, "-c", "import tunedeck.tui.screens.runs as m; print(m.__file__)"],
            env={**os.environ, **child},
            capture_output=True,
            text=True,
        ).stdout
        return {
            "first_paint_s": painted,
            "runs_listed_s": listed,
            "idle_cpu_s": cpu,
            "idle_wall_s": w1 - w0,
            "idle_core_pct": 100.0 * cpu / (w1 - w0),
            "rss_mib": rss / 2**20,
            "cmd": cmd,
            "code": code.strip(),
        }
    finally:
        tmux.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--idle", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--checkout", type=Path, help="run the TUI from this checkout")
    ap.add_argument("--keep", type=Path, help="write the runs here and keep them")
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        print("tmux is not installed", file=sys.stderr)
        return 2
    home = args.keep or Path(tempfile.mkdtemp(prefix="tunedeck-idle-"))
    try:
        t = time.perf_counter()
        ids = synthesize(home / "runs", args.runs)
        print(
            f"synthesized {len(ids)} finished runs in {time.perf_counter() - t:.1f} s under {home}"
        )
        # runs a user left are older than the registry's racy window (files written within
        # it are read again, in case their mtime did not move): wait it out
        from tunedeck.core.views.registry import RACY_S

        time.sleep(RACY_S + 0.5)
        reg = registry_cost(home / "runs")
        print(
            f"registry: {reg['runs']} runs; cold scan {reg['cold_s'] * 1e3:.1f} ms "
            f"({reg['cold_reads']} state.json read); idle rescan "
            f"{reg['rescan_s'] * 1e3:.2f} ms ({reg['rescan_reads']:.0f} read)"
        )
        r = run_tui(
            home, ids[0], args.idle, args.settle, args.checkout.resolve() if args.checkout else None
        )
        print(f"tui code: {r['code']}")
        print(
            f"first frame: title at {r['first_paint_s']:.2f} s, newest run listed at "
            f"{r['runs_listed_s']:.2f} s"
            if r["runs_listed_s"] is not None
            else f"first frame: title at {r['first_paint_s']}, runs never listed"
        )
        print(
            f"idle: {r['idle_cpu_s']:.2f} CPU s over {r['idle_wall_s']:.1f} s = "
            f"{r['idle_core_pct']:.2f} % of one core; RSS {r['rss_mib']:.0f} MiB"
        )
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
