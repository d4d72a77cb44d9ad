"""`tunedeck stacks`: the Python stack of every rank of a live run, under real torchrun."""

from __future__ import annotations

import json
import os
import re
import signal

import psutil
import pytest

from tunedeck.core.rundir import RunDir
from tunedeck.core.views.registry import find_run
from tunedeck.core.supervisor.stacks import dump_stacks
from tunedeck.core.store.store import read_findings
from tests.conftest import DEMO, cli, wait_for

pytestmark = pytest.mark.slow


def _step(run_dir, rank: int) -> int:
    p = run_dir / "events" / f"rank{rank}.jsonl"
    if not p.exists():
        return 0
    steps = [json.loads(x)["step"] for x in p.open() if '"kind": "step"' in x]
    return max(steps, default=0)


def test_stacks_show_the_hung_rank_outside_the_collective(td_home, monkeypatch):
    # rank 1 stops after step 3; rank 0 then waits for it in DDP's gradient all-reduce
    monkeypatch.setenv("TUNEDECK_TEST_HANG_RANK", "1:3")
    monkeypatch.setenv("TUNEDECK_STALL_FLOOR_S", "5")  # the default floor is 60 s
    out = cli(
        "launch",
        str(DEMO),
        "--json",
        "--set",
        "train.max_steps=1000",
        "--set",
        "train.save_steps=0",
        home=td_home,
    )
    run_id = json.loads(out.stdout)["run_id"]
    run_dir = td_home / "runs" / run_id
    try:
        wait_for(lambda: _step(run_dir, 0) >= 3, 180, "three steps")
        wait_for(
            lambda: (
                len(json.loads((run_dir / "state.json").read_text()).get("worker_pids") or []) == 2
            ),
            30,
            "both rank pids",
        )

        def settled():  # rank 1 enters its hang, rank 0 its all-reduce, each after its step
            res = cli("stacks", run_id, "--json", home=td_home)
            dumps = {d["rank"]: d for d in json.loads(res.stdout)}
            ranks = set(dumps) == {0, 1}
            return (
                ranks and "_test_hang" in dumps[1]["text"] and dumps[0]["in_collective"] and dumps
            )

        dumps = wait_for(settled, 60, "rank 1 in its hang and rank 0 in the collective", poll=1)
        hung, waiting = dumps[1], dumps[0]
        assert hung["method"] in ("faulthandler", "py-spy")
        assert "_test_hang" in hung["text"] and not hung["in_collective"], hung["text"]
        assert waiting["in_collective"], waiting["text"]
        if hung["method"] == "faulthandler":
            # the dumps have a file of their own; the rank logs (and so the log view and
            # the diagnosis) never see them
            dumped = (run_dir / "stacks" / "rank1.txt").read_text()
            assert "_test_hang" in dumped and "most recent call first" in dumped
            for src in RunDir(run_dir).rank_logs():
                if src.path.name == "stderr.log":
                    assert "most recent call first" not in src.path.read_text(), src.path
        text = cli("stacks", run_id, home=td_home).stdout
        [line1] = [ln for ln in text.splitlines() if ln.startswith("=== rank 1 ")]
        assert "NOT in a collective: the others wait for it" in line1, text
        # the agent flags the stall by itself (no GPU here to tell which rank idles)
        stall = wait_for(
            lambda: next((f for f in read_findings(run_dir) if f["category"] == "stall"), None),
            60,
            "a stall",
        )
        assert stall["severity"] == "error" and "step 3" in stall["summary"]
        # the stall starts the forensics: every rank's Flight Recorder dump and stack, read
        # side by side, name rank 1 and the all-reduce it never entered, long before the
        # collective timeout (30 min by default) would have
        held = wait_for(
            lambda: next(
                (
                    f
                    for f in read_findings(run_dir)
                    if f["category"] == "rank_missing_from_collective"
                ),
                None,
            ),
            60,
            "the rank missing from a collective",
        )
        last_step = max(
            json.loads(x)["t"]
            for x in (run_dir / "events" / "rank0.jsonl").open()
            if '"kind": "step"' in x
        )
        assert held["rank"] == 1 and held["t"] - last_step < 30, held
        assert re.search(r"rank 1 never entered all_reduce #\d+", held["summary"]), held
        missing = next(e for e in held["evidence"] if e.startswith("rank 1:"))
        assert "last completed" in missing and "_test_hang" in missing, held["evidence"]
        # `tunedeck diagnose` shows it with the rest (the monitor's findings pane reads the same)
        diag = json.loads(cli("diagnose", run_id, "--json", home=td_home).stdout)
        assert ("rank_missing_from_collective", 1) in {(f["category"], f["rank"]) for f in diag}
        [kept] = (run_dir / "stacks").glob("hang-*.json")
        ranks = {d["rank"]: d for d in json.loads(kept.read_text())}
        assert set(ranks) == {0, 1} and "_test_hang" in ranks[1]["text"]
        assert {p.name for p in (run_dir / "flight").glob("rank?")} == {"rank0", "rank1"}
        # the data stage was a phase of its own before step 1, with its rate
        phases = [
            json.loads(x) for x in (run_dir / "events" / "rank0.jsonl").open() if '"phase"' in x
        ]
        tok = [e for e in phases if e.get("phase") == "tokenizing"]
        assert tok and tok[-1]["done"] == tok[-1]["total"] > 0 and tok[-1]["rate"] > 0
        # a halted rank (SIGSTOP, ^Z, a debugger) cannot answer: said at once, not after the
        # wait; the run's end below shows nobody crashed
        if hung["method"] == "faulthandler":
            os.kill(waiting["pid"], signal.SIGSTOP)
            try:
                wait_for(lambda: psutil.Process(waiting["pid"]).status() == "stopped", 10, "T")
                [halted] = dump_stacks(run_dir, ranks=[0])
                assert "is stopped" in halted.text and "cannot answer" in halted.text, halted
            finally:
                os.kill(waiting["pid"], signal.SIGCONT)
        # one rank only, through the core API; a rank that does not exist is named
        assert [d.rank for d in dump_stacks(run_dir, ranks=[1])] == [1]
        with pytest.raises(ValueError, match=r"rank\(s\) \[7\]"):
            dump_stacks(run_dir, ranks=[7])
    finally:
        cli("stop", run_id, "--hard", "--wait", home=td_home, check=False)
    # the signal did not kill anybody: the run ends by the stop, not by a crash
    assert find_run(run_id, td_home / "runs").status == "stopped"
    bad = cli("stacks", run_id, home=td_home, check=False)
    assert bad.returncode == 1 and "no rank process is running" in bad.stderr


