"""The scanner's chunk-level fast paths (native classifier and pure Python) must see exactly
what the line-by-line path sees."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from tunedeck.core.diagnose.engine import build_findings
from tunedeck.core.diagnose.scan import FileScanner
from tunedeck.core.rundir import Source
from tunedeck.core.ingest.metrics import FileMetrics
from tunedeck.core.ingest.native import fastscan as _fastscan

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "h200" / "recorded"
sys.path.insert(0, str(ROOT / "bench"))


class LineByLine(FileScanner):
    """The reference: every logical line through `_line`, as before the fast path."""

    def poll(self, final: bool = False) -> None:
        metric_lines: list[str] = []
        for lineno, raw in self.tail.logical_lines(final=final):
            self._logical(lineno, raw, metric_lines)
        if metric_lines:
            self.metrics.feed(metric_lines)
        if final:
            for rank in list(self._tb):
                self._tb_finish(rank, self.tail.lineno)


def state(sc: FileScanner) -> dict:
    n = sc.nccl
    return {
        "hits": [(h.rule.category, h.rank, h.lineno, h.text, h.t, h.groups) for h in sc.hits],
        "tb": [(t.rank, t.start, t.end, t.lines) for t in sc.tracebacks],
        "reports": [
            (r.script, r.first_line, r.last_line, r.lines, [f.to_json() for f in r.failures])
            for r in sc.reports
        ],
        "torchrun": sc.torchrun_lines,
        "enqueued": sc.enqueued,
        "nccl_ranks": sc.nccl_ranks,
        "nccl": (
            n.versions,
            n.interfaces,
            n.network,
            list(n.transports.items()),
            n.nranks,
            n.nnodes,
            n.channels,
            n.ib_missing,
            n.ib_devices,
            n.warnings,
            n.lines,
        ),
        "metrics": repr(sc.metrics.records()),
        "lineno": sc.tail.lineno,
        "findings": [f.to_json() for f in build_findings([sc])],
    }


def mixed_log(rng: random.Random, n: int) -> str:
    import ingest_bench

    nccl = ingest_bench.nccl_text(n, rng).splitlines()
    extra = [
        "gpu-node-07:800:800 [0] NCCL WARN NET/Socket : Connection closed by remote peer",
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1",
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "    main()",
        "RuntimeError: boom",
        "",
        "[rank0]:[E1130 09:44:07.868464 ProcessGroupNCCL.cpp:1] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000)",
        "[rank1]: last enqueued NCCL work: 7",
        "=" * 60,
        "train.py FAILED",
        "-" * 60,
        "Failures:",
        "[0]:",
        "  time      : 2026-11-30_09:43:33",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -9 (pid: 1333)",
        "  error_file: <N/A>",
        "=" * 60,
        "Train:  12%|██        | 12/100 [00:03<00:22,  3.90it/s]\r{'loss': '1.5', 'grad_norm':"
        " '0.3', 'learning_rate': '1e-05', 'epoch': '0.1'}",
        "{'loss': 1.25, 'learning_rate': 2e-05,",
        " 'epoch': 0.2}",
        "step: 5  loss:  7.12  memory: 30.1GiB(31.7%)  tps: 4,120",
        "2026-11-30 09:40:00,123 - INFO - started",
        "W1130 09:40:13.281000 761 run.py:851] hi",
        "[rank0]:gpu-node-07:800:800 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct",
        "gpu-node-07:800:800 [0] NCCL INFO NET/IB : No device found.",
        "gpu-node-07:80:80 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/IPC",
        "some text via a proxy",
        "NCCL INFO mentioned in passing",
        "naïve ünïcode line ١٢:٣٤:٥٦",
        "Sending process 1333 closing signal SIGTERM",
        # what the native classifier must get right or hand to Python
        "gpu-node-07:801:801 [1] NCCL INFO Channel 02/0 : 1[1] -> 0[0] [send] via NET/IB/0/GDRDMA",
        "gpu-node-07:801:801 [1] NCCL INFO Channel 03/0 : 1[1] -> 0[0] via SHM/direct/direct",
        "gpu-node-07:801:801 [1] NCCL INFO Channel 04/0 : 1[1] -> 0[0] via " + "X" * 40,
        "gpu-node-07:801:801 [1] NCCL INFO Channel 05/0 : 1[1] -> 0[0] via P2P via P2P",
        "gpu-node-07:801:801 [1] NCCL INFO Channel 06/0 : 1[x] -> 0[0] via P2P/IPC",
        "gpu-node-07:801:801 [1] NCCL INFO Using network IB",
        "gpu-node-07:801:801 [1] NCCL INFO Bootstrap : Using ib0:10.0.0.2<0>",
        "gpu-node-07:801:801 [1] NCCL INFO comm 0x99 rank 1 nRanks 16 nNodes 2 localRanks 8",
        "gpu-node-07:801:801 [1] NCCL INFO NCCL version 2.27.3+cuda12.9",
        "gpu-node-07:801:801 [1] NCCL INFO threadThresholds 8/8/64 | 16/8/64 | 512 | 512",
        "gpu-node-07:801:801 [1] NCCL INFO init at 2026-11-30 09:41:02 done",
        "the comm 0x12 handle and NET/ are mentioned outside NCCL lines",
        "E1130 09:41:07.000000 77 x.py:1] plain error line with a time",
        "elapsed 00:12:34 is no time stamp",
        "ok 99:99:99 neither",
        "Setting OMP_NUM_THREADS environment variable for each process to be 1",
    ]
    for _ in range(n // 20):
        at = rng.randrange(len(nccl))
        k = rng.randrange(len(extra))
        nccl[at:at] = extra[k : k + rng.randrange(1, 6)]
    return "\n".join(nccl) + "\n"


class PurePython(FileScanner):
    native = False


# the native path where it was built (a machine without a C compiler has only pure Python)
FAST = [PurePython] + ([FileScanner] if _fastscan is not None else [])


def _run(cls, path: Path, cuts: list[int]) -> FileScanner:
    data = path.read_bytes()
    live = path.with_suffix(".live")
    live.write_bytes(b"")
    sc = cls(Source(live, rank=None))
    prev = 0
    for c in [*cuts, len(data)]:
        with open(live, "ab") as f:
            f.write(data[prev:c])
        prev = c
        sc.poll(final=c == len(data))
    return sc


@pytest.mark.parametrize("fast_cls", FAST, ids=lambda c: c.__name__)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fast_path_matches_line_by_line_on_mixed_logs(tmp_path, seed, fast_cls):
    rng = random.Random(seed)
    p = tmp_path / "mixed.log"
    p.write_text(mixed_log(rng, 3000))
    size = p.stat().st_size
    cuts = sorted(rng.randrange(size) for _ in range(7))
    fast, ref = _run(fast_cls, p, cuts), _run(LineByLine, p, cuts)
    assert ref.hits and ref.tracebacks and ref.reports and ref.nccl.transports
    assert state(fast) == state(ref)


@pytest.mark.parametrize("fast_cls", FAST, ids=lambda c: c.__name__)
def test_fast_path_matches_line_by_line_on_h200_fixtures(tmp_path, fast_cls):
    # the shared H200 logs where they are beside the repo, and the repo's own recordings
    roots = [r for r in (FIXTURES, ROOT / "tests" / "fixtures") if r.is_dir()]
    logs = sorted(
        p for r in roots for p in r.rglob("*") if p.is_file() and p.suffix in (".log", ".txt")
    )
    assert logs
    for i, p in enumerate(logs):
        dst = tmp_path / f"{i}-{p.name}"
        dst.write_bytes(p.read_bytes())
        cut = [dst.stat().st_size // 2]
        assert state(_run(fast_cls, dst, cut)) == state(_run(LineByLine, dst, cut)), p


@pytest.mark.skipif(_fastscan is None, reason="native scanner not built (no C compiler)")
def test_native_matcher_rejects_tokens_it_cannot_find():
    with pytest.raises(ValueError, match="at least"):
        _fastscan.matcher([b"ab"], [])
    m = _fastscan.matcher([b"|", b"boom"], [b"NCCL version"])
    with pytest.raises(ValueError, match="outside"):
        _fastscan.classify(m, b"x\n", 0, 5)
    data = b"a\nb 12:00:00\nc boom\nd\n"
    stop, lines, heads, transports, facts, hint, other = _fastscan.classify(m, data, 0, len(data))
    assert (data[stop:], lines, heads, transports, facts, other) == (
        b"c boom\nd\n",
        2,
        0,
        {},
        [],
        1,
    )
    assert data[hint:].startswith(b"b 12:00:00")


# -- metrics: the native dict reader against the pure-Python parser ---------------------------

# lines the native reader must hand to Python, or read exactly as Python does
ODD_LINES = (
    "{{'loss': None, 'step': {step}}}",
    "{{'loss': 1.0, 'step': {step}, 'note': \"it's\"}}",
    "{{'loss': 1.0, 'step': {step}, 'tags': [1, 2]}}",
    "",  # k == 17: OTHER_LINES
    "{{'loss': 'x: None', 'step': {step}}}",
    "{{'loss': -3, 'steps': {step}, 'loss': '2'}}",
    '{{"kind": "step", "step": {step}, "loss": 1.5, "rank": 0}}',
    "{{'loss': '0.25', 'global_step/max_steps': '{step}/'}}",
    "{{'loss': 1, 'step': {step}, 'x': 'é'}}",
    "Train: 1%|x| 0/0 [00:01<00:02]\r{{'loss': 0.5, 'step': {step}}}",
)
OTHER_LINES = (
    "",
    "some log line",
    "  ",
    "{}",
    "{'a': 1}",
    "{'train_runtime': '3.2', 'global_step/max_steps': '5/5'}",
    "step: 5  loss:  7.12  memory: 30.1GiB(31.7%)  tps: 4,120",
)


def metric_log(rng: random.Random, n: int, restarts: bool = True) -> str:
    """Console output mixing every metrics shape the parser knows, and the odd ones."""
    out, step = [], 0
    for _ in range(n):
        k = rng.randrange(24)
        if k == 9 and not restarts:
            k = 0  # a step taken from the bar repeats a kept step: that merges too
        # restarts repeat steps; without them the native batches are kept as columns
        step += 1 if not restarts or rng.random() < 0.9 else -rng.randrange(0, 4)
        step = max(step, 1)
        bar = f"Train: {step % 100:3d}%|██▌  | {step}/{500} [00:03<00:22,  {rng.random():.2f}it/s]"
        loss = rng.choice(
            [
                f"'{rng.random() * 5:.4g}'",
                f"{rng.random() * 5:.4g}",
                "'nan'",
                "'12'",
                "3",
                "'-0.5'",
                "'1e-3'",
                "'inf'",
                "2.5e-07",
            ]
        )
        if k < 8:
            d = (
                f"{{'loss': {loss}, 'grad_norm': '1.5', 'learning_rate': '9e-05', "
                f"'epoch': '{step / 100:.3g}', 'global_step/max_steps': '{step}/500', "
                f"'train_speed(s/it)': '0.25', 'elapsed_time': '1h 2m'}}"
            )
            out.append(
                rng.choice(
                    [
                        d,
                        bar + "\r" + d,
                        bar + "\r" + d + "\r" + bar,
                        bar + "\r" + bar + "\r" + d,
                        " " + d,
                        d + " ",
                    ]
                )
            )
        elif k == 8:
            out.append(
                json.dumps(
                    {
                        "loss": rng.random(),
                        "learning_rate": 1e-5,
                        "epoch": 1,
                        "global_step/max_steps": f"{step}/500",
                        "train_speed(iter/s)": rng.choice([4, 0.5, 0]),
                    }
                )
            )
        elif k == 9:  # HF Trainer: no step, taken from the bar or counted
            out.append(
                f"{{'loss': {loss}, 'grad_norm': 0.7, 'learning_rate': 2e-05, 'epoch': 0.{step}}}"
            )
        elif k == 10:
            out.append(bar)
        elif k == 11:  # hard-wrapped
            out += [f"{{'loss': {loss}, 'learning_rate': 2e-05,", f" 'step': {step}}}"]
        elif k == 12:
            out.append(
                f"{{'eval_loss': '{rng.random():.3f}', 'global_step/max_steps': "
                f"'{step}/500', 'epoch': '1'}}"
            )
        elif k == 13:  # max_steps only from the fraction, step from a key; iter/s alone
            out.append(
                f"{{'iteration': ' /{500}', 'step': {step}.0, 'lr': 1e-4, "
                f"'train_speed(iter/s)': '2'}}"
            )
        elif k == 17:
            out.append(rng.choice(OTHER_LINES))
        else:
            out.append(ODD_LINES[k - 14].format(step=step))
    return "\n".join(out) + "\n"


class PurePythonMetrics(FileMetrics):
    native = False


@pytest.mark.skipif(_fastscan is None, reason="native scanner not built (no C compiler)")
@pytest.mark.parametrize("seed", range(6))
def test_native_metrics_match_python(tmp_path, seed):
    rng = random.Random(seed)
    data = metric_log(rng, 1500, restarts=seed % 2 == 0).encode()
    cuts = sorted(rng.randrange(len(data)) for _ in range(6))
    rank = rng.choice([None, 3])
    seen = {}
    for cls in (FileMetrics, PurePythonMetrics):
        live = tmp_path / f"{cls.__name__}.log"
        live.write_bytes(b"")
        fm, polls, prev = cls(live, rank=rank), [], 0
        for c in [*cuts, len(data)]:
            with open(live, "ab") as f:
                f.write(data[prev:c])
            prev = c
            polls.append(repr(list(fm.poll(final=c == len(data)))))
        seen[cls] = (polls, repr(fm.records()), fm.parser.max_steps, fm.parser.bar_step)
        if cls is FileMetrics and seed % 2:
            assert fm.parser.batches  # the columnar path was taken
    assert seen[FileMetrics] == seen[PurePythonMetrics]
    assert len(FileMetrics(tmp_path / "FileMetrics.log").records()) == 0  # nothing polled yet


def test_native_scanner_is_built_where_it_can_be():
    """The build of the extension is optional (no compiler: pure Python). Where a compiler and
    Python's headers exist it must have been built; a silent build failure would otherwise
    leave a slow tunedeck and these equivalence tests half-run."""
    import shutil
    import sysconfig

    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not (shutil.which("cc") or shutil.which("gcc")) or not headers.is_file():
        pytest.skip("no C compiler or no Python headers here: the pure-Python path is used")
    assert _fastscan is not None, "core/ingest/_fastscan.c did not build: pip install -e . -v"


@pytest.mark.skipif(_fastscan is None, reason="native scanner not built (no C compiler)")
def test_native_metrics_match_python_on_recorded_logs():
    logs = [
        p
        for root in (ROOT / "tests" / "fixtures", FIXTURES)
        if root.is_dir()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in (".log", ".jsonl")
    ]
    assert logs
    for p in logs:
        native, python = FileMetrics(p), PurePythonMetrics(p)
        assert repr(list(native.poll(final=True))) == repr(list(python.poll(final=True))), p
        assert repr(native.records()) == repr(python.records()), p
