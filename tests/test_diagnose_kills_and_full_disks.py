"""Two failures `tunedeck diagnose` used to word wrongly, through the real command:

- a checkpoint save that hit a full disk (PyTorch's zip writer says `unexpected pos N vs M`
  or `PytorchStreamWriter failed writing file ...: file write failed`, safetensors and
  save_pretrained say errno 28 or a quota) was "a crash in your code";
- a torchrun killed by SIGKILL left "no findings": nothing is logged, only the exit code the
  agent records in state.json (negative: the signal), which is now the evidence.

The log lines are the shapes torch 2.13 / safetensors print on a full tmpfs (recorded on this
machine) and those older torch releases print, in a run directory built here."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import DEMO, cli, cli_json, wait_for

RUN_ID = "20261203-120000-ckpt-0a1b"
PY = "/opt/venv/lib/python3.11/site-packages"
TORCH_SAVE = [
    "Traceback (most recent call last):",
    f'  File "{PY}/torch/serialization.py", line 1003, in save',
    "    _save(",
    f'  File "{PY}/torch/serialization.py", line 1312, in _save',
    "    zip_file.write_record(name, storage, num_bytes)",
]
TORCH_SAVE_TAIL = [
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    '  File "/home/u/proj/train.py", line 211, in <module>',
    "    save_checkpoint(model, optimizer, step)",
    '  File "/home/u/proj/train.py", line 98, in save_checkpoint',
    "    torch.save(state, path)",
    f'  File "{PY}/torch/serialization.py", line 1002, in save',
    "    with _open_zipfile_writer(f) as opened_zipfile:",
    f'  File "{PY}/torch/serialization.py", line 834, in __exit__',
    "    self.file_like.write_end_of_file()",
]
SAVE_PRETRAINED = [
    "Traceback (most recent call last):",
    '  File "/home/u/proj/sft.py", line 77, in <module>',
    "    model.save_pretrained(out_dir)",
    f'  File "{PY}/transformers/modeling_utils.py", line 4102, in save_pretrained',
    "    safe_save_file(shard, os.path.join(save_directory, shard_file), metadata=metadata)",
    f'  File "{PY}/safetensors/torch.py", line 323, in save_file',
    "    serialize_file(",
]

# name → the rank's stderr after `[rank0]: ` (each the way one torch/safetensors release says it)
SHAPES = {
    # torch 2.x to a path: the C++ stream error, then the zip writer's position check
    "torch2_path": TORCH_SAVE
    + ["RuntimeError: basic_ios::clear: iostream error"]
    + TORCH_SAVE_TAIL
    + ["RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"],
    # torch 2.x to an open file object: errno 28 first, then the same position check
    "torch2_fileobj": TORCH_SAVE
    + ["OSError: [Errno 28] No space left on device"]
    + TORCH_SAVE_TAIL
    + ["RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"],
    # torch 1.x / early 2.x: the writer names the record it could not write
    "torch1_record": TORCH_SAVE
    + [
        "RuntimeError: [enforce fail at inline_container.cc:300] . "
        "PytorchStreamWriter failed writing file data/3: file "
        "write failed"
    ]
    + TORCH_SAVE_TAIL
    + [
        "RuntimeError: [enforce fail at inline_container.cc:603] . "
        "unexpected pos 1234567 vs 1234455"
    ],
    "torch_plain_writer": TORCH_SAVE
    + ["RuntimeError: PytorchStreamWriter failed writing file data/0: file write failed"],
    # the legacy (non-zip) format
    "torch_legacy": [
        "Traceback (most recent call last):",
        f'  File "{PY}/torch/serialization.py", line 1018, in save',
        "    _legacy_save(obj, opened_file, pickle_module, pickle_protocol)",
        f'  File "{PY}/torch/serialization.py", line 1178, in _legacy_save',
        "    storage._write_file(",
        "RuntimeError: write(): fd 3 failed with No space left on device",
    ],
    # safetensors through save_pretrained, current and older wording; a quota
    "safetensors": SAVE_PRETRAINED
    + [
        "safetensors._safetensors_rust.SafetensorError: Error while serializing: I/O error: "
        "No space left on device (os error 28)"
    ],
    "safetensors_old": SAVE_PRETRAINED
    + [
        "safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, "
        'kind: StorageFull, message: "No space left on device" })'
    ],
    "quota": SAVE_PRETRAINED[:4]
    + ["    json.dump(config, f)", "OSError: [Errno 122] Disk quota exceeded"],
}

TORCHRUN_TABLE = """\
E1203 12:00:09.500000 900 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 0 (pid: 901) of binary: /opt/venv/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_12:00:09
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 902)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 902
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_12:00:09
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 901)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def build_run(
    root: Path,
    rank0_stderr: list[str],
    *,
    state: dict | None = None,
    table: bool = True,
    run_id: str = RUN_ID,
) -> Path:
    """A run directory of 2 ranks on one node, as tunedeck lays it out."""
    run = root / run_id
    att = run / "logs" / "node0" / f"{run_id}_ab12cd34" / "attempt_0"
    for r in (0, 1):
        (att / str(r)).mkdir(parents=True)
        (att / str(r) / "stdout.log").write_text(
            "".join(f"step {s}/400 loss {3.1 - s / 100:.4f}\n" for s in range(1, 6))
        )
    (att / "0" / "stderr.log").write_text("".join(f"[rank0]: {ln}\n" for ln in rank0_stderr))
    (att / "1" / "stderr.log").write_text("")
    (run / "logs" / "torchrun-node0.log").write_text(TORCHRUN_TABLE if table else "")
    (run / "plan.json").write_text(
        json.dumps({"nproc_per_node": 2, "nnodes": 1, "world_size": 2, "nodes": []})
    )
    now = time.time()
    st = {
        "run_id": run_id,
        "name": "ckpt",
        "status": "failed",
        "created": now - 60,
        "started": now - 55,
        "ended": now,
        "exit_code": 1,
        "attempt": 0,
        "message": "torchrun exited with code 1",
        "stop_requested": None,
        "torchrun_pid": 900,
        "host": "localhost",
    }
    st.update(state or {})
    (run / "state.json").write_text(json.dumps(st))
    return run


