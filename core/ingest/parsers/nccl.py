"""NCCL debug lines (`NCCL_DEBUG=INFO`): `host:pid:tid [dev] NCCL INFO|WARN message`.

`parse_nccl` turns one line into {host, pid, dev, level, msg, kind, ...}; `NcclSummary`
folds a run's lines into what a user wants to know: NCCL version per process, the transport
actually chosen between GPUs (P2P/NVLink, SHM, Socket, IB, NVLS), network interface, channels,
ranks and nodes, and the warnings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_LINE = re.compile(
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"NCCL (?P<level>INFO|WARN|ERROR|TRACE) (?P<msg>.*)"
)
_VERSION = re.compile(r"NCCL version (\S+)")
_BOOTSTRAP = re.compile(r"Bootstrap ?: Using (\w[\w.-]*):")
_NET_SOCKET = re.compile(r"NET/Socket ?: Using \[\d+\](\w[\w.-]*):")
_NET_IB = re.compile(r"NET/IB ?: Using \[\d+\]([\w.-]+:\d+/\w+)")
_NETWORK = re.compile(r"Using network (\S+)")
_COMM = re.compile(r"comm 0x[0-9a-f]+ rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+)")
_VIA = re.compile(r"Channel \d+/\d+ : (\d+)\[[\w.]+\] -> (\d+)\[[\w.]+\](?: \[\w+\])? via (\S+)")
_NCHANNELS = re.compile(r"(\d+) coll channels")


def parse_nccl(line: str) -> dict[str, Any] | None:
    if "NCCL" not in line:
        return None
    m = _LINE.search(line)
    if not m:
        return None
    msg = m["msg"].rstrip()
    out: dict[str, Any] = {
        "host": m["host"],
        "pid": int(m["pid"]),
        "dev": int(m["dev"]),
        "level": m["level"],
        "msg": msg,
        "kind": "other",
    }
    if m["level"] != "INFO":
        out["kind"] = "warn"
        return out
    if " via " in msg:
        v = _VIA.search(msg)
        if v:
            out.update(
                kind="transport", src=int(v[1]), dst=int(v[2]), transport=transport_name(v[3])
            )
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
            out["kind"] = kind
            out[key] = int(v[1]) if key == "channels" else v[1]
            return out
    v = _COMM.search(msg)
    if v:
        out.update(
            kind="comm", rank=int(v[1]), nranks=int(v[2]), nnodes=int(v[3]), local_ranks=int(v[4])
        )
    elif "NET/IB" in msg and "No device found" in msg:
        out["kind"] = "ib_none"
    return out


def transport_name(via: str) -> str:
    """`P2P/CUMEM` → P2P, `NET/IB/0/GDRDMA` → IB, `NET/Socket/0` → Socket, `SHM/direct` → SHM."""
    head = via.split("/")
    if head[0] == "NET" and len(head) > 1:
        return head[1]
    return head[0]


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

    def add(self, rec: dict[str, Any], count: bool = True) -> None:
        self.lines += count
        kind = rec["kind"]
        if len(self.hosts) < 64:
            self.hosts.add(rec["host"])
        if kind == "transport":
            self.transports[rec["transport"]] = self.transports.get(rec["transport"], 0) + 1
        elif kind == "version":
            self.versions[rec["pid"]] = rec["version"]
        elif kind in ("bootstrap", "socket"):
            self.interfaces.add(rec["interface"])
        elif kind == "network":
            self.network = rec["network"]
        elif kind == "comm":
            self.nranks = max(self.nranks or 0, rec["nranks"])
            self.nnodes = max(self.nnodes or 0, rec["nnodes"])
        elif kind == "channels":
            self.channels = max(self.channels or 0, rec["channels"])
        elif kind == "ib_none":
            self.ib_missing = True
        elif kind == "ib":
            self.ib_devices.add(rec["device"])
        elif kind == "warn" and len(self.warnings) < 50:
            self.warnings.append(rec["msg"])

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
