"""What the agent's diagnosis monitor stores while a run goes: nothing it would have to take
back once the logs are read to their end."""

from __future__ import annotations

from tunedeck.core.monitoring import MonitorContext
from tunedeck.core.rundir import RunDir
from tunedeck.core.spec import load_spec
from tunedeck.core.store.store import Store
from tunedeck.core.supervisor.monitors import DiagnosisMonitor

# A 2-rank demo whose rank 1 raised after step 3 (TUNEDECK_TEST_CRASH_AT_STEP): rank 0 died of
# the closed connection first, then torchrun stopped and reported the run (its own output)
TORCHRUN = """\
E1208 01:13:29.894000 27755 torch/distributed/elastic/multiprocessing/api.py:1002] failed \
(exitcode: 1) local_rank: 0 (pid: 27757) of binary: /venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, \
in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
tunedeck.core.train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-08_01:13:29
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 27758)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-08_01:13:29
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 27757)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
RANK = {
    0: """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/repo/core/train/trainer.py", line 813, in run
[rank0]:     loss.backward()
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error \
[127.0.0.1]:10120: Connection reset by peer
""",
    1: """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/repo/core/train/faults.py", line 83, in crash
[rank1]:     raise RuntimeError(f"{CRASH_ENV}={crash_at}: injected failure after step {done}")
[rank1]: RuntimeError: TUNEDECK_TEST_CRASH_AT_STEP=3: injected failure after step 3
""",
}


def test_a_crash_is_stored_from_the_ranks_tracebacks_not_from_their_exit_codes(tmp_path):
    """Polled while torchrun still runs, each rank's traceback ends its log, so the scanner
    cannot close it yet, and the launcher's report alone said "ranks 0, 1 all exited with an
    error code and no traceback is in this log": stored then, that outlived the end's read
    and became the failed run's alert."""
    from tests.test_manage import make_run

    run = RunDir(make_run(tmp_path, "20261208-011324-demo-77a4", status="running", step=3))
    run.torchrun_log(0).parent.mkdir(exist_ok=True)
    run.torchrun_log(0).write_text(TORCHRUN)
    for rank, text in RANK.items():
        d = run.node_log_dir(0) / f"{run.run_id}_x2gtikxs" / "attempt_0" / str(rank)
        d.mkdir(parents=True)
        (d / "stdout.log").write_text("")
        (d / "stderr.log").write_text(text)
    store = Store(run, write=True)
    ctx = MonitorContext(run=run, spec=load_spec(run.spec), store=store, node_rank=0,
                         rank_pids=dict, stopping=lambda: False,
                         signal_ours=lambda *a: [])  # fmt: skip
    try:
        mon = DiagnosisMonitor(ctx)
        mon.tick(1e9, [])
        while_running = [f["summary"] for f in store.findings("rank_crashed")]
        mon.close([])  # torchrun has exited: the logs are read to their end
        stored = store.findings("rank_crashed")
    finally:
        store.close()
    assert not any("exited" in s for s in while_running), while_running
    assert not any("no traceback" in f["summary"] for f in stored), stored
    roots = [f for f in stored if f.get("root_cause", True)]
    assert [(f["rank"], f["summary"]) for f in roots] == [
        (1, "rank 1 crashed: RuntimeError: TUNEDECK_TEST_CRASH_AT_STEP=3: injected failure "
            "after step 3")
    ], stored  # fmt: skip
