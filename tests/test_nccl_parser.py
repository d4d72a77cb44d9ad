"""core/ingest/parsers/nccl.py is the one parser of NCCL lines: each kind it claims, read from
lines as a 2 × H200 run printed them (tests/fixtures/h200/recorded/ddp2_nccl_info.log), and a check
that no other module under core/ or tui/ compiles its own regex for them."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO
from tunedeck.core.ingest.parsers.nccl import (
    CHANNEL_VIA_BYTES,
    FACT_TOKENS,
    INFO_HEAD_BYTES,
    NcclLine,
    last_enqueued_work,
    parse_nccl,
    torch_nccl_error,
)

OWNER = REPO / "core" / "ingest" / "parsers" / "nccl.py"


def test_version_line():
    rec = parse_nccl("vm:801:801 [0] NCCL INFO NCCL version 2.28.9+cuda13.0")
    assert isinstance(rec, NcclLine)
    assert (rec.host, rec.pid, rec.tid, rec.dev, rec.level) == ("vm", 801, 801, 0, "INFO")
    assert (rec.kind, rec.version) == ("version", "2.28.9+cuda13.0")


@pytest.mark.parametrize(
    "line, want",
    [
        (
            "vm:802:802 [1] NCCL INFO Channel 03/0 : 1[1] -> 0[0] via P2P/CUMEM",
            (3, 1, 0, None, "P2P/CUMEM", "P2P"),
        ),
        (
            "n1:9:9 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA",
            (0, 3, 4, "send", "NET/IB/0/GDRDMA", "IB"),
        ),
        (
            "n1:9:9 [0] NCCL INFO Channel 01/1 : 0[0] -> 1[1] [receive] via SHM/direct/direct",
            (1, 0, 1, "receive", "SHM/direct/direct", "SHM"),
        ),
        (
            "n1:9:9 [0] NCCL INFO Channel 02/0 : 0[0] -> 1[1] via NET/Socket/0",
            (2, 0, 1, None, "NET/Socket/0", "Socket"),
        ),
    ],
)
def test_channel_and_transport_lines(line, want):
    rec = parse_nccl(line)
    assert rec.kind == "transport"
    assert (rec.channel, rec.src, rec.dst, rec.tag, rec.via, rec.transport) == want
    # the bulk (bytes) pattern of the diagnosis scanner reads the same line alike
    assert CHANNEL_VIA_BYTES.findall(line.encode()) == [want[4].encode()]
    assert len(INFO_HEAD_BYTES.findall(line.encode())) == 1


def test_network_and_interface_lines():
    rec = parse_nccl("vm:801:801 [0] NCCL INFO Using network Socket")
    assert (rec.kind, rec.network) == ("network", "Socket")
    rec = parse_nccl("vm:801:801 [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>")
    assert (rec.kind, rec.interface) == ("socket", "eth0")
    rec = parse_nccl("vm:801:801 [0] NCCL INFO Bootstrap: Using eth0:192.0.2.2<0>")
    assert (rec.kind, rec.interface) == ("bootstrap", "eth0")
    rec = parse_nccl("n1:5:5 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB")
    assert (rec.kind, rec.device) == ("ib", "mlx5_0:1/IB")
    assert parse_nccl("vm:801:801 [0] NCCL INFO NET/IB : No device found.").kind == "ib_none"


def test_comm_init_channels_and_gdr_lines():
    rec = parse_nccl(
        "vm:802:802 [1] NCCL INFO comm 0x520fc910 rank 1 nRanks 2 nNodes 1 localRanks 2 "
        "localRank 1 MNNVL 0"
    )
    assert rec.kind == "comm"
    assert (rec.rank, rec.nranks, rec.nnodes, rec.local_ranks) == (1, 2, 1, 2)
    rec = parse_nccl(
        "vm:801:801 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, "
        "32 p2p channels, 32 p2p channels per peer"
    )
    assert (rec.kind, rec.channels, rec.p2p_channels) == ("channels", 24, 32)
    rec = parse_nccl("vm:801:801 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1")
    assert (rec.kind, rec.gdr) == ("gdr", True)
    rec = parse_nccl("vm:801:801 [0] NCCL INFO cudaDriverVersion 13000")
    assert rec.kind == "other" and rec.msg == "cudaDriverVersion 13000"


def test_warn_and_error_lines():
    rec = parse_nccl("[rank1]: vm:802:802 [1] NCCL WARN Call to ibv_open_device failed  ")
    assert (rec.kind, rec.level, rec.host, rec.dev) == ("warn", "WARN", "vm", 1)
    assert rec.msg == "Call to ibv_open_device failed"
    assert parse_nccl("h:1:1 [0] NCCL ERROR something broke").kind == "warn"
    assert INFO_HEAD_BYTES.findall(b"h:1:1 [0] NCCL WARN NET/Socket : peer closed\n") == []
    assert parse_nccl("no nccl here") is None
    assert parse_nccl("NCCL_DEBUG=INFO set") is None


def test_pytorch_lines_about_nccl():
    assert torch_nccl_error(
        "[rank0]:[E1130 13:05:52.123456 801 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught"
    )
    assert torch_nccl_error("RuntimeError: ncclRemoteError: A call failed")
    assert not torch_nccl_error("frame #3: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout()")
    assert not torch_nccl_error("using ProcessGroupNCCL")
    assert last_enqueued_work("[PG 0 Rank 1] Last enqueued NCCL work: 5, last completed") == 5
    assert last_enqueued_work("last enqueued work: 7") == 7
    assert last_enqueued_work("nothing") is None


def test_fact_tokens_cover_the_summary_kinds():
    for line in (
        "vm:801:801 [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
        "vm:801:801 [0] NCCL INFO Bootstrap: Using eth0:192.0.2.2<0>",
        "vm:801:801 [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>",
        "vm:801:801 [0] NCCL INFO Using network Socket",
        "vm:801:801 [0] NCCL INFO 24 coll channels, 32 p2p channels per peer",
        "vm:802:802 [1] NCCL INFO comm 0x520fc910 rank 1 nRanks 2 nNodes 1 localRanks 2",
    ):
        assert any(t in line.encode() for t in FACT_TOKENS), line


# regexes that name NCCL without parsing its lines: (file, the pattern's start) and why
NOT_PARSERS = {
    # the log view's "first error" search: `NCCL WARN` is one error word among others
    ("core/views/watch.py", "Traceback \\(most recent call last\\)|Error\\b|ERROR\\b|"),
}
# words of NCCL's INFO lines a regex for them contains even when it does not say NCCL
LINE_WORDS = ("Channel", "nRanks", "coll channels", "p2p channels", "NET/", "Using network")
_RE_CALLS = {"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "subn"}


def _literal(node: ast.AST) -> str | bytes | None:
    """A string built of literals only (implicit concatenation, `+`), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal(node.left), _literal(node.right)
        if a is not None and b is not None and type(a) is type(b):
            return a + b
    return None


def test_no_other_module_compiles_a_regex_for_nccl_lines():
    """The NCCL line shape (and PyTorch's lines about NCCL) is parsed in one module only.

    Any `re.<compile|search|...>(<literal>)` naming NCCL (or a word of its INFO lines) outside
    core/ingest/parsers/nccl.py fails, but for the searches in `NOT_PARSERS`. The diagnosis rule table (core/diagnose/rules.py
    `_r(...)`) is not a parser: its signatures map a message to a finding and stay there.
    """
    bad = []
    for folder in ("core", "tui"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == OWNER:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "re"
                    and node.func.attr in _RE_CALLS
                    and node.args
                ):
                    continue
                pat = _literal(node.args[0])
                if pat is None:
                    continue
                text = pat.decode("latin-1") if isinstance(pat, bytes) else pat
                rel = str(path.relative_to(REPO))
                if any(rel == f and text.startswith(head) for f, head in NOT_PARSERS):
                    continue
                if "nccl" in text.lower() or any(w in text for w in LINE_WORDS):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {text[:60]!r}")
    assert not bad, "parse NCCL lines with core/ingest/parsers/nccl.py:\n" + "\n".join(bad)
