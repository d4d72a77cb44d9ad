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

H200 = Path(__file__).resolve().parent / "fixtures" / "h200" / "recorded"


@pytest.fixture
def h200() -> Path:
    if not H200.is_dir():
        pytest.skip(f"the H200 fixtures are not here ({H200})")
    return H200


SWIFT5 = (
    "{'loss': '6.914', 'grad_norm': '1.552', 'learning_rate': '9.045e-05', "
    "'token_acc': '0', 'epoch': '0.08', 'global_step/max_steps': '1/5', "
    "'elapsed_time': '0s', 'remaining_time': '1s', 'train_speed(s/it)': '0.2286'}"
)


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
    out = (
        a.feed(SWIFT5[:cut] + "\n")
        + a.feed(SWIFT5[cut : cut + 10])
        + a.feed(SWIFT5[cut + 10 :] + "\n")
    )
    assert out == [SWIFT5]
    assert parse_dict_line(out[0])["grad_norm"] == 1.552
    # a dict glued after a bar without \r
    out = a.feed(bar + SWIFT5 + "\n")
    assert out[-1] == SWIFT5


def test_tqdm_torchtitan_deepspeed():
    t = parse_tqdm("  12%|█▏   | 12/100 [00:03<00:22, 3.9it/s]")
    assert (t["n"], t["total"], t["elapsed_s"], t["remaining_s"], t["it_per_s"]) == (
        12,
        100,
        3,
        22,
        3.9,
    )
    assert parse_tqdm("Train:  12%|▏| 12/100 [01:02<1:00:00, 3.21s/it]")["s_per_it"] == 3.21
    fmt, d = parse_metrics_line(
        "\x1b[31mstep: 10  \x1b[32mloss:  7.12  \x1b[33mmemory: 30.1GiB(31.7%)  tps: 4,120  mfu: 38.2%"
    )
    assert fmt == "torchtitan" and d["step"] == 10 and d["loss"] == 7.12
    assert d["tps"] == 4120 and d["memory_gib"] == 30.1 and d["mfu"] == 38.2
    fmt, d = parse_metrics_line(
        "[2024-05-01 10:00:00,000] [INFO] [logging.py:96:log_dist] "
        "[Rank 0] step=10, skipped=0, lr=[1e-05], mom=[(0.9, 0.999)]"
    )
    assert fmt == "deepspeed" and (d["step"], d["lr"], d["rank"]) == (10, 1e-05, 0)
    fmt, d = parse_metrics_line(
        "[Rank 0] step=20, skipped=1, lr=[2e-05], mom=[[0.9, 0.999]], samples/sec=12.5"
    )
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
    assert rec.transport == "IB"
    assert parse_nccl("gpu7:1:2 [0] NCCL WARN NET/Socket : peer closed").kind == "warn"


def test_childfailed_block(h200):
    p = ChildFailedParser()
    reports = [
        r
        for i, line in enumerate((h200 / "fault_crash.log").read_text().splitlines(), 1)
        if (r := p.feed(line, i))
    ]
    assert len(reports) == 1
    rep = reports[0]
    root = rep.root
    assert (root.rank, root.local_rank, root.exitcode, root.pid, root.host) == (
        1,
        1,
        1,
        1334,
        "localhost",
    )
    other = [f for f in rep.failures if not f.root_cause][0]
    assert (other.rank, other.exitcode, other.signal) == (0, -15, "SIGTERM")
    assert root.time is not None and root.error_file is None


def test_rank_prefix_keeps_indentation():
    assert split_rank('[rank1]:   File "x.py", line 3') == (1, '  File "x.py", line 3')
    assert split_rank("no prefix") == (None, "no prefix")


# -- the log-normalising front end (parsers/normalize.py) -------------------------------------

import pytest  # noqa: E402

from tunedeck.core.ingest.parsers.normalize import normalize, rejoin  # noqa: E402

MSG = "RuntimeError: boom"


@pytest.mark.parametrize(
    "line,rank,host",
    [
        (f"[rank3]:{MSG}", 3, None),
        (f"[default 2]:{MSG}", 2, None),
        (f"5: {MSG}", 5, None),
        (f"2024-02-27T21:35:32.106313Z {MSG}", None, None),
        (f"[2024-02-27T21:35:32.106313Z] fa88a9df [rank=6] || {MSG}", 6, None),
        (
            f"[2023-10-13 17:40:02,544] torch.distributed.elastic.multiprocessing.api: [ERROR] {MSG}",
            None,
            None,
        ),
        (f"E0629 00:06:21.246000 140229302286144 torch/distributed/api.py:826] {MSG}", None, None),
        (
            f"18:11:06.680 [rank4]:[E205 18:11:06.375750231 ProcessGroupNCCL.cpp:1870] {MSG}",
            4,
            None,
        ),
        (f"worker-2: [rank9]:{MSG}", 9, "worker-2"),
        (f"trainer-1  | {MSG}", None, "trainer-1"),
        (f"[pod/train-worker-0/pytorch] 2024-05-14T09:12:00.000Z {MSG}", None, "train-worker-0"),
        (f"(RayWorker pid=7046) {MSG}", None, None),
        (f"[trainer0|1]:{MSG}", 1, None),
        (f"[1,7]<stdout>:{MSG}", 7, None),
        (f"[80746] [rank0]:{MSG}", 0, None),
        (f"ERROR 04-15 00:31:11 worker_base.py:574] {MSG}", None, None),
        (f"2024-01-01 10:00:00,123 - trainer - ERROR - {MSG}", None, None),
        (f"\x1b[1;31m{MSG}\x1b[0m", None, None),
        (f"[INFO:swift] {MSG}", None, None),
        (f"WARNING:torch.distributed.elastic.multiprocessing.api:{MSG}", None, None),
    ],
)
def test_normalize_strips_prefixes_and_keeps_who(line, rank, host):
    n = normalize(line)
    assert (n.text, n.rank, n.host) == (MSG, rank, host)


