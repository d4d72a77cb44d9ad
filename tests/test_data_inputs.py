"""A data.path that blocks or never ends (a FIFO, /dev/zero, a huge file) cannot hang or
exhaust preflight, the agent's preparation or the trainer: what is not a regular file is
refused by name before it is opened, and every read of the data is bounded.

Whatever could block or read without bound on a regression runs in a child process with a
timeout and an address-space limit, so a failing test fails instead of hanging the suite or
eating the machine's memory."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import DEMO, REPO, cli, cli_json, wait_for

DEMO_DATA = REPO / "presets" / "data" / "demo_chat.jsonl"
# the children below (no torch) run in far less; a read without bound hits it at once
AS_LIMIT = 1 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def write_spec(tmp: Path, data: str | Path) -> Path:
    p = tmp / "spec.toml"
    p.write_text(f'name = "t"\n[data]\npath = "{data}"\n[cluster]\ndevice = "cpu"\n')
    return p


def preflight(spec: Path, home: Path, timeout: float = 60) -> dict:
    """`tunedeck preflight SPEC --json` under the memory limit: the data.rows check."""
    p = cli(
        "preflight",
        str(spec),
        "--json",
        home=home,
        check=False,
        timeout=timeout,
        preexec_fn=_limited,
    )
    assert p.stdout.strip(), p.stderr
    out = json.loads(p.stdout)
    return next(c for c in out["checks"] if c["id"] == "data.rows")


def child(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
        preexec_fn=_limited,
    )


@pytest.fixture
def fifo(tmp_path) -> Path:
    p = tmp_path / "train.jsonl"
    os.mkfifo(p)
    return p


@pytest.fixture
def huge(tmp_path) -> Path:
    """8 GiB: 40 good rows, then a hole (no line break in it); sparse, so it costs no disk."""
    p = tmp_path / "huge.jsonl"
    p.write_bytes(b"".join(DEMO_DATA.read_bytes().splitlines(keepends=True)[:40]))
    os.truncate(p, 8 << 30)
    return p


def test_preflight_names_a_fifo_and_returns(tmp_path, td_home, fifo):
    t = time.monotonic()
    r = preflight(write_spec(tmp_path, fifo), td_home, timeout=60)
    assert time.monotonic() - t < 60
    assert r["status"] == "fail"
    assert f"data.path {fifo} is a FIFO (named pipe), not a regular file" in r["detail"]
    assert "regular JSONL file" in r["fix"]


def test_preflight_refuses_dev_zero_and_a_folder_by_name(tmp_path, td_home):
    r = preflight(write_spec(tmp_path, "/dev/zero"), td_home)
    assert r["status"] == "fail"
    assert "data.path /dev/zero is a character device, not a regular file" in r["detail"]
    r = preflight(write_spec(tmp_path, tmp_path), td_home)
    assert r["status"] == "fail" and f"{tmp_path} is a directory" in r["detail"]


def test_preflight_reads_a_huge_file_only_up_to_its_bound(tmp_path, td_home, huge):
    from tunedeck.core.preflight.inputs import SCAN_MAX_BYTES

    t = time.monotonic()
    r = preflight(write_spec(tmp_path, huge), td_home, timeout=120)
    took = time.monotonic() - t
    # 8 GiB would not fit under the 1 GiB limit: only the first SCAN_MAX_BYTES were read
    assert r["status"] == "pass", r
    assert f"40 rows (messages) in the first {SCAN_MAX_BYTES >> 20} MiB of 8.0 GiB" in r["detail"]
    assert took < 60, took


def test_preflight_on_a_file_without_line_breaks_says_so(tmp_path, td_home):
    p = tmp_path / "blob.jsonl"
    with open(p, "wb") as f:
        f.truncate(1 << 30)
    r = preflight(write_spec(tmp_path, p), td_home)
    assert r["status"] == "fail" and "no line break in the first 64 MiB of 1.0 GiB" in r["detail"]


def test_the_demo_model_reads_a_bounded_head_of_the_data(tmp_path, huge):
    """The demo model is named and built from the data's first DEMO_DATA_MAX_BYTES: an 8 GiB
    file is hashed within the 1 GiB limit, and names the same model as its head alone."""
    head = tmp_path / "head.jsonl"
    head.write_bytes(b"".join(DEMO_DATA.read_bytes().splitlines(keepends=True)[:40]))
    code = (
        "import sys; from tunedeck.core.demo import tiny_model_dir; "
        f"print(tiny_model_dir({str(huge)!r}, __import__('pathlib').Path({str(tmp_path)!r})))"
    )
    t = time.monotonic()
    p = child(code)
    assert p.returncode == 0, p.stderr[-2000:]
    assert time.monotonic() - t < 30
    from tunedeck.core.demo import tiny_model_dir

    assert Path(p.stdout.strip()) == tiny_model_dir(head, tmp_path)
    # a small file keeps the name it always had (the hash of all its bytes)
    import hashlib

    digest = hashlib.sha256(DEMO_DATA.read_bytes() + b"\0builder=1").hexdigest()[:16]
    assert tiny_model_dir(DEMO_DATA, tmp_path).name == f"tiny-qwen2-{digest}"


def test_ensure_tiny_model_on_a_fifo_raises_promptly_naming_it(tmp_path, fifo):
    code = f"""