def diagnose(target: str | Path, home: Path) -> list[dict]:
    return cli_json("diagnose", str(target), home=home)


def root_of(findings: list[dict]) -> dict:
    roots = [f for f in findings if f["root_cause"] and f["severity"] == "error"]
    assert len(roots) == 1, findings
    return roots[0]


# -- a checkpoint save on a full disk -------------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_checkpoint_save_on_a_full_disk_is_named_as_such(tmp_path, shape):
    run = build_run(tmp_path, SHAPES[shape])
    fs = diagnose(run, tmp_path / "home")
    root = root_of(fs)
    assert root["category"] == "checkpoint_write_failed", (shape, root)
    assert root["rank"] == 0
    assert root["summary"].startswith("checkpoint save failed: the disk (or quota) is full")
    assert (
        "save_total_limit" in root["fix"] and "output_dir" in root["fix"] and "df -h" in root["fix"]
    )
    # the evidence is the failing save's own lines, with where they are
    text = "\n".join(root["evidence"])
    assert "stderr.log:" in text and SHAPES[shape][-1].strip()[:40] in text
    # nobody calls it a crash in the user's code: the torchrun exit is folded into it
    assert not any(f["category"] == "rank_crashed" and f["rank"] == 0 for f in fs), fs


def test_the_built_in_trainers_own_save_and_a_table_traceback(tmp_path):
    """The same failure in tunedeck's own trainer (its checkpoint.py frames), and quoted in
    torchrun's table instead of a rank log."""
    own = [
        "Traceback (most recent call last):",
        '  File "/opt/venv/lib/python3.11/site-packages/tunedeck/core/train/checkpoint.py", '
        "line 48, in write_checkpoint",
        "    write(tmp)",
        "RuntimeError: basic_ios::clear: iostream error",
    ]
    root = root_of(diagnose(build_run(tmp_path / "a", own), tmp_path / "home"))
    assert (root["category"], root["rank"]) == ("checkpoint_write_failed", 0)
    table = TORCHRUN_TABLE.replace(
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/"
        "errors.html",
        "  traceback : Traceback (most recent call last):\n"
        f'    File "{PY}/torch/serialization.py", line 1003, in save\n'
        "      _save(\n"
        "  RuntimeError: PytorchStreamWriter failed writing file data/7: file write failed",
    )
    run = build_run(tmp_path / "b", [])
    (run / "logs" / "torchrun-node0.log").write_text(table)
    root = root_of(diagnose(run, tmp_path / "home"))
    assert (root["category"], root["rank"]) == ("checkpoint_write_failed", 0), root


def test_a_full_disk_outside_a_save_stays_a_full_disk(tmp_path):
    lines = [
        "Traceback (most recent call last):",
        '  File "/home/u/proj/train.py", line 50, in <module>',
        "    log.write(line)",
        "OSError: [Errno 28] No space left on device",
    ]
    root = root_of(diagnose(build_run(tmp_path, lines), tmp_path / "home"))
    assert root["category"] == "disk_full", root
    # and a plain crash in a save function that is not about writing is still the user's
    lines = SAVE_PRETRAINED[:4] + ["KeyError: 'lm_head.weight'"]
    root = root_of(diagnose(build_run(tmp_path / "b", lines), tmp_path / "home"))
    assert root["category"] == "rank_crashed", root


