"""Diagnosis on real logs: the 2×H200 fault fixtures and CPU runs recorded here
(tests/fixtures/cpu/, re-created by tests/fixtures/gen_faults.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import cli
from tunedeck.core.diagnose.engine import diagnose_files, diagnose_run
from tunedeck.core.diagnose.finding import Finding

H200 = Path(__file__).resolve().parent / "fixtures" / "h200" / "recorded"
CPU = Path(__file__).resolve().parent / "fixtures" / "cpu"
GEN = Path(__file__).resolve().parent / "fixtures" / "gen_faults.py"


@pytest.fixture
def h200() -> Path:
    if not H200.is_dir():
        pytest.skip(f"the H200 fixtures are not here ({H200})")
    return H200


def roots(fs: list[Finding]) -> list[Finding]:
    return [f for f in fs if f.severity == "error" and f.root_cause]


def errors(fs: list[Finding]) -> list[Finding]:
    return [f for f in fs if f.severity == "error"]


def test_h200_gpu_oom_on_rank_1(h200):
    fs = diagnose_files([h200 / "fault_oom.log"])
    [root] = roots(fs)
    assert (root.category, root.rank) == ("oom_gpu", 1)
    assert "40.00 GiB" in root.summary and "expandable_segments" in root.fix
    assert any("fault_oom.log:" in e and "OutOfMemoryError" in e for e in root.evidence)
    assert len(errors(fs)) == 1  # torchrun's exit report is folded into the OOM finding


def test_h200_nccl_timeout_names_the_stuck_rank(h200):
    fs = diagnose_files([h200 / "fault_timeout.log"])
    [root] = roots(fs)
    # the rank that never entered the all-reduce is blamed, not rank 0 that reports it
    assert (root.category, root.rank) == ("rank_missing_from_collective", 1)
    assert "rank 1 never entered collective #" in root.summary
    cons = {f.category: f for f in fs if not f.root_cause}
    timeout = cons["nccl_timeout"]
    assert timeout.rank == 0 and "rank 1 never started it" in timeout.summary
    assert "ALLREDUCE" in timeout.summary
    assert cons["worker_sigabrt"].rank == 0  # the abort after the watchdog: a consequence
    assert cons["worker_sigterm"].rank == 1  # torchrun stopping the other rank
    assert root.source.endswith("fault_timeout.log:7")


def test_h200_crash_with_traceback(h200):
    fs = diagnose_files([h200 / "fault_crash.log"])
    [root] = roots(fs)
    assert (root.category, root.rank) == ("rank_crashed", 1)
    assert "ValueError: boom" in root.summary
    ev = "\n".join(root.evidence)
    assert "Traceback (most recent call last)" in ev and 'faults.py", line 26' in ev
    assert [f.category for f in fs if not f.root_cause] == ["worker_sigterm"]


def test_h200_rendezvous_timeout(h200):
    [root] = roots(diagnose_files([h200 / "fault_rdzv_timeout.log"]))
    assert root.category == "rendezvous_unreachable" and "join_timeout" in root.fix


def test_h200_healthy_logs_have_no_errors(h200):
    fs = diagnose_files([h200 / "ddp2_nccl_info.log"])
    assert not [f for f in fs if f.severity != "info"]
    transport = [f for f in fs if f.category == "nccl_transport"][0]
    assert "P2P" in transport.summary and "2.28.9" in transport.summary
    assert diagnose_files([h200 / "ddp2_starved.log"]) == []


@pytest.mark.parametrize(
    "name,category,rank",
    [
        ("crash", "rank_crashed", 1),
        ("sigkill", "worker_sigkill", 1),
        ("segfault", "worker_segfault", 1),
        ("loader_killed", "dataloader_worker_killed", 1),
        ("port_in_use", "port_in_use", None),
    ],
)
def test_recorded_cpu_faults(name, category, rank):
    fs = diagnose_run(CPU / name)
    [root] = roots(fs)
    assert (root.category, root.rank) == (category, rank)
    assert root.node == 0 and root.evidence
    # everything else that failed is marked as a consequence
    assert all(not f.root_cause for f in errors(fs) if f is not root)


def test_crash_fixture_reads_error_json_and_peer_loss_is_a_consequence():
    fs = diagnose_run(CPU / "crash")
    r0 = [f for f in fs if f.rank == 0 and f.category == "rank_crashed"]
    assert r0 and not r0[0].root_cause and "Connection closed by peer" in r0[0].summary
    root = roots(fs)[0]
    assert any(".log:" in e for e in root.evidence)


def test_swift_wrong_flag_suggests_tuner_type():
    [root] = roots(diagnose_files([CPU / "swift_flag" / "console.log"]))
    assert root.category == "flag_error" and "--train_type" in root.summary
    assert "--tuner_type" in root.fix


def test_healthy_runs_and_nan_loss():
    assert errors(diagnose_run(CPU / "ok")) == []
    assert diagnose_run(CPU / "two_node_ok") == []  # c10d/node_rank noise is not an error
    [f] = diagnose_run(CPU / "nan")
    assert f.category == "loss_anomaly" and "step 3" in f.summary


def test_loss_collapse_and_frozen_grad_norm(tmp_path):
    rows = [
        {
            "loss": 2.0 - i / 10 if i < 4 else 0.0,
            "grad_norm": 0.7,
            "global_step/max_steps": f"{i}/12",
        }
        for i in range(1, 12)
    ]
    p = tmp_path / "logging.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cats = sorted(f.summary.split(" ")[0] + f.severity for f in diagnose_files([p]))
    assert cats == ["grad" + "warning", "loss" + "warning"]


def test_zero_gradients_are_an_error_that_points_at_the_compiler(tmp_path):
    """The built-in trainer's events of a run whose compiled graph lost its backward: the
    loss wanders near its start, grad_norm is 0.0 every step."""
    ev = tmp_path / "events" / "rank0.jsonl"
    ev.parent.mkdir()
    ev.write_text(
        "".join(
            json.dumps(
                {
                    "t": 1.0 + i,
                    "kind": "step",
                    "rank": 0,
                    "step": i,
                    "loss": 12.55 + (i % 3) / 100,
                    "grad_norm": 0.0,
                    "lr": 1e-4,
                }
            )
            + "\n"
            for i in range(1, 9)
        )
    )
    [f] = [f for f in diagnose_run(tmp_path) if f.category == "loss_anomaly"]
    assert f.severity == "error" and "exactly 0 from step 1 (8 steps)" in f.summary
    assert "train.compile = false" in f.fix


def test_line_rules_on_known_signatures(tmp_path):
    cases = {
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:0 and cpu!": "device_mismatch",
        "RuntimeError: CUDA error: an illegal memory access was encountered": "cuda_fault",
        "RuntimeError: unable to write to file </torch_123_456_0>: No space left on device (28)": "dataloader_shm",
        "OSError: [Errno 24] Too many open files": "too_many_open_files",
        "RuntimeError: CUDA error: invalid device ordinal": "gpu_count_mismatch",
        "ValueError: Must flatten tensors with uniform dtype but got torch.float32 and "
        "torch.bfloat16": "fsdp_mixed_dtype",
        "RuntimeError: Expected to have finished reduction in the prior iteration before "
        "starting a new one.": "ddp_unused_parameters",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536": "fp16_overflow",
        "gpu3:77:90 [3] NCCL WARN NET/Socket : Connection closed by remote peer "
        "10.0.0.2<4242>": "nccl_network",
        "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate "
        "123 bytes": "oom_host",
        "train.py: error: unrecognized arguments: --lora_rnak 8": "flag_error",
        "gpu1:88:88 [1] NCCL WARN NCCL version mismatch: rank 0 has 2.21.5, rank 1 has "
        "2.28.9": "nccl_version_mismatch",
        "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly": "dataloader_worker_killed",
        "ValueError: FlatParameter requires uniform requires_grad: model.layers.0 has both "
        "parameters with requires_grad=True and False": "fsdp_mixed_requires_grad",
    }
    for text, category in cases.items():
        p = tmp_path / f"{category}.log"
        p.write_text(
            f"W1130 10:00:00.000000 1 run.py:1] Setting OMP_NUM_THREADS environment "
            f"variable for each process to be 1 in default\n{text}\n"
        )
        fs = diagnose_files([p])
        assert [f.category for f in fs] == [category], text


def test_cli_json_on_files_and_unknown_run(tmp_path, h200):
    proc = cli(
        "diagnose",
        str(h200 / "fault_oom.log"),
        str(CPU / "swift_flag" / "console.log"),
        "--json",
        home=tmp_path,
    )
    data = json.loads(proc.stdout)
    assert {d["category"] for d in data} >= {"oom_gpu", "flag_error"}
    assert set(data[0]) == {
        "category",
        "severity",
        "rank",
        "node",
        "host",
        "summary",
        "cause",
        "fix",
        "evidence",
        "root_cause",
        "source",
    }
    bad = cli("diagnose", "no-such-run", home=tmp_path, check=False)
    assert bad.returncode == 1 and "no-such-run" in bad.stderr


@pytest.mark.slow
def test_generator_recreates_the_sigkill_fixture_live(tmp_path):
    """Re-record one fixture from a real torchrun run and diagnose it the same way."""
    import subprocess

    subprocess.run([sys.executable, str(GEN), str(tmp_path), "sigkill"], check=True, timeout=240)
    [root] = roots(diagnose_run(tmp_path / "sigkill"))
    assert (root.category, root.rank) == ("worker_sigkill", 1)
    assert "dmesg" in root.fix


def test_logging_jsonl_found_without_walking_checkpoints_or_logs(tmp_path):
    from tunedeck.core.rundir import RunDir

    want = tmp_path / "output" / "v0-20261130" / "logging.jsonl"
    for p in (
        want,
        tmp_path / "output" / "v0-20261130" / "checkpoint-5" / "logging.jsonl",
        tmp_path / "logs" / "node0" / "logging.jsonl",
    ):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}\n")
    assert RunDir(tmp_path).logging_jsonl_files() == [want]


def test_loss_watch_fed_step_by_step_finds_what_the_whole_list_gives():
    """The agent feeds the loss watch a few steps per tick; `tunedeck diagnose` the whole run.
    Both must find the same anomalies, with the same evidence."""
    import random

    from tunedeck.core.diagnose.loss import LossWatch, loss_findings

    rng = random.Random(7)
    for _ in range(300):
        recs = []
        for i in range(rng.randint(0, 60)):
            r = {"step": i + 1, "t": float(i)}
            c = rng.random()
            if c < 0.1:
                r["loss"] = float("nan")
            elif c < 0.45:
                r["loss"] = 0.0
            elif c < 0.9:
                r["loss"] = rng.choice([1.0, 2.5])
            if rng.random() < 0.85:
                r["grad_norm"] = rng.choice([0.5, 0.5, 0.5, 1.0])
            recs.append(r)
        watch, i = LossWatch("s"), 0
        while i < len(recs):
            n = rng.randint(1, 5)
            watch.feed(recs[i : i + n])
            i += n
        assert [f.to_json() for f in watch.findings()] == [
            f.to_json() for f in loss_findings(recs, "s")
        ]
    # and a known case: NaN from step 3, the step before it quoted
    recs = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}] + [
        {"step": s, "loss": float("nan")} for s in range(3, 9)
    ]
    [f] = loss_findings(recs)
    assert f.summary == "loss is nan from step 3 (6 of 8 steps)"
    assert f.evidence[0] == "step=2 loss=1.5" and len(f.evidence) == 5


# -- logs as users paste them (tests/corpus/; the whole corpus is scored by test_corpus.py) ---

CORPUS = Path(__file__).resolve().parent / "corpus"
WRITTEN = CORPUS / "written" / "failures"


def top(path: Path) -> Finding:
    return diagnose_files([path])[0]


def test_launcher_hung_up_is_said_as_such_and_no_rank_is_blamed():
    fs = diagnose_files([CORPUS / "recorded" / "sighup_launcher.log"])
    root = fs[0]
    assert root.category == "launcher_signal" and root.root_cause and root.rank is None
    assert "SIGHUP" in root.summary and "no rank failed" in root.summary
    assert all(not f.root_cause for f in errors(fs) if f is not root)


def test_sigkill_after_the_model_loaded_is_host_oom_with_its_rank():
    root = top(WRITTEN / "sigkill_after_shards__iso.log")
    assert (root.category, root.rank) == ("oom_host", 2) and "low_cpu_mem_usage" in root.fix


def test_signal_exit_from_a_cut_table_names_rank_and_host():
    root = top(WRITTEN / "segfault_table_timestamped__iso.log")
    assert (root.category, root.rank, root.host) == ("worker_segfault", 5, "dgx-07")


def test_cuda_fault_through_the_watchdog_is_the_root_not_the_abort_or_timeouts():
    fs = diagnose_files([WRITTEN / "cuda_fault_first_rank_of_three__rank.log"])
    assert (fs[0].category, fs[0].rank) == ("cuda_fault", 2)
    assert {f.category for f in fs if not f.root_cause} >= {"nccl_timeout"}


def test_watchdog_hang_is_a_stall_with_its_rank():
    root = top(WRITTEN / "watchdog_terminating__wrap116.log")  # wrapped at 116 columns
    assert (root.category, root.rank) == ("stall", 6)


def test_error_in_torchrun_table_traceback(tmp_path):
    p = tmp_path / "table.log"
    p.write_text(
        "\n".join(
            [
                "=" * 60,
                "train.py FAILED",
                "-" * 60,
                "Failures:",
                "  <NO_OTHER_FAILURES>",
                "-" * 60,
                "Root Cause (first observed failure):",
                "[0]:",
                "  time      : 2024-02-01_10:00:00",
                "  host      : gpu-7",
                "  rank      : 3 (local_rank: 3)",
                "  exitcode  : 1 (pid: 77)",
                "  error_file: /tmp/torchelastic_x/3/error.json",
                "  traceback : Traceback (most recent call last):",
                '    File "train.py", line 80, in main',
                "      loss.backward()",
                "  torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                "=" * 60,
                "",
            ]
        )
    )
    root = top(p)
    assert (root.category, root.rank, root.host, root.root_cause) == ("oom_gpu", 3, "gpu-7", True)


def test_nccl_plugin_probes_fine_on_one_node_slow_across_nodes():
    healthy = CORPUS / "written" / "healthy"
    one = diagnose_files([healthy / "nccl_ofi_probe_single_node__plain.log"])
    assert not errors(one)
    assert [f.severity for f in one if f.category == "nccl_socket_fallback"] == ["info"]
    multi = diagnose_files([healthy / "multinode_socket_fallback__plain.log"])
    [w] = [f for f in multi if f.category == "nccl_socket_fallback"]
    assert w.severity == "warning" and "between nodes" in w.summary and not errors(multi)


def test_retried_c10d_connect_is_a_warning_not_a_failure():
    fs = diagnose_files([CORPUS / "written" / "healthy" / "c10d_client_retry__plain.log"])
    assert not errors(fs)
    assert [f.severity for f in fs if f.category == "rendezvous_unreachable"] == ["warning"]


def test_static_signs_loss_zero_with_nan_grads_and_data_time():
    root = top(WRITTEN / "loss_zero_gradnan__plain.log")
    assert root.category == "loss_anomaly" and root.severity == "error" and "nan" in root.summary
    starved = top(WRITTEN / "data_time_dominates__plain.log")
    assert starved.category == "dataloader_starvation" and starved.severity == "warning"


def test_too_many_open_files_is_not_shared_memory():
    root = top(WRITTEN / "too_many_open_files_loader__plain.log")
    assert root.category == "too_many_open_files" and "ulimit" in root.fix


def test_a_compile_fallback_event_is_a_warning_finding(tmp_path):
    """The built-in trainer's eager_fallback phase (compile failed, training goes on eager)
    reaches the findings as a warning with the compiler's error, not as an error."""
    from tunedeck.core.diagnose.engine import diagnose_run

    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "rank0.jsonl").write_text(
        "\n".join(
            json.dumps(e)
            for e in [
                {"t": 1.0, "kind": "start", "rank": 0, "max_steps": 10},
                {
                    "t": 2.0,
                    "kind": "phase",
                    "rank": 0,
                    "phase": "eager_fallback",
                    "step": 0,
                    "error": "BackendCompilerFailed: inductor raised CalledProcessError: cc not found",
                },
                {"t": 3.0, "kind": "step", "rank": 0, "step": 1, "loss": 2.0},
            ]
        )
        + "\n"
    )
    found = diagnose_run(tmp_path)
    assert [(f.category, f.severity) for f in found] == [("compile_fallback", "warning")]
    assert "cc not found" in " ".join(found[0].evidence)


