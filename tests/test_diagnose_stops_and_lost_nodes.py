"""What `tunedeck diagnose` puts first when the records say more than the logs (issue 31):

- a stop the user asked for, sent the way Slurm sends it (`tunedeck stop` on a Slurm run is
  stop.json and `scancel --signal=TERM`: every process of the job's step gets SIGTERM, and
  torchrun logs a death signal like a time limit's) is named as that stop, never as a
  launcher signal (a time limit or a preemption);
- a node lost as a whole is the root cause, and the other nodes' rank failures that follow
  are its consequences (the two-host test, tests/test_multinode.py, shows it on a real
  loss; here a run folder with the head's real rank failure and the finding its link
  stored).
"""

from __future__ import annotations

import json
import signal
import time

import psutil

from tests.conftest import DEMO, cli, cli_json, wait_for


def _roots(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["root_cause"]]


def test_a_stop_asked_under_slurm_is_named_as_the_stop_not_a_launcher_signal(td_home):
    run_id = cli_json("launch", str(DEMO), "--set", "train.max_steps=100000", home=td_home)[
        "run_id"
    ]
    run_dir = td_home / "runs" / run_id
    state = run_dir / "state.json"

    def training():
        st = json.loads(state.read_text())
        return st if (st.get("progress") or {}).get("step") and st.get("torchrun_pid") else None

    st = wait_for(training, 180, "torchrun and a first step")
    # what `tunedeck stop` does to a Slurm run (control._stop_slurm): stop.json, then
    # scancel --signal=TERM, which Slurm delivers to every process of the step at once
    (run_dir / "stop.json").write_text(
        json.dumps({"mode": "graceful", "t": time.time(), "by": "scancel"})
    )
    step = [psutil.Process(st["agent_pid"])]
    step += step[0].children(recursive=True)
    for p in step:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    end = wait_for(
        lambda: (
            (s := cli_json("status", run_id, home=td_home))["status"]
            in ("failed", "stopped", "succeeded")
            and s
        ),
        120,
        "the run's end",
    )
    assert end["status"] == "stopped", end
    torchrun_log = "".join(p.read_text() for p in (run_dir / "logs").glob("torchrun-node*.log"))
    print("torchrun saw:", [ln for ln in torchrun_log.splitlines() if "signal" in ln.lower()])

    fs = cli_json("diagnose", run_id, home=td_home)
    assert not [f for f in fs if f["category"] == "launcher_signal"], fs
    roots = _roots(fs)
    assert [f["category"] for f in roots] == ["stop_requested"], fs
    stop = roots[0]
    assert stop["severity"] == "info" and "stopped on request" in stop["summary"], stop
    assert "scancel" in stop["summary"] and "time limit" not in stop["summary"], stop
    assert not [f for f in fs if f["severity"] == "error" and f["root_cause"]], fs
    text = cli("diagnose", run_id, home=td_home).stdout
    assert "launcher_signal" not in text and "preemption" not in text.split("\n", 3)[0], text


GLOO_PEER_GONE = [
    "Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.11/site-packages/tunedeck/core/train/trainer.py", line 611,'
    " in _step",
    "    dist.all_reduce(flat)",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",'
    " line 2806, in all_reduce",
    "    work.wait()",
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Connection closed by peer [10.214.0.2]:36617",
]


def _lost_run(tmp_path, severity: str, node1_stderr: list[str] | None = None):
    """A head's run folder after node 1 was lost: the head's rank 0 failed in its collective
    (the shape the two-host test's head logs), and the finding node 1's link stored."""
    from tests.test_diagnose_kills_and_full_disks import build_run
    from tunedeck.core.diagnose.finding import Finding
    from tunedeck.core.rundir import RunDir
    from tunedeck.core.store.store import Store

    run = build_run(
        tmp_path / "runs",
        GLOO_PEER_GONE,
        table=False,
        state={"message": "node 1 (node1) was lost mid-run: the agent of node 1 is gone"},
    )
    lost_at = time.time() - 2
    if node1_stderr:
        d = run / "logs" / "node1" / "x_ab12cd34" / "attempt_0" / "2"
        d.mkdir(parents=True)
        (d / "stderr.log").write_text("".join(f"[rank2]: {ln}\n" for ln in node1_stderr))
    store = Store(RunDir(run), write=True)
    store.save_finding(
        Finding(
            category="node_lost",
            severity=severity,
            summary="node 1 (node1) was lost mid-run: the agent of node 1 (pid 4711) is gone",
            cause="Node 1 stopped taking part in the run.",
            fix="Look at node 1's logs.",
            node=1,
            host="node1",
            t=lost_at,
            evidence=["the agent of node 1 (pid 4711) is gone"],
            source="nodes/node1/link.json",
        )
    )
    store.close()
    return run