# -- a launcher killed by a signal ---------------------------------------------------------------


def test_torchrun_killed_by_sigkill_is_named_from_the_recorded_exit_code(tmp_path, td_home):
    runs = td_home / "runs"
    ended = time.time()
    build_run(
        runs,
        [],
        table=False,
        state={
            "exit_code": -9,
            "torchrun_pid": 43210,
            "ended": ended,
            "message": "torchrun was killed by SIGKILL (signal 9; exit code -9)",
            "attempts": [{"attempt": 0, "ended": ended, "exit_code": -9}],
        },
    )
    out = cli("diagnose", RUN_ID, home=td_home).stdout
    assert "no findings" not in out
    root = root_of(diagnose(RUN_ID, td_home))
    assert root["category"] == "launcher_killed" and root["rank"] is None
    assert "SIGKILL" in root["summary"] and "OOM killer" in root["summary"]
    assert "kill -9" in root["cause"] and "cgroup" in root["cause"]
    fix = root["fix"].lower()
    for needle in (
        "dmesg",
        "journalctl -k --since",
        "out of memory",
        "killed process 43210",
        "memory.max",
        "memory.events",
        "free -g",
    ):
        assert needle in fix, needle
    assert any("exit_code -9 (SIGKILL, torchrun pid 43210" in e for e in root["evidence"])
    # the text output says it the same way
    assert "[ROOT CAUSE] launcher_killed" in cli("diagnose", RUN_ID, home=td_home).stdout


def test_a_stop_that_was_asked_for_is_not_blamed_on_a_kill(tmp_path, td_home):
    """`tunedeck stop --hard` ends torchrun with SIGKILL too: that is no failure."""
    runs = td_home / "runs"
    build_run(
        runs,
        [],
        table=False,
        state={"status": "stopped", "exit_code": -9, "stop_requested": "hard"},
    )
    fs = diagnose(RUN_ID, td_home)
    assert not any(f["category"] == "launcher_killed" for f in fs), fs


def test_other_signals_and_a_restarted_attempt(tmp_path):
    run = build_run(
        tmp_path,
        [],
        table=False,
        state={
            "exit_code": -15,
            "attempts": [
                {"attempt": 0, "ended": time.time() - 30, "exit_code": -9},
                {"attempt": 1, "ended": time.time(), "exit_code": -15},
            ],
        },
    )
    fs = diagnose(run, tmp_path / "home")
    root = root_of(fs)
    assert root["category"] == "launcher_killed" and "SIGTERM" in root["summary"]
    [earlier] = [f for f in fs if f["severity"] == "warning"]
    assert "SIGKILL" in earlier["summary"] and "attempt 0; the run restarted" in earlier["summary"]


def test_a_rank_killed_by_sigkill_says_how_to_tell_who_killed_it(tmp_path):
    table = TORCHRUN_TABLE.replace("exitcode  : 1 (pid: 901)", "exitcode  : -9 (pid: 901)").replace(
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/"
        "elastic/errors.html",
        "  traceback : Signal 9 (SIGKILL) received by PID 901",
    )
    run = build_run(tmp_path, [], state={"exit_code": 1})
    (run / "logs" / "torchrun-node0.log").write_text(table)
    root = root_of(diagnose(run, tmp_path / "home"))
    assert (root["category"], root["rank"]) == ("worker_sigkill", 0)
    assert "OOM killer" in root["summary"] and "kill -9" in root["summary"]
    assert (
        "journalctl -k" in root["fix"]
        and "memory.events" in root["fix"]
        and "cgroup" in root["cause"]
    )


@pytest.mark.slow
def test_sigkill_of_a_real_torchrun_is_named(td_home):
    run_id = cli_json("launch", str(DEMO), "--set", "train.max_steps=100000", home=td_home)[
        "run_id"
    ]
    state = td_home / "runs" / run_id / "state.json"

    def torchrun_training():
        st = json.loads(state.read_text())
        return st.get("torchrun_pid") if (st.get("progress") or {}).get("step") else None

    pid = wait_for(torchrun_training, 180, "torchrun and a first step")
    os.kill(pid, signal.SIGKILL)
    st = wait_for(
        lambda: (
            (s := cli_json("status", run_id, home=td_home))["status"]
            in ("failed", "stopped", "succeeded")
            and s
        ),
        120,
        "the run's end",
    )
    assert st["status"] == "failed", st
    root = root_of(diagnose(run_id, td_home))
    assert root["category"] == "launcher_killed", root
    assert "SIGKILL" in root["summary"] and f"killed process {pid}" in root["fix"]
