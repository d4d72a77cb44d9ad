"""NCCL's own log lines (`NCCL_DEBUG=INFO`): `host:pid:tid [dev] NCCL INFO|WARN message`, and
the PyTorch lines about NCCL (ProcessGroupNCCL errors, the watchdog's last enqueued work).

This module is the one place that parses them (tests/test_nccl_parser.py checks that no other
module under core/ or tui/ compiles a regex naming NCCL). `parse_nccl` turns one line into an
`NcclLine` (host, pid, rank's device, level, message, and the fields of its kind); the
diagnosis' `NcclSummary` (below) and the monitor's `core/views/nccl.py` `NcclReader` fold those
records. `INFO_HEAD_BYTES` / `CHANNEL_VIA_BYTES` are the same line head and channel patterns
compiled for bytes, so the diagnosis scanner can count plain INFO lines and their transports in
bulk; `FACT_TOKENS` are the literals of the INFO lines that carry a fact for `NcclSummary`.

`NcclSummary` folds a run's lines into what a user wants to know: NCCL version per process, the
transport actually chosen between GPUs (P2P/NVLink, SHM, Socket, IB, NVLS), network interface,
channels, ranks and nodes, and the warnings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# -- the patterns, each written once -----------------------------------------------------------
# `host:pid:tid [dev] NCCL `: the head of every line NCCL prints
_HEAD = r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL "
# `Channel 03/0 : 0[0] -> 1[1] [send] via P2P/CUMEM`: how a rank reaches a peer on a channel
_CHANNEL = (
    r"Channel (?P<channel>\d+)/\d+ : (?P<src>\d+)\[[\w.]+\] -> (?P<dst>\d+)\[[\w.]+\]"
    r"(?: \[(?P<tag>\w+)\])? via (?P<via>\S+)"
)


def _groups(pattern: str, keep: tuple[str, ...] = ()) -> str:
    """`pattern` with its named groups made non-capturing, but for those in `keep`."""
    return re.sub(r"\(\?P<(\w+)>", lambda m: "(" if m[1] in keep else "(?:", pattern)


_LINE = re.compile(_HEAD + r"(?P<level>INFO|WARN|ERROR|TRACE) (?P<msg>.*)")
_VIA = re.compile(_CHANNEL)
_VERSION = re.compile(r"NCCL version (\S+)")
_BOOTSTRAP = re.compile(r"Bootstrap ?: Using (\w[\w.-]*):")
_NET_SOCKET = re.compile(r"NET/Socket ?: Using \[\d+\](\w[\w.-]*):")
_NET_IB = re.compile(r"NET/IB ?: Using \[\d+\]([\w.-]+:\d+/\w+)")
_NETWORK = re.compile(r"Using network (\S+)")
_COMM = re.compile(r"comm 0x[0-9a-f]+ rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+)")
_NCHANNELS = re.compile(r"(\d+) coll channels")
_P2P_CHANNELS = re.compile(r"(\d+) p2p channels per peer")
_GDR = re.compile(r"Connected all rings.* GDR (\d)")
# PyTorch's side: glog error lines of ProcessGroupNCCL ("[rank0]:[E1130 13:05:52...]"),
# NCCL result codes named in any line, the watchdog's `Last enqueued NCCL work: 5`
_TORCH_ERROR = re.compile(r"(?:^|\]:)\[?E\d{4} [\d:.]+ .*NCCL")
_NCCL_CODE = re.compile(
    r"\bnccl(?:Internal|System|UnhandledCuda|Remote|InvalidUsage|"
    r"InvalidArgument)Error\b|NCCL error"
)
_LAST_ENQ = re.compile(r"[Ll]ast enqueued (?:NCCL )?work: (\d+)")

# for the diagnosis scanner's bulk path: a plain `host:pid:tid [dev] NCCL INFO` line (at most
# one per line: anchored at its start), and the transport (`via ...`) of a channel line
INFO_HEAD_BYTES = re.compile(("(?m)^" + _groups(_HEAD) + "INFO ").encode())
CHANNEL_VIA_BYTES = re.compile(("NCCL INFO " + _groups(_CHANNEL, keep=("via",))).encode())
# literals of the NCCL INFO lines that carry a fact for NcclSummary (parse_nccl's kinds); the
# native scanner hands such lines to Python in a batch instead of stopping at each one
FACT_TOKENS: tuple[bytes, ...] = (
    b"NCCL version",
    b"Bootstrap",
    b"NET/",
    b"Using network",
    b"coll channels",
    b"comm 0x",
)


@dataclass(slots=True)
class NcclLine:
    """One NCCL line. `kind` says which of the optional fields are set:

    warn (any level but INFO), transport (channel, src, dst, tag, via, transport), version,
    bootstrap / socket (interface), ib (device), ib_none, network, channels (channels,
    p2p_channels), comm (rank, nranks, nnodes, local_ranks), gdr, other.
    """

    host: str
    pid: int
    tid: int
    dev: int
    level: str  # INFO, WARN, ERROR, TRACE
    msg: str
    kind: str = "other"
    version: str | None = None
    interface: str | None = None
    device: str | None = None  # an IB device: mlx5_0:1/IB
    network: str | None = None  # Socket, IB, ...
    channel: int | None = None
    src: int | None = None
    dst: int | None = None
    tag: str | None = None  # send / recv, when NCCL wrote one
    via: str | None = None  # as NCCL wrote it: P2P/CUMEM, SHM/direct/direct, NET/IB/0
    transport: str | None = None  # transport_name(via)
    rank: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    channels: int | None = None  # coll channels
    p2p_channels: int | None = None  # p2p channels per peer
    gdr: bool | None = None


def parse_nccl(line: str) -> NcclLine | None:
    """The NCCL line in `line` (a rank prefix before it is allowed), else None."""
    if "NCCL" not in line:
        return None
    m = _LINE.search(line)
    if not m:
        return None
    msg = m["msg"].rstrip()
    out = NcclLine(m["host"], int(m["pid"]), int(m["tid"]), int(m["dev"]), m["level"], msg)
    if out.level != "INFO":
        out.kind = "warn"
        return out
    if " via " in msg:
        v = _VIA.search(msg)
        if v:
            out.kind = "transport"
            out.channel, out.src, out.dst = int(v["channel"]), int(v["src"]), int(v["dst"])
            out.tag, out.via, out.transport = v["tag"], v["via"], transport_name(v["via"])
        return out
    for kind, rx, key in (
        ("version", _VERSION, "version"),
        ("bootstrap", _BOOTSTRAP, "interface"),
        ("socket", _NET_SOCKET, "interface"),
        ("ib", _NET_IB, "device"),
        ("network", _NETWORK, "network"),
        ("channels", _NCHANNELS, "channels"),
    ):
        v = rx.search(msg)
        if v:
            out.kind = kind
            setattr(out, key, int(v[1]) if key == "channels" else v[1])
            if kind == "channels" and (p := _P2P_CHANNELS.search(msg)) is not None:
                out.p2p_channels = int(p[1])
            return out
    v = _COMM.search(msg)
    if v:
        out.kind = "comm"
        out.rank, out.nranks, out.nnodes, out.local_ranks = map(int, v.groups())
    elif "NET/IB" in msg and "No device found" in msg:
        out.kind = "ib_none"
    elif "GDR" in msg and (v := _GDR.search(msg)) is not None:
        out.kind, out.gdr = "gdr", v[1] == "1"
    return out


def transport_name(via: str) -> str:
    """`P2P/CUMEM` → P2P, `NET/IB/0/GDRDMA` → IB, `NET/Socket/0` → Socket, `SHM/direct` → SHM."""
    head = via.split("/")
    if head[0] == "NET" and len(head) > 1:
        return head[1]
    return head[0]


def torch_nccl_error(line: str) -> bool:
    """A PyTorch line (not NCCL's own) that reports an NCCL failure: a ProcessGroupNCCL glog
    error line, or one naming an NCCL result code. C++ stack frames (`frame #3: ...`) name
    ProcessGroupNCCL on every line and are not errors of their own."""
    if line.lstrip().startswith("frame #"):
        return False
    return _TORCH_ERROR.search(line) is not None or _NCCL_CODE.search(line) is not None


def last_enqueued_work(line: str) -> int | None:
    """The sequence number of the watchdog's `Last enqueued NCCL work: N`, if the line says it."""
    m = _LAST_ENQ.search(line)
    return int(m[1]) if m else None


@dataclass
class NcclSummary:
    versions: dict[int, str] = field(default_factory=dict)  # pid → version
    interfaces: set[str] = field(default_factory=set)
    network: str | None = None
    transports: dict[str, int] = field(default_factory=dict)  # name → channel links seen
    nranks: int | None = None
    nnodes: int | None = None
    channels: int | None = None
    ib_missing: bool = False
    ib_devices: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)
    lines: int = 0
    hosts: set[str] = field(default_factory=set)  # hosts that printed NCCL lines

    def add(self, rec: NcclLine, count: bool = True) -> None:
        self.lines += count
        kind = rec.kind
        if len(self.hosts) < 64:
            self.hosts.add(rec.host)
        if kind == "transport":
            self.transports[rec.transport] = self.transports.get(rec.transport, 0) + 1
        elif kind == "version":
            self.versions[rec.pid] = rec.version
        elif kind in ("bootstrap", "socket"):
            self.interfaces.add(rec.interface)
        elif kind == "network":
            self.network = rec.network
        elif kind == "comm":
            self.nranks = max(self.nranks or 0, rec.nranks)
            self.nnodes = max(self.nnodes or 0, rec.nnodes)
        elif kind == "channels":
            self.channels = max(self.channels or 0, rec.channels)
        elif kind == "ib_none":
            self.ib_missing = True
        elif kind == "ib":
            self.ib_devices.add(rec.device)
        elif kind == "warn" and len(self.warnings) < 50:
            self.warnings.append(rec.msg)

    def merge(self, n: "NcclSummary") -> None:
        """Fold another file's summary into this one (the first network seen wins)."""
        self.versions.update(n.versions)
        self.interfaces |= n.interfaces
        self.network = self.network or n.network
        for k, v in n.transports.items():
            self.transports[k] = self.transports.get(k, 0) + v
        self.nranks = max(self.nranks or 0, n.nranks or 0) or None
        self.nnodes = max(self.nnodes or 0, n.nnodes or 0) or None
        self.channels = max(self.channels or 0, n.channels or 0) or None
        self.ib_missing |= n.ib_missing
        self.ib_devices |= n.ib_devices
        self.hosts |= n.hosts

    def describe(self) -> str:
        parts = []
        if self.versions:
            parts.append("NCCL " + "/".join(sorted(set(self.versions.values()))))
        if self.transports:
            parts.append("transport " + ", ".join(sorted(self.transports)))
        if self.network:
            parts.append(f"network {self.network}")
        if self.interfaces:
            parts.append("interface " + ", ".join(sorted(self.interfaces)))
        if self.nranks:
            parts.append(f"{self.nranks} ranks on {self.nnodes} node(s)")
        if self.channels:
            parts.append(f"{self.channels} channels")
        return "; ".join(parts)
