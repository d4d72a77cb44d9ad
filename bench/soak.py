"""Soak: many CPU demo runs launched, stopped (graceful and hard), their agents SIGKILLed and
adopted, in a random (seeded) order, a few at a time. Everything goes through the real command
line (`python -m tunedeck.tui ...`), so the launcher, the agent, torchrun, the ranks, the
registry's adoption and `stop` are the ones users run.

Scenarios (each run gets one, drawn from the seed):
  complete        a short run left alone                            → succeeded, every step
  graceful        a long run, `stop` after 0-4 s (often before any  → stopped, exit 0, no
                  rank exists)                                         SIGKILL needed
  hard            a long run, `stop --hard` after 0-4 s             → stopped
  adopt-complete  a short run whose agent is SIGKILLed; `status`    → succeeded, every step
                  (a read) adopts it
  adopt-stop      a long run whose agent is SIGKILLed; `stop` adopts → stopped, exit 0, a
                  it and stops it gracefully                           checkpoint, no SIGKILL
  unwatched       a short run whose agent is SIGKILLed; nobody reads → succeeded, every step
                  it until its ranks have finished; then `status`
                  adopts it and records the true end

Counted at the end (all must be 0):
  processes left   any process still carrying a run's TUNEDECK_RUN_ID, or its agent
  records lost     steps in a rank's event file missing from run.db, or `tunedeck metrics`
                   not 1..N without a gap
  wrong statuses   a status other than the scenario's (also: "lost" expected right after an
                   agent's death while its ranks live, "failed" once they are gone unread)

    python bench/soak.py [--runs 50] [--seed 12] [--jobs 2] [--home DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
__import__("checkout").use()  # tunedeck from this checkout unless installed

import psutil  # noqa: E402

from tunedeck.core.runs import procs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "presets" / "demo.toml"
SCENARIOS = ("complete", "graceful", "hard", "adopt-complete", "adopt-stop", "unwatched")
TERMINAL = ("succeeded", "failed", "stopped")


@dataclass
class Result:
    n: int
    scenario: str
    run_id: str = ""
    status: str = ""
    expected: str = ""
    seconds: float = 0.0
    steps: int = 0
    wrong: list[str] = field(default_factory=list)
    lost: int = 0
    left: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Soak:
    def __init__(self, home: Path):
        self.home = home
        self.env = dict(os.environ, TUNEDECK_HOME=str(home))
        for k in list(self.env):
            if k.startswith("TUNEDECK_") and k not in ("TUNEDECK_HOME", "TUNEDECK_CACHE"):
                self.env.pop(k)

    def cli(
        self, *args: str, no_adopt: bool = False, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        env = dict(self.env)
        if no_adopt:
            env["TUNEDECK_NO_ADOPT"] = "1"
        return subprocess.run(
            [sys.executable, "-m", "tunedeck.tui", *args],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def json(self, *args: str, **kw):
        p = self.cli(*args, "--json", **kw)
        if p.returncode not in (0, 1) or not p.stdout.strip():
            raise RuntimeError(f"tunedeck {' '.join(args)}: {p.returncode}\n{p.stderr[-2000:]}")
        return json.loads(p.stdout)

    def state(self, run_id: str) -> dict:
        try:
            return json.loads((self.home / "runs" / run_id / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def launch(self, steps: int) -> str:
        out = self.json(
            "launch",
            str(DEMO),
            "--set",
            f"train.max_steps={steps}",
            "--set",
            "train.save_steps=0",
            "--no-preflight",
        )
        return out["run_id"]

    def wait(self, pred, timeout: float, poll: float = 0.3):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            v = pred()
            if v:
                return v
            time.sleep(poll)
        return None

    def status(self, run_id: str, no_adopt: bool = False) -> dict:
        return self.json("status", run_id, no_adopt=no_adopt)

    def wait_end(self, run_id: str, timeout: float = 300) -> dict:
        return self.wait(
            lambda: (s := self.status(run_id))["status"] in TERMINAL and s, timeout, poll=0.5
        ) or self.status(run_id)

    def kill_agent(self, run_id: str, r: Result) -> dict:
        st = self.wait(lambda: (s := self.state(run_id)).get("agent_pid") and s, 30)
        os.kill(st["agent_pid"], signal.SIGKILL)
        self.wait(lambda: _gone([st["agent_pid"]]), 10, poll=0.05)
        return st

    # -- scenarios ---------------------------------------------------------------------------
    def run(self, n: int, scenario: str, rng: random.Random) -> Result:
        r = Result(n, scenario)
        t0 = time.monotonic()
        try:
            getattr(self, "s_" + scenario.replace("-", "_"))(r, rng)
        except Exception as e:  # a scenario that breaks is a wrong outcome, not a crash
            r.wrong.append(f"{type(e).__name__}: {e}"[:300])
        r.seconds = time.monotonic() - t0
        if r.run_id:
            self.check(r)
        return r

    def s_complete(self, r: Result, rng: random.Random) -> None:
        steps = rng.randint(10, 30)
        r.run_id, r.expected = self.launch(steps), "succeeded"
        end = self.wait_end(r.run_id)
        self.expect(r, end, "succeeded", steps=steps)

    def s_graceful(self, r: Result, rng: random.Random) -> None:
        r.run_id, r.expected = self.launch(100000), "stopped"
        time.sleep(rng.uniform(0, 4))
        t0 = time.monotonic()
        end = self.json("stop", r.run_id, "--wait")
        r.notes.append(f"stop took {time.monotonic() - t0:.1f}s")
        self.expect(r, end, "stopped")
        if end.get("exit_code") not in (0, None):
            r.wrong.append(f"graceful stop exit code {end.get('exit_code')}")
        if "SIGKILL to the whole run" in self.agent_log(r.run_id):
            r.wrong.append("a graceful stop needed SIGKILL")

    def s_hard(self, r: Result, rng: random.Random) -> None:
        r.run_id, r.expected = self.launch(100000), "stopped"
        time.sleep(rng.uniform(0, 4))
        end = self.json("stop", r.run_id, "--hard", "--wait")
        self.expect(r, end, "stopped")

    def s_adopt_complete(self, r: Result, rng: random.Random) -> None:
        steps = rng.randint(30, 60)
        r.run_id, r.expected = self.launch(steps), "succeeded"
        time.sleep(rng.uniform(0.5, 5))
        self.kill_agent(r.run_id, r)
        self.expect_lost(r)
        end = self.wait_end(r.run_id)  # these reads adopt it
        self.expect(r, end, "succeeded", steps=steps)
        self.expect_adopted(r)

    def s_adopt_stop(self, r: Result, rng: random.Random) -> None:
        r.run_id, r.expected = self.launch(100000), "stopped"
        self.wait(lambda: self.state(r.run_id).get("progress", {}).get("step", 0) >= 2, 120)
        time.sleep(rng.uniform(0, 2))
        self.kill_agent(r.run_id, r)
        self.expect_lost(r)
        end = self.json("stop", r.run_id, "--wait")  # `stop` adopts it, then stops it gracefully
        self.expect(r, end, "stopped")
        if end.get("exit_code") != 0:
            r.wrong.append(f"adopted graceful stop exit code {end.get('exit_code')}")
        if not list((self.home / "runs" / r.run_id / "output").glob("checkpoint-*")):
            r.wrong.append("adopted graceful stop left no checkpoint")
        if "SIGKILL to the whole run" in self.agent_log(r.run_id):
            r.wrong.append("the adopted run's graceful stop needed SIGKILL")
        self.expect_adopted(r)

    def s_unwatched(self, r: Result, rng: random.Random) -> None:
        steps = rng.randint(20, 40)
        r.run_id, r.expected = self.launch(steps), "succeeded"
        self.wait(lambda: self.state(r.run_id).get("progress", {}).get("step", 0) >= 1, 120)
        st = self.kill_agent(r.run_id, r)
        self.wait(
            lambda: _gone(
                [
                    self.state(r.run_id).get("torchrun_pid") or 0,
                    *self.state(r.run_id).get("worker_pids", []),
                ]
            ),
            300,
        )
        seen = self.status(r.run_id, no_adopt=True)
        if seen["status"] != "lost":
            r.wrong.append(f"unread after its ranks ended: {seen['status']} (want lost)")
        end = self.wait_end(r.run_id)
        self.expect(r, end, "succeeded", steps=steps)
        self.expect_adopted(r, lost=st["agent_pid"])

    # -- checks -------------------------------------------------------------------------------
    def expect(self, r: Result, got: dict, status: str, steps: int | None = None) -> None:
        r.status = got.get("status", "")
        r.steps = got.get("step", 0)
        if r.status != status:
            r.wrong.append(f"status {r.status!r} ({got.get('message')}), want {status!r}")
        if steps is not None and r.steps != steps:
            r.wrong.append(f"step {r.steps}, want {steps}")

    def expect_lost(self, r: Result) -> None:
        st = self.state(r.run_id)
        live = procs.live_processes(st)
        seen = self.status(r.run_id, no_adopt=True)
        if live and seen["status"] != "lost":
            r.wrong.append(
                f"after the agent's death with {len(live)} processes: {seen['status']} (want lost)"
            )
        if not live and seen["status"] not in ("lost",) + TERMINAL:
            r.wrong.append(f"after the agent's death: {seen['status']}")

    def expect_adopted(self, r: Result, lost: int | None = None) -> None:
        st = self.state(r.run_id)
        if not st.get("adopted"):
            r.wrong.append("no adoption recorded")

    def agent_log(self, run_id: str) -> str:
        try:
            return (self.home / "runs" / run_id / "logs" / "agent.log").read_text(errors="replace")
        except OSError:
            return ""

    def check(self, r: Result) -> None:
        """Processes left and records lost, once the run is over."""
        run_dir = self.home / "runs" / r.run_id
        self.wait(lambda: self.state(r.run_id).get("status") in TERMINAL, 60)
        st = self.state(r.run_id)
        time.sleep(0.2)
        left = [p.pid for p in procs.marked_processes(r.run_id)]
        if st.get("agent_pid") and procs.is_ours(st, st["agent_pid"]):
            self.wait(lambda: not procs.is_ours(self.state(r.run_id), st["agent_pid"]), 10)
            if procs.is_ours(self.state(r.run_id), st["agent_pid"]):
                left.append(st["agent_pid"])
        r.left = left
        # every step in the event files is in run.db, and metrics run 1..N without a gap
        lost = 0
        try:
            db = sqlite3.connect(f"file:{run_dir / 'run.db'}?mode=ro", uri=True)
            try:
                for f in sorted((run_dir / "events").glob("rank*.jsonl")):
                    rank = int(f.stem[4:])
                    in_file = {json.loads(x)["step"] for x in f.open() if '"kind": "step"' in x}
                    stored = {
                        s for (s,) in db.execute("SELECT step FROM steps WHERE rank = ?", (rank,))
                    }
                    lost += len(in_file - stored)
            finally:
                db.close()
        except (OSError, sqlite3.Error, ValueError) as e:
            if (run_dir / "events" / "rank0.jsonl").exists():
                r.notes.append(f"run.db unreadable: {e}")
                lost += 1
        recs = self.json("metrics", r.run_id)
        steps = [x["step"] for x in recs]
        if steps != list(range(1, len(steps) + 1)):
            lost += 1
            r.notes.append("metrics have a gap")
        r.lost = lost

    def cleanup(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            if self.state(run_id).get("status") not in TERMINAL:
                self.cli("stop", run_id, "--hard", "--wait")


def _gone(pids) -> bool:
    for pid in pids:
        if not pid:
            continue
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            continue
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (each has 2 ranks)")
    ap.add_argument("--home", type=Path, help="TUNEDECK_HOME (default: a new temp folder)")
    args = ap.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="tunedeck-soak-"))
    soak = Soak(home)
    rng = random.Random(args.seed)
    plan = [(i, rng.choice(SCENARIOS), random.Random(rng.random())) for i in range(args.runs)]
    print(
        f"soak: {args.runs} runs, seed {args.seed}, {args.jobs} at a time, home {home}", flush=True
    )
    results: list[Result] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(item):
        n, scenario, r_rng = item
        res = soak.run(n, scenario, r_rng)
        with lock:
            results.append(res)
            mark = "ok" if not (res.wrong or res.lost or res.left) else "WRONG"
            print(
                f"{n:3d} {scenario:15s} {res.run_id:28s} {res.status:9s} step {res.steps:<5d}"
                f" {res.seconds:5.1f}s {mark} {'; '.join(res.wrong + res.notes)}"[:300],
                flush=True,
            )
        return res

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, plan))
    soak.cleanup([r.run_id for r in results if r.run_id])
    wall = time.monotonic() - t0
    left = sum(len(r.left) for r in results)
    lost = sum(r.lost for r in results)
    wrong = sum(1 for r in results if r.wrong)
    by = {s: sum(1 for r in results if r.scenario == s) for s in SCENARIOS}
    print("\nscenarios: " + ", ".join(f"{s} {k}" for s, k in by.items()))
    print(f"runs {len(results)} in {wall:.0f}s")
    print(f"processes left: {left}")
    print(f"records lost:   {lost}")
    print(f"wrong statuses: {wrong}")
    for r in results:
        if r.wrong or r.lost or r.left:
            print(
                f"  run {r.n} {r.scenario} {r.run_id}: wrong={r.wrong} lost={r.lost} "
                f"left={r.left} {r.notes}"
            )
    return 0 if not (left or lost or wrong) else 1


if __name__ == "__main__":
    sys.exit(main())