def test_normalize_leaves_messages_and_frames_alone():
    for line in (
        "RuntimeError: CUDA error: out of memory",
        '  File "train.py", line 3, in f',
        "gpu3:77:90 [3] NCCL WARN NET/Socket : Connection closed",
        "  time      : 2024-01-01_10:00:00",
        "[0]:",
        "iter 100 step 50: loss 3.7",
    ):
        assert normalize(line).text == line, line
    boxed = [
        "╭──── Traceback (most recent call last) ────╮",
        "│ /x/train.py:12 in main                    │",
        "╰───────────────────────────╯",
    ]
    assert [normalize(x).text for x in boxed] == [
        "Traceback (most recent call last):",
        "  /x/train.py:12 in main",
        "  ",
    ]


def test_rejoin_glues_terminal_wrapped_lines_only():
    w = 70
    long = (
        "[rank6]:[F429 14:03:49.385461578 ProcessGroupNCCL.cpp:1554] [PG ID 0 Rank 6] "
        "Terminating the process after attempting to dump debug info, due to ProcessGroupNCCL "
        "watchdog hang."
    )
    wrapped = [long[i : i + w] for i in range(0, len(long), w)]
    assert rejoin(wrapped) == [long]
    records = ["{'loss': 1.0000, 'lr': 1e-05, 'epoch': 0.1}"] * 3  # alike lines of one width
    assert rejoin(records, width=len(records[0])) == records
    # torchrun's table: two identical longest lines, each followed by a rule, are no wrap
    table = [
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/errors.html",
        "-" * 60,
        "Root Cause (first observed failure):",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/errors.html",
        "=" * 60,
    ]
    assert rejoin(table) == table


def test_cut_failure_table_without_its_head():
    p = ChildFailedParser()
    lines = [
        "some output",
        "  time      : 2024-01-01_10:00:00",
        "  host      : node-a",
        "  rank      : 3 (local_rank: 3)",
        "  exitcode  : -9 (pid: 123)",
        "  traceback : Signal 9 (SIGKILL) received by PID 123",
        "=" * 40,
        "after",
    ]
    reps = [r for i, ln in enumerate(lines, 1) if (r := p.feed(ln, i)) is not None]
    [fl] = reps[0].failures
    assert (fl.rank, fl.host, fl.exitcode, fl.signal) == (3, "node-a", -9, "SIGKILL")


@pytest.mark.parametrize(
    "line,step,loss",
    [
        (
            " iteration      122/  250000 | consumed samples:       124928 | elapsed time per iteration "
            "(ms): 865.2 | learning rate: 9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 |"
            " loss scale: 1.0 | grad norm: 0.231 |",
            122,
            2.50422,
        ),
        ("steps: 100 loss: 2.3456 iter time (s): 0.512 samples/sec: 15.625", 100, 2.3456),
        (
            "[trainer0|0]:1|55|Loss: 1.0744975805282593:  55%|█▌ | 56/101 [15:19<11:17, 15.06s/it]",
            55,
            1.0744975805282593,
        ),
        ("iter 100 step 50: loss 3.7451, iter time: 187.97ms (optimizer.step)", 50, 3.7451),
        ("Epoch 1 | iter 46 step 1 | loss train: 3.724, val: n/a | iter time: 45.73 ms", 1, 3.724),
        (
            "Epoch 0/9  ━━━━━━━━ 450/1000 0:01:23 • 0:01:42 5.37it/s v_num: 3 train_loss: 2.340",
            450,
            2.34,
        ),
        ("epoch 0 step 10: {'train_loss': 1.23, 'lr': 1e-05}", 10, 1.23),
        ("0: {'loss': '1.5', 'global_step/max_steps': '7/9'}", 7, 1.5),
        (
            " Epoch [2][100/500]\tlr: 1.000e-03, time: 0.539, data_time: 0.051, loss: 1.9091",
            600,
            1.9091,
        ),
        ("mmseg - INFO - Iter [1000/160000]\tlr: 9.9e-03, time: 0.5, loss: 0.7021", 1000, 0.7021),
        (
            "Speed 2178.40 samples/sec   Loss 0.25   LearningRate 0.001   Epoch: 0   Global Step: 20",
            20,
            0.25,
        ),
        ("Ep 1 | iter 4 | stEp 1: loss train (curr): 1.585, val (prev val iter): None", 1, 1.585),
    ],
)
def test_framework_step_lines(line, step, loss):
    fmt, rec = parse_metrics_line(line)
    if fmt == "dict":
        assert rec["loss"] == loss and rec["global_step/max_steps"].startswith(f"{step}/")
    else:
        assert (rec["step"], rec["loss"]) == (step, loss)


def test_lightning_bar_counts_steps_across_epochs():
    fmt, rec = parse_metrics_line(
        "Epoch 1:  45%|████▌     | 450/1000 [01:23<01:42,  5.37it/s, v_num=3, train_loss=2.340]"
    )
    assert fmt == "tqdm" and rec["n"] == 1450 and rec["loss"] == 2.34


def test_a_bar_with_global_step_in_its_postfix_is_a_bar():
    fmt, rec = parse_metrics_line(
        "Epoch 0:   6%|██      | 32040/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6, v_num=95nc, "
        "reduced_train_loss=2.590, global_step=3.2e+4]"
    )
    assert fmt == "tqdm" and rec["n"] == 32040 and rec["loss"] == 2.6
