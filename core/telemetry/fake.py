"""A stand-in for `pynvml` with the same call interface, for CI machines without a GPU.

Only used where NVML hardware is absent: tests and `bench/telemetry_cost.py` pass it to
`tunedeck.core.telemetry.nvml.Nvml(lib=FakePynvml(...))`, and the agent uses it when the environment
variable TUNEDECK_FAKE_NVML=<gpu count> is set (CI only); `probe_gpus(lib=...)` in
core/telemetry/gpus.py reads its driver, compute capability and topology. It raises pynvml's
own error classes, so the real code paths for "not supported", "no driver" and missing
versioned symbols run.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

from tunedeck.core.telemetry.nvml import load_pynvml

pynvml = load_pynvml()  # for its error classes only
NVMLError = pynvml.NVMLError
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
NVML_TOPOLOGY_SYSTEM = 50  # across CPU sockets


class FakePynvml:
    """`gpus` devices; `util(gpu, t)` shapes utilisation; `unsupported` names queries
    ("power", "pcie", "nvlink", "procs_v3", "cuda_version", "cc", "topology", "p2p") that
    raise NotSupported / FunctionNotFound ("nvlink": a GPU without NVLink). `init_error`
    is an NVML error code nvmlInit raises (`no_driver`: LIBRARY_NOT_FOUND). Topology: every
    pair `topology` apart (an NVML_TOPOLOGY_* level), `nvlinks` active links per GPU, P2P
    reads `p2p` ok or not."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM, NVML_CLOCK_MEM = NVML_CLOCK_SM, NVML_CLOCK_MEM
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES
    NVML_P2P_CAPS_INDEX_READ = pynvml.NVML_P2P_CAPS_INDEX_READ
    NVML_P2P_STATUS_OK = pynvml.NVML_P2P_STATUS_OK
    NVML_P2P_STATUS_NOT_SUPPORTED = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def __init__(
        self,
        gpus: int = 2,
        *,
        no_driver: bool = False,
        init_error: int = 0,
        unsupported=(),
        util=None,
        procs: dict[int, list[tuple[int, int]]] | None = None,
        total_mib: int = 143771,
        name: str = "Fake H200",
        cc: tuple[int, int] = (9, 0),
        driver: str = "fake-0.0",
        cuda_version: int = 13000,
        nvlinks: int = 18,
        topology: int = NVML_TOPOLOGY_SYSTEM,
        p2p: bool = True,
    ):
        self.gpus = gpus
        self.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND if no_driver else init_error
        self.name, self.cc, self.driver, self.cuda_version = name, cc, driver, cuda_version
        self.nvlinks, self.topology, self.p2p = nvlinks, topology, p2p
        self.unsupported = set(unsupported)
        self.util = util or (lambda gpu, t: 50 + 45 * math.sin(t / 7 + gpu))
        self.procs = procs or {}
        self.total_mib = total_mib
        self.inits = 0  # nvmlInit calls not yet shut down: 0 when every user closed NVML
        # sampling calls (not init's handle/name queries): in all, and by what they read,
        # so tests can hold the per-GPU call budget (each real call costs ~0.4 ms on a VM)
        self.calls = 0
        self.calls_by: Counter[str] = Counter()
        self._nvlink_kib = [0.0] * gpus

    # -- lifecycle ------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error:
            raise pynvml.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._refuse("cuda_version")
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < self.gpus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.name

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h:04d}"

    # -- facts and topology (not counted: read once per probe, not per sample) -------------
    def _refuse(self, what: str) -> None:
        if what in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        self._refuse("cc")
        return self.cc

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        self._refuse("nvlink")
        if not 0 <= link < self.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1  # NVML_FEATURE_ENABLED

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: int, h2: int) -> int:
        self._refuse("topology")
        return self.topology

    def nvmlDeviceGetP2PStatus(self, h1: int, h2: int, index) -> int:
        self._refuse("p2p")
        return self.NVML_P2P_STATUS_OK if self.p2p else self.NVML_P2P_STATUS_NOT_SUPPORTED

    # -- samples --------------------------------------------------------------------------
    def _check(self, what: str) -> None:
        self.calls += 1
        self.calls_by[what] += 1
        if what in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetUtilizationRates(self, h: int):
        self._check("util")
        u = max(0, min(100, int(self.util(h, time.time()))))
        return SimpleNamespace(gpu=u, memory=u // 2)

    def nvmlDeviceGetMemoryInfo(self, h: int):
        self._check("mem")
        used = sum(m for _, m in self.procs.get(h, [])) or 1024
        return SimpleNamespace(
            total=self.total_mib * 2**20, used=used * 2**20, free=(self.total_mib - used) * 2**20
        )

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._check("power")
        return 350_000 + 1000 * h

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self._check("temp")
        return 45 + h

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        self._check("clocks")
        return 1980 if clock == NVML_CLOCK_SM else 3201

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        self._check("pcie")
        return 1200 if counter == NVML_PCIE_UTIL_RX_BYTES else 800

    def nvmlDeviceGetFieldValues(self, h: int, field_ids: list[int]):
        self._check("nvlink")
        self._nvlink_kib[h] += 5e6
        return [
            SimpleNamespace(
                fieldId=f, nvmlReturn=0, value=SimpleNamespace(ullVal=int(self._nvlink_kib[h]))
            )
            for f in field_ids
        ]

    def _proc_list(self, h: int) -> list[Any]:
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=mib * 2**20)
            for pid, mib in self.procs.get(h, [])
        ]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: int):
        self.calls += 1
        self.calls_by["procs"] += 1
        if "procs_v3" in self.unsupported:  # an older driver lacks the _v3 symbol
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._proc_list(h)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: int):
        self.calls += 1
        self.calls_by["procs"] += 1
        return self._proc_list(h)

    nvmlDeviceGetComputeRunningProcesses = nvmlDeviceGetComputeRunningProcesses_v3


def from_env() -> FakePynvml | None:
    """FakePynvml when TUNEDECK_FAKE_NVML=<count>[:<util %>] is set (CI only), else None;
    with a utilisation every GPU reads it steadily (`1:0`: one idle GPU)."""
    raw = os.environ.get("TUNEDECK_FAKE_NVML", "").strip()
    if not raw:
        return None
    count, _, util = raw.partition(":")
    try:
        steady = float(util) if util else None
        return FakePynvml(
            gpus=max(0, int(count)),
            util=None if steady is None else (lambda gpu, t: steady),
        )
    except ValueError:
        return None
