"""What NVML says about this machine's GPUs: names, memory, compute capability, driver and
topology (`probe_gpus`), for the launcher (`list_gpus`, `visible_gpu_count`) and preflight's
GPU checks. NVML is reached only through `nvml_session`, so a missing library or driver, or
any NVMLError, means "no usable GPU" with a reason, never a crash. `lib` may be any object
with pynvml's interface (core/telemetry/fake.py for CI).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tunedeck.core.telemetry.nvml import NvmlUnavailable, as_text, nvml_session


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_total_gib: float
    cc: tuple[int, int] = (0, 0)  # compute capability
    numa: int = -1


GpuInfo = Gpu  # the launcher's name for it


@dataclass
class GpuFacts:
    gpus: list[Gpu] = field(default_factory=list)
    driver: str = ""
    cuda_driver: tuple[int, int] | None = None  # newest CUDA the driver supports
    error: str = ""  # why NVML gave nothing
    # (i, j) -> (link, p2p_ok): link is "NVLink", "PCIe switch", "PCIe host bridge",
    # "across CPU sockets", ...
    links: dict[tuple[int, int], tuple[str, bool]] = field(default_factory=dict)


# nvmlDeviceGetTopologyCommonAncestor levels (NVML_TOPOLOGY_*)
_TOPO = {
    0: "same board",
    10: "PCIe switch",
    20: "PCIe switches",
    30: "PCIe host bridge",
    40: "PCIe/CPU (same socket)",
    50: "across CPU sockets",
}
_MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS


def probe_gpus(lib: Any = None, *, topology: bool = True) -> GpuFacts:
    """Every GPU NVML sees (ignores CUDA_VISIBLE_DEVICES). Optional queries degrade: compute
    capability (0, 0), link "unknown", P2P assumed ok. `topology=False` skips the per-pair
    link and P2P queries (O(n²) calls) where only the GPU list is wanted."""
    try:
        with nvml_session(lib) as nv:
            facts = GpuFacts(driver=as_text(nv.nvmlSystemGetDriverVersion()))
            try:
                v = nv.nvmlSystemGetCudaDriverVersion()
                facts.cuda_driver = (v // 1000, (v % 1000) // 10)
            except nv.NVMLError:
                pass
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
            facts.gpus = [_gpu(nv, i, h) for i, h in enumerate(handles)]
            if topology:
                for i, hi in enumerate(handles):
                    for j in range(i + 1, len(handles)):
                        facts.links[(i, j)] = _link(nv, hi, handles[j])
            return facts
    except NvmlUnavailable as e:
        return GpuFacts(error=e.reason)


def _gpu(nv: Any, i: int, h: Any) -> Gpu:
    mem = nv.nvmlDeviceGetMemoryInfo(h).total / 2**30
    try:
        cc = tuple(nv.nvmlDeviceGetCudaComputeCapability(h))
    except nv.NVMLError:
        cc = (0, 0)
    return Gpu(i, as_text(nv.nvmlDeviceGetName(h)), round(mem, 1), cc)


def _link(nv: Any, hi: Any, hj: Any) -> tuple[str, bool]:
    link = "unknown"
    try:
        nvlink = any(nv.nvmlDeviceGetNvLinkState(hi, k) == 1 for k in range(_MAX_NVLINKS))
    except nv.NVMLError:
        nvlink = False
    if nvlink:
        link = "NVLink"
    else:
        try:
            link = _TOPO.get(nv.nvmlDeviceGetTopologyCommonAncestor(hi, hj), "PCIe")
        except nv.NVMLError:
            pass
    try:
        ok = nv.nvmlDeviceGetP2PStatus(hi, hj, nv.NVML_P2P_CAPS_INDEX_READ) == nv.NVML_P2P_STATUS_OK
    except (nv.NVMLError, AttributeError):
        ok = True
    return link, ok


def list_gpus(lib: Any = None) -> list[GpuInfo]:
    """Physical GPUs NVML sees (ignores CUDA_VISIBLE_DEVICES); [] without a driver."""
    return probe_gpus(lib, topology=False).gpus


def visible_gpu_count(gpus_field: str = "", lib: Any = None) -> int:
    """GPUs a run would get: the spec's list, else CUDA_VISIBLE_DEVICES, else all."""
    total = len(list_gpus(lib))
    if total == 0:
        return 0
    sel = gpus_field or os.environ.get("CUDA_VISIBLE_DEVICES")
    if sel is None:
        return total
    ids = [s for s in sel.split(",") if s.strip() and s.strip() != "-1"]
    return min(len(ids), total)
