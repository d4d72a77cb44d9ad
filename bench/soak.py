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
  foreign         another user (nobody, through setpriv; root only) → listed `foreign`, nothing
                  plants a run whose agent is "dead" and whose plan     run, nothing signalled
                  runs a command; `ls`, `status`, `stop`, `stacks`
  bad-values      a long run; lines with Infinity, strings, lists   → readable all along,
                  and huge numbers appended to rank 0's events          stopped, exit 0
  escaping        a script run whose ranks start a setsid child     → stopped (graceful), no
                  with a cleaned environment and a child without        child left
                  the run's marker; graceful stop
  fifo-data       data.path a FIFO (launch --no-preflight) and       → failed naming the FIFO;
                  /dev/zero (through preflight)                          refused naming the device
  double-resume   a long run with checkpoints, stopped; two         → exactly one launches,
                  `resume` of it at the same moment                     the other names it

Counted at the end (all must be 0):
  processes left   any process still carrying a run's TUNEDECK_RUN_ID, or its agent
  records lost     steps in a rank's event file missing from run.db, or `tunedeck metrics`
                   not 1..N without a gap
  wrong statuses   a status other than the scenario's (also: "lost" expected right after an
                   agent's death while its ranks live, "failed" once they are gone unread)
  foreign actions  a planted run's command ran, or a pid it names was signalled

    python bench/soak.py [--runs 50] [--seed 12] [--jobs 2] [--home DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
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

from tunedeck.core.supervisor import procs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "presets" / "demo.toml"
SCENARIOS = (
    "complete",
    "graceful",
    "hard",
    "adopt-complete",
    "adopt-stop",
    "unwatched",
    "foreign",
    "bad-values",
    "escaping",
    "fifo-data",
    "double-resume",
)
DATA = REPO / "presets" / "data" / "demo_chat.jsonl"
BAD_LINES = [
    '{"kind": "step", "rank": 0, "step": 900000, "loss": Infinity, "lr": NaN, "t": 1.0}',
    '{"kind": "step", "rank": 0, "step": 900001, "loss": "high", "lr": [1], "t": "now"}',
    '{"kind": "step", "rank": 0, "step": "900002", "loss": 1.0, "t": 1e300}',
    '{"kind": "step", "rank": 0, "step": 99999999999999999999999, "loss": {}}',
]
ESCAPER = """
import os, signal, subprocess, sys, time
tag = sys.argv[1]
clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
subprocess.Popen(["setsid", "sleep", tag], env=clean, stdin=subprocess.DEVNULL)
subprocess.Popen(["sleep", tag + "1"], env=clean, stdin=subprocess.DEVNULL)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
step = 0
while True:
    step += 1
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    time.sleep(0.5)
"""
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
    foreign: int = 0
    injected_from: int | None = None  # steps from here on were written by the soak itself
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

    def launch(self, steps: int, *more: str) -> str:
        out = self.json(
            "launch",
            str(DEMO),
            "--set",
            f"train.max_steps={steps}",
            "--set",
            "train.save_steps=0",
            "--no-preflight",
            *more,
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

    def s_foreign(self, r: Result, rng: random.Random) -> None:
        r.expected = "foreign"
        if os.geteuid() != 0 or not shutil.which("setpriv"):
            r.notes.append("skipped: planting as another user needs root and setpriv")
            r.status = "foreign"
            return
        rid = f"20990101-000000-planted-{r.n:04d}"
        run_dir = self.home / "runs" / rid
        mark = Path(tempfile.gettempdir()) / f"tunedeck-soak-planted-{os.getpid()}-{r.n}"
        mark.unlink(missing_ok=True)
        victim = subprocess.Popen(["sleep", "300"])  # a pid the planted state names
        try:
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            ticks = procs.start_ticks(victim.pid)
            state = {
                "run_id": rid,
                "name": f"planted-{r.n}",
                "status": "running",
                "message": "",
                "created": time.time(),
                "agent_pid": 999999,
                "torchrun_pid": victim.pid,
                "worker_pids": [victim.pid],
                "pgids": [victim.pid],
                "rank_pids": {"0": victim.pid},
                "launches": [
                    {
                        "id": "x",
                        "attempt": 0,
                        "boot": boot,
                        "after": 0,
                        "t": time.time(),
                        "torchrun_pid": victim.pid,
                    }
                ],
                "pid_identity": {
                    "999999": {"start": 1, "boot": boot},
                    str(victim.pid): {"start": ticks, "boot": boot},
                },
                "host": os.uname().nodename,
                "progress": {"step": 5, "max_steps": 9},
            }
            plan = {
                "nproc_per_node": 1,
                "nodes": [{"argv": ["/bin/sh", "-c", f"id > {mark}"], "env": {}, "cwd": "/tmp"}],
            }
            code = (
                "import json, os, sys; d = sys.argv[1]; os.makedirs(d); "
                "[open(os.path.join(d, n), 'w').write(sys.argv[i]) for i, n in "
                "((2, 'state.json'), (3, 'plan.json'), (4, 'spec.toml'))]"
            )
            (self.home / "runs").mkdir(parents=True, exist_ok=True)
            os.chmod(self.home, 0o755)
            os.chmod(self.home / "runs", 0o1777)  # a team's shared folder
            # a system python: the planter cannot reach this one (it may live in /root)
            python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
            subprocess.run(
                [
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    python,
                    "-I",
                    "-c",
                    code,
                    str(run_dir),
                    json.dumps(state),
                    json.dumps(plan),
                    DEMO.read_text(),
                ],
                check=True,
                timeout=30,
            )
            r.run_id = ""  # not ours: never `check`ed as one of our runs
            seen = self.status(rid)
            r.status = seen.get("status", "")
            self.cli("ls", no_adopt=True)  # other scenarios' runs are not this one's to adopt
            self.cli("stop", rid)
            self.cli("stop", rid, "--hard")
            self.cli("stacks", rid)
            time.sleep(3)
            if r.status != "foreign":
                r.wrong.append(f"planted run read as {r.status!r} ({seen.get('message')})")
            if mark.exists():
                r.foreign += 1
                r.wrong.append("the planted command ran")
            if victim.poll() is not None:
                r.foreign += 1
                r.wrong.append(f"a pid the planted state named was signalled ({victim.poll()})")
        finally:
            victim.kill()
            victim.wait()
            mark.unlink(missing_ok=True)
            shutil.rmtree(run_dir, ignore_errors=True)

    def s_bad_values(self, r: Result, rng: random.Random) -> None:
        r.run_id, r.expected = self.launch(100000), "stopped"
        r.injected_from = 900000
        self.wait(lambda: self.state(r.run_id).get("progress", {}).get("step", 0) >= 1, 120)
        events = self.home / "runs" / r.run_id / "events" / "rank0.jsonl"
        with open(events, "a") as f:
            f.write("\n".join(rng.sample(BAD_LINES, k=len(BAD_LINES))) + "\n")
        for _ in range(6):
            time.sleep(0.5)
            raw = (self.home / "runs" / r.run_id / "state.json").read_text()
            if "Infinity" in raw or "NaN" in raw:
                r.wrong.append("state.json holds a non-finite number")
                break
            seen = self.status(r.run_id)
            if seen["status"] != "running":
                r.wrong.append(f"after bad lines: {seen['status']} ({seen.get('message')})")
                break
        end = self.json("stop", r.run_id, "--wait")
        self.expect(r, end, "stopped")

    def s_escaping(self, r: Result, rng: random.Random) -> None:
        tag = str(700 + r.n)
        script = self.home / f"escaper-{r.n}.py"
        script.write_text(ESCAPER)
        spec = self.home / f"escaper-{r.n}.toml"
        spec.write_text(
            f'name = "escaper"\nbackend = "script"\n[script]\npath = "{script}"\n'
            f'args = ["{tag}"]\n[data]\npath = "{DATA}"\n[cluster]\n'
            f'device = "cpu"\ncpu_procs = 2\n[run]\nstop_grace_s = 20\n'
        )
        r.run_id, r.expected = self.json("launch", str(spec), "--no-preflight")["run_id"], "stopped"
        self.wait(lambda: len(_sleepers(tag)) >= 2, 120)
        time.sleep(rng.uniform(0, 2))
        end = self.json("stop", r.run_id, "--wait")
        self.expect(r, end, "stopped")
        if not str(end.get("message", "")).startswith("stopped (graceful)"):
            r.wrong.append(f"graceful stop said {end.get('message')!r}")
        left = _sleepers(tag) + _sleepers(tag + "1")
        if left:
            r.left += [p.pid for p in left]
            for p in left:
                p.kill()

    def s_fifo_data(self, r: Result, rng: random.Random) -> None:
        fifo = self.home / f"data-{r.n}.fifo"
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
        r.run_id, r.expected = self.launch(10, "--set", f'data.path="{fifo}"'), "failed"
        end = self.wait_end(r.run_id, timeout=60)
        self.expect(r, end, "failed")
        if str(fifo) not in json.dumps(self.json("diagnose", r.run_id)):
            r.wrong.append("the failure does not name the FIFO")
        t0 = time.monotonic()
        p = self.cli("launch", str(DEMO), "--set", 'data.path="/dev/zero"', timeout=60)
        if p.returncode == 0:
            r.wrong.append("a launch on /dev/zero passed preflight")
        elif "/dev/zero" not in p.stdout + p.stderr:
            r.wrong.append("the refusal of /dev/zero does not name it")
        r.notes.append(f"/dev/zero refused in {time.monotonic() - t0:.1f}s")

    def s_double_resume(self, r: Result, rng: random.Random) -> None:
        first = self.launch(
            100000, "--set", "train.save_steps=2", "--set", "train.save_total_limit=2"
        )
        self.wait(lambda: list((self.home / "runs" / first / "output").glob("checkpoint-*")), 180)
        self.json("stop", first, "--wait")
        self.check(Result(r.n, r.scenario, run_id=first))
        env = dict(self.env)
        argv = [sys.executable, "-m", "tunedeck.tui", "resume", first, "--json"]
        both = [
            subprocess.Popen(
                argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=300) for p in both]
        ok = [
            json.loads(o.splitlines()[0])["run_id"]
            for (o, _), p in zip(outs, both)
            if p.returncode == 0 and o.strip()
        ]
        r.expected = "stopped"
        if len(ok) != 1:
            r.wrong.append(f"{len(ok)} of two simultaneous resumes launched")
        refused = [e for (_, e), p in zip(outs, both) if p.returncode != 0]
        if refused and ok and ok[0] not in refused[0]:
            r.wrong.append(f"the refused resume does not name the live run: {refused[0][-300:]}")
        for rid in ok[1:]:
            self.cli("stop", rid, "--hard", "--wait")
        if ok:
            r.run_id = ok[0]
            end = self.json("stop", r.run_id, "--wait")
            self.expect(r, end, "stopped")

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
                    in_file = {
                        e["step"]
                        for x in f.open()
                        if '"kind": "step"' in x
                        and isinstance(e := json.loads(x), dict)
                        and type(e.get("step")) is int
                        and e["step"] < (r.injected_from or 2**63)
                    }
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
        steps = [x["step"] for x in recs if x["step"] < (r.injected_from or 2**63)]
        if steps != list(range(1, len(steps) + 1)):
            lost += 1
            r.notes.append("metrics have a gap")
        r.lost = lost

    def cleanup(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            if self.state(run_id).get("status") not in TERMINAL:
                self.cli("stop", run_id, "--hard", "--wait")


def _sleepers(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if (p.info["cmdline"] or [])[-2:] == ["sleep", tag]:
            found.append(p)
    return found


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
    ap.add_argument(
        "--only",
        default="",
        help=f"comma-separated scenarios to draw from (default: all of {', '.join(SCENARIOS)})",
    )
    args = ap.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="tunedeck-soak-"))
    soak = Soak(home)
    rng = random.Random(args.seed)
    drawn = [x for x in args.only.split(",") if x] or list(SCENARIOS)
    unknown = set(drawn) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    plan = [(i, rng.choice(drawn), random.Random(rng.random())) for i in range(args.runs)]
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
            mark = "ok" if not (res.wrong or res.lost or res.left or res.foreign) else "WRONG"
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
    foreign = sum(r.foreign for r in results)
    by = {s: sum(1 for r in results if r.scenario == s) for s in drawn}
    print("\nscenarios: " + ", ".join(f"{s} {k}" for s, k in by.items()))
    print(f"runs {len(results)} in {wall:.0f}s")
    print(f"processes left: {left}")
    print(f"records lost:   {lost}")
    print(f"wrong statuses: {wrong}")
    print(f"foreign actions: {foreign}")
    for r in results:
        if r.wrong or r.lost or r.left or r.foreign:
            print(
                f"  run {r.n} {r.scenario} {r.run_id}: wrong={r.wrong} lost={r.lost} "
                f"left={r.left} {r.notes}"
            )
    return 0 if not (left or lost or wrong or foreign) else 1


if __name__ == "__main__":
    sys.exit(main())