def test_an_abort_at_exit_after_the_last_step_is_one_finding_with_its_fix():
    """tests/corpus/worker.py's rank 1 finishes its 8 steps, then the C++ runtime's terminate
    ends it (SIGABRT) as a thread still joinable at exit does: recorded under torchrun."""
    fs = diagnose_files([CORPUS / "recorded" / "exit_abort.log"])
    root = fs[0]
    assert (root.category, root.rank, root.root_cause) == ("exit_abort", 1, True)
    assert "destroy_process_group()" in root.fix and "outputs are complete" in root.fix
    # the launcher's SIGABRT for that rank is the same failure, folded in as evidence
    assert any("exitcode -6 (SIGABRT)" in e for e in root.evidence)
    assert not [f for f in fs if f.category == "worker_sigabrt"]
    assert [f.category for f in fs if f.severity == "error" and f.root_cause] == ["exit_abort"]


@pytest.mark.slow
def test_a_script_run_that_aborts_at_exit_is_explained_from_its_rank_files(td_home, tmp_path):
    """The same worker as a user's script through `tunedeck launch`: the rank's stderr is its
    own file, so the line names its rank without a prefix."""
    from conftest import cli_json, json_docs

    spec = tmp_path / "abort.toml"
    spec.write_text(f'''name = "exit-abort"
backend = "script"
[script]
path = "{CORPUS / "worker.py"}"
args = ["exit_abort"]
[cluster]
device = "cpu"
cpu_procs = 2
''')
    launched = cli("launch", str(spec), "--wait", "--json", "--no-preflight", home=td_home, check=False)  # fmt: skip
    started, ended = json_docs(launched.stdout)
    run_id = started["run_id"]
    # the ended run follows the started line: a script reads why, not only the exit code
    assert launched.returncode == 1 and ended["run_id"] == run_id
    assert ended["status"] == cli_json("status", run_id, home=td_home)["status"] == "failed"
    assert ended["message"], ended
    found = cli_json("diagnose", run_id, home=td_home)
    roots = [f for f in found if f["severity"] == "error" and f["root_cause"]]
    assert [(f["category"], f["rank"]) for f in roots] == [("exit_abort", 1)], found
    assert not [f for f in found if f["category"] == "worker_sigabrt"]
