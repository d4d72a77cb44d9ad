"""Per-rank NCCL facts for live views, read from the rank logs incrementally.

With `NCCL_DEBUG=INFO` each rank's log says which NCCL it loaded, which network and
interface it bootstrapped on, how many channels it built, and how it reaches each peer
(`Channel 03/0 : 0[0] -> 1[1] via P2P/CUMEM`). `NcclReader.poll()` reads only what each
rank's newest-attempt stdout/stderr gained since the last poll (byte offsets, at most
`max_bytes` a file a poll, so a week of logs is caught up over a few polls), looks only at
lines that contain `NCCL` (one byte search a chunk skips the rest), and keeps a `RankNccl`
per rank. Warnings and errors are kept with their file and line: NCCL's own `WARN`/`ERROR`
lines and PyTorch's ProcessGroupNCCL error lines (watchdog timeouts, `ncclXxxError`).

A peer is the other end of a connection as NCCL numbers it inside the communicator; for
the default process group that is the global rank. A new torchrun attempt starts a fresh
summary for the rank (NCCL initialises again).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from tunedeck.core.ingest.parsers.nccl import parse_nccl, torch_nccl_error
from tunedeck.core.ingest.tail import Tail
from tunedeck.core.rundir import RunDir

MAX_ISSUES = 200  # per rank: a flood of identical warnings says no more than 200 do


@dataclass
class Peer:
    peer: int
    transport: str  # P2P, SHM, Socket, IB, NVLS, ... (transport_name)
    via: str  # as NCCL wrote it: P2P/CUMEM, SHM/direct/direct, NET/IB/0
    channels: set[int] = field(default_factory=set)


@dataclass
class NcclIssue:
    level: str  # WARN or ERROR
    text: str
    file: str  # stdout.log / stderr.log
    line: int


@dataclass
class RankNccl:
    rank: int
    host: str | None = None
    pid: int | None = None
    version: str | None = None
    network: str | None = None  # Socket, IB, ...
    interfaces: list[str] = field(default_factory=list)
    ib_devices: list[str] = field(default_factory=list)
    ib_missing: bool = False
    nranks: int | None = None
    nnodes: int | None = None
    coll_channels: int | None = None
    p2p_channels: int | None = None
    gdr: bool | None = None
    peers: dict[int, Peer] = field(default_factory=dict)
    issues: list[NcclIssue] = field(default_factory=list)
    nccl_lines: int = 0
    attempt_files: list[str] = field(default_factory=list)
    bytes_read: int = 0
    bytes_total: int = 0

    @property
    def errors(self) -> int:
        return sum(1 for i in self.issues if i.level == "ERROR")

    @property
    def caught_up(self) -> bool:
        return self.bytes_read >= self.bytes_total


class _RankState:
    def __init__(self, rank: int, files: list[Path]):
        self.info = RankNccl(rank, attempt_files=[str(p) for p in files])
        self.tails = [Tail(p) for p in files]


class NcclReader:
    """Incremental per-rank NCCL summaries of one run (see the module doc)."""

    def __init__(self, run: RunDir | str | Path):
        self.run = run if isinstance(run, RunDir) else RunDir(run)
        self._ranks: dict[int, _RankState] = {}

    def poll(self, max_bytes: int = 32 << 20) -> bool:
        """Read what the rank logs gained; True when any summary changed."""
        changed = False
        ranks = sorted(
            {
                s.rank
                for s in self.run.rank_logs(latest_only=True)
                if s.rank is not None and s.kind == "log"
            }
        )
        for rank in ranks:
            files = self.run.rank_log_files(rank)
            st = self._ranks.get(rank)
            if st is None or st.info.attempt_files != [str(p) for p in files]:
                st = self._ranks[rank] = _RankState(rank, files)  # a new attempt
                changed = True
            for tail in st.tails:
                changed |= self._read(st.info, tail, max_bytes)
            total = 0
            for tail in st.tails:
                try:
                    total += tail.path.stat().st_size
                except OSError:
                    pass
            st.info.bytes_read = sum(t.offset for t in st.tails)
            st.info.bytes_total = max(total, st.info.bytes_read)
        return changed

    def summaries(self) -> list[RankNccl]:
        """A copy per rank, safe to hand to another thread."""
        return [copy.deepcopy(self._ranks[r].info) for r in sorted(self._ranks)]

    def summary(self, rank: int) -> RankNccl | None:
        st = self._ranks.get(rank)
        return copy.deepcopy(st.info) if st else None

    # -- reading -----------------------------------------------------------------------
    def _read(self, info: RankNccl, tail: Tail, max_bytes: int) -> bool:
        changed = False
        name = tail.path.name
        for base, chunk in tail.chunks(max_bytes=max_bytes):
            at = chunk.find(b"NCCL")
            line_no, counted_to = base, 0
            while at >= 0:
                start = chunk.rfind(b"\n", 0, at) + 1
                end = chunk.find(b"\n", at)
                line_no += chunk.count(b"\n", counted_to, start)
                counted_to = start
                text = chunk[start:end].decode("utf-8", errors="replace").rstrip("\r")
                changed |= self._line(info, text, name, line_no + 1)
                at = chunk.find(b"NCCL", end)
        return changed

    def _line(self, info: RankNccl, text: str, file: str, line: int) -> bool:
        rec = parse_nccl(text)
        if rec is None:
            if torch_nccl_error(text):
                return self._issue(info, "ERROR", text, file, line)
            return False
        info.nccl_lines += 1
        info.host = info.host or rec.host
        info.pid = info.pid or rec.pid
        kind = rec.kind
        if kind == "warn":
            return self._issue(info, "WARN" if rec.level == "WARN" else "ERROR", text, file, line)
        if kind == "transport":
            src, dst, via = rec.src, rec.dst, rec.via
            me = info.rank
            peer = dst if src == me else src if dst == me else dst
            p = info.peers.get(peer)
            if p is None or p.via != via:
                p = info.peers[peer] = Peer(peer, rec.transport, via, p.channels if p else set())
            p.channels.add(rec.channel)
            return True
        if kind == "version":
            info.version = rec.version
        elif kind in ("bootstrap", "socket"):
            if rec.interface not in info.interfaces:
                info.interfaces.append(rec.interface)
        elif kind == "network":
            info.network = rec.network
        elif kind == "ib":
            if rec.device not in info.ib_devices:
                info.ib_devices.append(rec.device)
        elif kind == "ib_none":
            info.ib_missing = True
        elif kind == "comm":
            info.nranks, info.nnodes = rec.nranks, rec.nnodes
        elif kind == "channels":
            info.coll_channels = rec.channels
            if rec.p2p_channels is not None:
                info.p2p_channels = rec.p2p_channels
        elif kind == "gdr":
            info.gdr = rec.gdr
        else:
            return False
        return True

    @staticmethod
    def _issue(info: RankNccl, level: str, text: str, file: str, line: int) -> bool:
        if len(info.issues) >= MAX_ISSUES:
            return False
        info.issues.append(NcclIssue(level, text.strip(), file, line))
        return True
