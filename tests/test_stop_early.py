"""A stop at any moment: a graceful stop asked for before the ranks exist is not lost. The
agent keeps sending SIGTERM to ranks that appear after the request, the built-in trainer reads
the request before its first step, so the run ends cleanly (exit 0, every rank's `end` says
stopped) well within the grace period, without the SIGKILL that ends the grace; and the stop
API can return at once."""

from __future__ import annotations

import json
import time

import pytest

from tunedeck.core.supervisor import procs
from tests.conftest import DEMO, cli, cli_json, stop_run, wait_for

pytestmark = pytest.mark.slow

# a lost stop would train on until the grace runs out; a kept one ends once the ranks have
# started (torch imported, ~16 s beside another worker on 2 cores) and read it
GRACE_S = 60


@pytest.mark.parametrize("delay_s", [0.1, 1.0, 2.5])
def test_graceful_stop_right_after_launch_ends_cleanly(td_home, delay_s):
    out = cli_json(
        "launch",
        str(DEMO),
        "--set",
        "train.max_steps=100000",
        "--set",
        f"run.stop_grace_s={GRACE_S}",
        home=td_home,
    )
    run_id = out["run_id"]
    time.sleep(delay_s)
    t0 = time.monotonic()
    done = stop_run(td_home, run_id)
    took = time.monotonic() - t0
    assert done["status"] == "stopped", done
    assert took < GRACE_S, f"the stop took {took:.1f}s: the grace period ran out"
    run_dir = td_home / "runs" / run_id
    log = (run_dir / "logs" / "agent.log").read_text()
    assert "SIGKILL to the whole run" not in log, log[-2000:]
    st = json.loads((run_dir / "state.json").read_text())
    ends = []
    for f in sorted((run_dir / "events").glob("rank*.jsonl")):
        evs = [json.loads(x) for x in f.open()]
        ends += [e for e in evs if e["kind"] == "end"]
    if st["message"].startswith("stopped before start"):  # torchrun never started
        assert not ends
    else:
        assert st["attempts"][-1]["exit_code"] == 0 and st["exit_code"] == 143, st
        assert len(ends) == 2 and all(e["reason"] == "stopped" for e in ends), ends
    assert not procs.marked_processes(run_id)


def test_cli_stop_returns_at_once_and_the_agent_finishes_it(td_home):
    run_id = cli_json(
        "launch",
        str(DEMO),
        "--set",
        "train.max_steps=100000",
        "--set",
        f"run.stop_grace_s={GRACE_S}",
        home=td_home,
    )["run_id"]
    wait_for(lambda: cli_json("status", run_id, home=td_home)["step"] >= 1, 120, "a step")
    t0 = time.monotonic()
    out = cli("stop", run_id, home=td_home)
    assert time.monotonic() - t0 < 5.0, "stop without --wait must not wait for the end"
    assert "stop requested" in out.stdout and (td_home / "runs" / run_id / "stop.json").exists()
    done = wait_for(
        lambda: (s := cli_json("status", run_id, home=td_home))["status"] == "stopped" and s,
        60,
        "the agent to finish the stop",
    )
    assert done["exit_code"] == 143, done  # stopped: never 0
    assert not procs.marked_processes(run_id)


@pytest.mark.parametrize("grace", ["nan", "inf", "-1", "soon"])
def test_stop_refuses_a_grace_that_never_escalates(td_home, grace):
    out = cli("stop", "any-run", "--grace", grace, home=td_home, check=False)
    assert out.returncode == 2 and "--grace" in out.stderr and "Traceback" not in out.stderr
