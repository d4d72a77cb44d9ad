"""core/views/nccl.py: per-rank NCCL facts from the rank logs, read incrementally.

On real recordings: tests/fixtures/h200/recorded/ddp2_nccl_info.log (NCCL_DEBUG=INFO of a 2 × H200
DDP run, both processes in one console log, split here by pid into the rank logs torchrun
would have written) and the watchdog timeout of tests/fixtures/h200/hung_rank.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO
from tunedeck.core.rundir import RunDir
from tunedeck.core.views.nccl import MAX_ISSUES, NcclReader

NCCL_LOG = REPO / "tests" / "fixtures" / "h200" / "recorded" / "ddp2_nccl_info.log"
HUNG = REPO / "tests" / "fixtures" / "h200" / "hung_rank"

needs_recording = pytest.mark.skipif(
    not NCCL_LOG.exists(), reason=f"{NCCL_LOG} is not in this checkout"
)


def _rank_dir(run: Path, rank: int, attempt: str = "attempt_0") -> Path:
    d = run / "logs" / "node0" / "fx_1" / attempt / str(rank)
    d.mkdir(parents=True, exist_ok=True)
    return d


def _recorded(pid: str) -> list[str]:
    return [ln for ln in NCCL_LOG.read_text().splitlines(True) if ln.startswith(f"vm:{pid}:")]


@pytest.fixture
def nccl_run(tmp_path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text('{"nproc_per_node": 2}')
    for rank, pid in ((0, "801"), (1, "802")):
        d = _rank_dir(run, rank)
        (d / "stdout.log").write_text("".join(_recorded(pid)))
        (d / "stderr.log").write_text("")
    return run


@needs_recording
def test_recorded_nccl_info_per_rank(nccl_run):
    reader = NcclReader(RunDir(nccl_run))
    assert reader.poll()
    r0, r1 = reader.summaries()
    for r, pid, peer in ((r0, 801, 1), (r1, 802, 0)):
        assert (r.host, r.pid, r.version) == ("vm", pid, "2.28.9+cuda13.0")
        assert r.network == "Socket" and r.interfaces == ["eth0"] and r.ib_missing
        assert (r.nranks, r.nnodes) == (2, 1)
        assert (r.coll_channels, r.p2p_channels, r.gdr) == (24, 32, True)
        [p] = r.peers.values()
        # every channel to the peer is direct P2P (CUMEM): 24 of them, however often listed
        assert (p.peer, p.transport, p.via, len(p.channels)) == (peer, "P2P", "P2P/CUMEM", 24)
        assert r.issues == [] and r.caught_up
    assert not reader.poll()  # nothing new: nothing changed


@needs_recording
def test_reads_only_what_was_appended(nccl_run):
    out = _rank_dir(nccl_run, 0) / "stdout.log"
    lines = _recorded("801")
    out.write_text("".join(lines[:20]))
    reader = NcclReader(RunDir(nccl_run))
    reader.poll()
    assert reader.summary(0).version == "2.28.9+cuda13.0" and not reader.summary(0).peers
    read = reader._ranks[0].tails[0].offset
    assert read == out.stat().st_size
    # the rest, with a line still being written at the end: it waits for its newline
    rest = "".join(lines[20:])
    with open(out, "a") as f:
        f.write(rest + "vm:801:801 [0] NCCL WARN Call to ibv_open_device fai")
    assert reader.poll()
    s = reader.summary(0)
    assert len(s.peers[1].channels) == 24 and s.issues == []
    assert reader._ranks[0].tails[0].offset == read + len(rest.encode())
    with open(out, "a") as f:
        f.write("led\n")
    assert reader.poll()
    [warn] = reader.summary(0).issues
    assert warn.level == "WARN" and warn.text.endswith("ibv_open_device failed")
    assert warn.file == "stdout.log" and warn.line == len(lines) + 1


def test_watchdog_errors_of_the_hung_rank_recording(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(HUNG / "logs", run / "logs")
    shutil.copy(HUNG / "plan.json", run / "plan.json")
    reader = NcclReader(RunDir(run))
    reader.poll()
    r0, r1 = reader.summaries()
    assert r0.version is None and not r0.peers  # NCCL_DEBUG was not set there
    first = r0.issues[0]
    assert first.level == "ERROR" and (first.file, first.line) == ("stderr.log", 1)
    assert "Watchdog caught collective operation timeout" in first.text
    assert all(i.level == "ERROR" for i in r0.issues)
    # C++ frames name ProcessGroupNCCL on every line; they are not errors of their own
    assert not any(i.text.startswith("frame #") for i in r0.issues)
    assert any("Observed flight recorder dump signal" in i.text for i in r1.issues)


def test_a_log_without_nccl_and_a_new_attempt(tmp_path):
    run = tmp_path / "run"
    d = _rank_dir(run, 0)
    (d / "stdout.log").write_text("step 1 loss 2.0\n" * 1000)
    (d / "stderr.log").write_text("")
    reader = NcclReader(RunDir(run))
    reader.poll()
    s = reader.summary(0)
    assert s.nccl_lines == 0 and s.issues == [] and s.caught_up
    # torchrun starts again: NCCL initialises again, the summary starts over
    d2 = _rank_dir(run, 0, "attempt_1")
    (d2 / "stdout.log").write_text(
        "h:9:9 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "h:9:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via "
        "NET/IB/0/GDRDMA\n"
    )
    (d2 / "stderr.log").write_text("")
    assert reader.poll()
    s = reader.summary(0)
    assert s.version == "2.21.5+cuda12.4" and "attempt_1" in s.attempt_files[0]
    assert (s.peers[1].transport, s.peers[1].via) == ("IB", "NET/IB/0/GDRDMA")


def test_a_big_log_is_read_in_slices_and_warnings_are_capped(tmp_path):
    run = tmp_path / "run"
    d = _rank_dir(run, 0)
    filler = "x" * 1000 + "\n"
    with open(d / "stdout.log", "w") as f:
        for i in range(3000):
            f.write(filler)
            f.write(f"h:1:1 [0] NCCL WARN NET/Socket : peer {i} closed\n")
    (d / "stderr.log").write_text("")
    reader = NcclReader(RunDir(run))
    reader.poll(max_bytes=1 << 20)
    s = reader.summary(0)
    assert not s.caught_up and 0 < s.bytes_read < s.bytes_total
    while not reader.summary(0).caught_up:
        reader.poll(max_bytes=1 << 20)
    s = reader.summary(0)
    assert len(s.issues) == MAX_ISSUES and s.issues[0].text.endswith("peer 0 closed")
    assert s.nccl_lines == 3000