def test_a_lost_node_is_the_root_cause_of_the_other_nodes_rank_failures(tmp_path):
    for severity in ("warning", "error"):  # a warning while a restart was left
        run = _lost_run(tmp_path / severity, severity)
        fs = cli_json("diagnose", str(run), home=tmp_path / "home")
        roots = _roots(fs)
        assert [(f["category"], f["severity"], f["node"]) for f in roots] == [
            ("node_lost", "error", 1)
        ], fs
        assert fs[0]["category"] == "node_lost"
        crash = [f for f in fs if f["category"] == "rank_crashed"]
        assert crash and not any(f["root_cause"] for f in crash), crash


def test_a_lost_nodes_own_error_before_the_loss_stays_the_root_cause(tmp_path):
    own = ["Traceback (most recent call last):", "ValueError: sample 812 has no 'messages'"]
    run = _lost_run(tmp_path, "error", node1_stderr=own)
    fs = cli_json("diagnose", str(run), home=tmp_path / "home")
    roots = _roots(fs)
    assert len(roots) == 1 and roots[0]["node"] == 1 and roots[0]["category"] != "node_lost", fs
    assert "sample 812" in roots[0]["summary"], roots


def test_a_failure_before_the_asked_stop_keeps_the_root_cause():
    """A stop asked after the run had hung or been preempted: the earlier failure stays the
    root cause; only what the stop sent is folded into the stop's finding."""
    from tunedeck.core.diagnose.chain import causes_first
    from tunedeck.core.diagnose.finding import Finding

    def f(cat, sev, t, rank=None):
        return Finding(cat, sev, f"{cat} at {t}", "c", "x", rank=rank, t=t, evidence=[cat])

    stop = f("stop_requested", "info", 100.0)
    hang = f("nccl_timeout", "error", 40.0, rank=1)
    late = f("launcher_signal", "error", 101.0)  # the stop's own SIGTERM
    # as the chain left them: the launcher's signal (tier 0) chosen over the hang
    hang.root_cause = False
    out = causes_first([late, hang, f("worker_sigterm", "warning", 101.5, 0), stop])
    assert [x.category for x in out if x.root_cause] == ["nccl_timeout"], out
    assert late not in out and "launcher_signal" in stop.evidence
    assert not stop.root_cause
    # a launcher signal before the stop (an attempt preempted earlier) is no part of it
    stop = f("stop_requested", "info", 100.0)
    early = f("launcher_signal", "error", 20.0)
    out = causes_first([early, f("launcher_signal", "error", 101.0), stop])
    assert [x.category for x in out if x.root_cause] == ["launcher_signal"], out
    assert out[0] is early and not stop.root_cause
    # nothing before it: the stop is the root cause, what it sent its consequences
    stop = f("stop_requested", "info", 100.0)
    kill = f("worker_sigkill", "error", 130.0, 0)
    kill.root_cause = False
    out = causes_first([kill, f("launcher_signal", "error", 101.0), stop])
    assert [x.category for x in out if x.root_cause] == ["stop_requested"], out


def test_a_failure_long_after_a_loss_the_run_recovered_from_keeps_the_root_cause():
    from tunedeck.core.diagnose.chain import causes_first
    from tunedeck.core.diagnose.finding import Finding

    lost = Finding("node_lost", "warning", "node 1 lost", "c", "x", node=1, t=100.0)
    crash = Finding("rank_crashed", "error", "rank 0 exited with code 1", "c", "x", 0, 0, t=99.5)
    crash.root_cause = False
    oom = Finding("oom_gpu", "error", "GPU out of memory", "c", "x", 1, 1, t=900.0)
    out = causes_first([crash, oom, lost])
    assert [f.category for f in out if f.root_cause] == ["oom_gpu"], out