import json, pathlib
from tunedeck.core.demo import ensure_tiny_model
from tunedeck.core.supervisor.agent import prepare_finding
try:
    ensure_tiny_model({str(fifo)!r}, pathlib.Path({str(tmp_path / "cache")!r}))
except Exception as e:
    f = prepare_finding(e, {str(fifo)!r})
    print(json.dumps({{"type": type(e).__name__, "oserror": isinstance(e, OSError),
                      "filename": getattr(e, "filename", None), "text": str(e),
                      "category": f.category, "summary": f.summary}}))
"""
    t = time.monotonic()
    p = child(code, timeout=60)
    assert time.monotonic() - t < 60
    assert p.returncode == 0 and p.stdout.strip(), p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["oserror"] and out["filename"] == str(fifo)
    assert out["text"] == f"data.path {fifo} is a FIFO (named pipe), not a regular file"
    assert out["category"] == "data_unreadable" and str(fifo) in out["summary"]
    # nothing was built, no lock or temp folder left for this data
    assert not (tmp_path / "cache" / "models").exists() or not any(
        (tmp_path / "cache" / "models").iterdir()
    )


def _released(fn, fifo: Path, timeout: float = 20):
    """fn() in a thread; if it blocks on the FIFO, a writer opens and closes it so the
    thread ends, and the test fails."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        th.join(10)
        raise AssertionError(f"blocked on the FIFO {fifo} for {timeout}s")
    return out


def test_the_trainer_refuses_a_fifo_by_name(fifo):
    from tunedeck.core.spec import RunSpec
    from tunedeck.core.train.data import DataError, load_datasets, read_conversations

    out = _released(lambda: read_conversations(fifo), fifo)
    assert isinstance(out.get("error"), DataError), out
    assert str(out["error"]) == f"data.path {fifo} is a FIFO (named pipe), not a regular file"
    spec = RunSpec(name="t")
    spec.data.path, spec.data.val_path = str(DEMO_DATA), str(fifo)
    out = _released(lambda: load_datasets(spec.data, None, 0), fifo)
    assert isinstance(out.get("error"), DataError), out
    assert str(out["error"]) == f"data.val_path {fifo} is a FIFO (named pipe), not a regular file"


def test_read_head_guards_a_path_that_became_a_fifo(tmp_path, monkeypatch):
    """The stat said regular, then the path was swapped for a FIFO: the O_NONBLOCK open
    does not wait for a writer and the fstat refuses it."""
    from tunedeck.core import demo

    p = tmp_path / "d.jsonl"
    os.mkfifo(p)
    monkeypatch.setattr(demo, "check_data_file", lambda path, what="data.path": None)
    out = _released(lambda: demo.read_head(p, 1 << 20), p, timeout=10)
    assert isinstance(out.get("error"), demo.DataFileError), out
    assert "is a FIFO" in str(out["error"])


@pytest.mark.slow
def test_launch_without_preflight_fails_preparation_naming_the_fifo(td_home, fifo):
    run_id = cli_json(
        "launch", str(DEMO), "--no-preflight", "--set", f"data.path={fifo}", home=td_home
    )["run_id"]
    st = wait_for(
        lambda: (s := cli_json("status", run_id, home=td_home))["status"] == "failed" and s,
        60,
        "the failed preparation",
    )
    assert "is a FIFO (named pipe)" in st["message"] and str(fifo) in st["message"]
    [f] = [
        f for f in cli_json("diagnose", run_id, home=td_home) if f["category"] == "data_unreadable"
    ]
    assert str(fifo) in f["summary"] and "FIFO" in f["summary"]