OLD_RANK = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, file=open(sys.argv[1], "a"), all_threads=True)
print("ready", flush=True)
time.sleep(120)
"""


def test_a_rank_of_an_older_tunedeck_is_named_and_not_signalled(tmp_path, monkeypatch):
    """A week-long run started before an upgrade: its ranks dump their stacks on SIGUSR1 only
    (they made stacks/rank<r>.txt, never a request file). `stacks` sends no signal: it says
    why there is no dump and what to do."""
    import subprocess
    import sys

    from tests.test_manage import make_run

    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no py-spy: the trainer's own way is asked
    run_dir = make_run(tmp_path / "runs", "20261210-020000-demo-2b2b", status="running")
    run = RunDir(run_dir)
    run.stack_file(0).parent.mkdir(parents=True, exist_ok=True)
    old = subprocess.Popen(
        [sys.executable, "-c", OLD_RANK, str(run.stack_file(0))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert old.stdout.readline().strip() == "ready"
        st = run.read_state()
        st["rank_pids"] = {"0": old.pid}
        run.write_state(st)
        [d] = dump_stacks(run_dir)
        assert d.method == "faulthandler" and d.rank == 0
        assert "older tunedeck" in d.text and f"kill -USR1 {old.pid}" in d.text, d.text
        assert "pip install py-spy" in d.text
        # nobody was signalled: the rank still runs and dumped nothing
        assert old.poll() is None and run.stack_file(0).read_text() == ""
    finally:
        old.kill()
        old.wait()
