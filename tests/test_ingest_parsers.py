"""Parsers and the line assembler on real-shaped text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tunedeck.core.ingest.parsers import LineAssembler, parse_metrics_line
from tunedeck.core.ingest.parsers.nccl import NcclSummary, parse_nccl
from tunedeck.core.ingest.parsers.prefix import split_rank
from tunedeck.core.ingest.parsers.pydict import parse_dict_line
from tunedeck.core.ingest.parsers.torchrun import ChildFailedParser
from tunedeck.core.ingest.parsers.tqdm import parse_tqdm

H200 = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "h200"


@pytest.fixture
def h200() -> Path:
    if not H200.is_dir():
        pytest.skip(f"the H200 fixtures are not here ({H200})")
    return H200


SWIFT5 = ("{'loss': '6.914', 'grad_norm': '1.552', 'learning_rate': '9.045e-05', "
          "'token_acc': '0', 'epoch': '0.08', 'global_step/max_steps': '1/5', "
          "'elapsed_time': '0s', 'remaining_time': '1s', 'train_speed(s/it)': '0.2286'}")


def test_dict_repr_with_quoted_and_raw_values():
    d = parse_dict_line(SWIFT5)
    assert d["loss"] == 6.914 and d["learning_rate"] == 9.045e-05
    assert d["global_step/max_steps"] == "1/5" and d["elapsed_time"] == "0s"
    raw = parse_dict_line("{'loss': nan, 'grad_norm': 0.61, 'epoch': 1}")
    assert math.isnan(raw["loss"]) and raw["grad_norm"] == 0.61 and raw["epoch"] == 1
    assert parse_dict_line("{not a dict") is None


def test_assembler_splits_tqdm_cr_and_joins_hard_wrapped_dicts():
    bar = "Train:  20%|██        | 1/5 [00:00<00:01,  3.21it/s]"
    a = LineAssembler()
    out = a.feed(bar + "\r" + bar.replace("1/5", "1/5") + "\r" + SWIFT5 + "\r" + bar + "\n")
    dicts = [line for line in out if line.startswith("{")]
    assert dicts == [SWIFT5]
    # a dict cut in the middle of a number, across feeds and a partial line
    cut = SWIFT5.index("1.552") + 2
    out = a.feed(SWIFT5[:cut] + "\n") + a.feed(SWIFT5[cut:cut + 10]) + a.feed(SWIFT5[cut + 10:] + "\n")
    assert out == [SWIFT5]
    assert parse_dict_line(out[0])["grad_norm"] == 1.552
    # a dict glued after a bar without \r
    out = a.feed(bar + SWIFT5 + "\n")
    assert out[-1] == SWIFT5


def test_tqdm_torchtitan_deepspeed():
    t = parse_tqdm("  12%|█▏   | 12/100 [00:03<00:22, 3.9it/s]")
    assert (t["n"], t["total"], t["elapsed_s"], t["remaining_s"], t["it_per_s"]) == \
        (12, 100, 3, 22, 3.9)
    assert parse_tqdm("Train:  12%|▏| 12/100 [01:02<1:00:00, 3.21s/it]")["s_per_it"] == 3.21
    fmt, d = parse_metrics_line(
        "\x1b[31mstep: 10  \x1b[32mloss:  7.12  \x1b[33mmemory: 30.1GiB(31.7%)  tps: 4,120  mfu: 38.2%")
    assert fmt == "torchtitan" and d["step"] == 10 and d["loss"] == 7.12
    assert d["tps"] == 4120 and d["memory_gib"] == 30.1 and d["mfu"] == 38.2
    fmt, d = parse_metrics_line("[2024-05-01 10:00:00,000] [INFO] [logging.py:96:log_dist] "
                                "[Rank 0] step=10, skipped=0, lr=[1e-05], mom=[(0.9, 0.999)]")
    assert fmt == "deepspeed" and (d["step"], d["lr"], d["rank"]) == (10, 1e-05, 0)
    fmt, d = parse_metrics_line("[Rank 0] step=20, skipped=1, lr=[2e-05], mom=[[0.9, 0.999]], "
                                "samples/sec=12.5")
    assert d["samples_per_s"] == 12.5 and d["skipped"] == 1


def test_nccl_lines_from_the_h200_fixture(h200):
    s = NcclSummary()
    for line in (h200 / "ddp2_nccl_info.log").read_text().splitlines():
        rec = parse_nccl(line)
        if rec:
            s.add(rec)
    assert set(s.versions.values()) == {"2.28.9+cuda13.0"}
    assert s.transports == {"P2P": 48} and s.network == "Socket"
    assert s.interfaces == {"eth0"} and (s.nranks, s.nnodes, s.channels) == (2, 1, 24)
    assert s.ib_missing
    rec = parse_nccl("n1:9:9 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA")
    assert rec["transport"] == "IB"
    assert parse_nccl("gpu7:1:2 [0] NCCL WARN NET/Socket : peer closed")["kind"] == "warn"


def test_childfailed_block(h200):
    p = ChildFailedParser()
    reports = [r for i, line in enumerate((h200 / "fault_crash.log").read_text().splitlines(), 1)
               if (r := p.feed(line, i))]
    assert len(reports) == 1
    rep = reports[0]
    root = rep.root
    assert (root.rank, root.local_rank, root.exitcode, root.pid, root.host) == (1, 1, 1, 1334,
                                                                                 "localhost")
    other = [f for f in rep.failures if not f.root_cause][0]
    assert (other.rank, other.exitcode, other.signal) == (0, -15, "SIGTERM")
    assert root.time is not None and root.error_file is None


def test_rank_prefix_keeps_indentation():
    assert split_rank("[rank1]:   File \"x.py\", line 3") == (1, "  File \"x.py\", line 3")
    assert split_rank("no prefix") == (None, "no prefix")
