"""A stand-in for `pynvml` with the same call interface, for CI machines without a GPU.

Only used where NVML hardware is absent: tests and `bench/telemetry_cost.py` pass it to
`tunedeck.core.telemetry.nvml.Nvml(lib=FakePynvml(...))`, and the agent uses it when the environment
variable TUNEDECK_FAKE_NVML=<gpu count> is set (CI only). It raises pynvml's own error classes,
so the real code paths for "not supported", "no driver" and missing versioned symbols run.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pynvml

NVMLError = pynvml.NVMLError
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1


class FakePynvml:
    """`gpus` devices; `util(gpu, t)` shapes utilisation; `unsupported` names queries
    ("power", "pcie", "nvlink", "procs_v3") that raise NotSupported / FunctionNotFound."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM, NVML_CLOCK_MEM = NVML_CLOCK_SM, NVML_CLOCK_MEM
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES

    def __init__(self, gpus: int = 2, *, no_driver: bool = False, unsupported=(),
                 util=None, procs: dict[int, list[tuple[int, int]]] | None = None,
                 total_mib: int = 143771):
        self.gpus = gpus
        self.no_driver = no_driver
        self.unsupported = set(unsupported)
        self.util = util or (lambda gpu, t: 50 + 45 * math.sin(t / 7 + gpu))
        self.procs = procs or {}
        self.total_mib = total_mib
        # sampling calls (not init's handle/name queries): in all, and by what they read,
        # so tests can hold the per-GPU call budget (each real call costs ~0.4 ms on a VM)
        self.calls = 0
        self.calls_by: Counter[str] = Counter()
        self._nvlink_kib = [0.0] * gpus

    # -- lifecycle ------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.no_driver:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "fake-0.0"

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < self.gpus:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return "Fake H200"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h:04d}"

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
        return SimpleNamespace(total=self.total_mib * 2**20, used=used * 2**20,
                               free=(self.total_mib - used) * 2**20)

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
        return [SimpleNamespace(fieldId=f, nvmlReturn=0,
                                value=SimpleNamespace(ullVal=int(self._nvlink_kib[h])))
                for f in field_ids]

    def _proc_list(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mib * 2**20)
                for pid, mib in self.procs.get(h, [])]

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
    """FakePynvml when TUNEDECK_FAKE_NVML=<count> is set (CI only), else None."""
    raw = os.environ.get("TUNEDECK_FAKE_NVML", "").strip()
    if not raw:
        return None
    try:
        return FakePynvml(gpus=max(0, int(raw)))
    except ValueError:
        return None
