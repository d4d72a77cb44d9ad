"""Per-GPU samples through NVML (nvidia-ml-py, imported as `pynvml`), N/A-tolerant.

`Nvml` initialises NVML on first use, never at import. Without a driver it settles into a
clear "no NVIDIA driver" state (status "no_driver") instead of raising; a query the GPU does
not support yields NA (None in stored samples) and is not asked again. Queries are tiered
(see `Nvml.sample`): utilisation and memory every sample, the rest every `slow_every`
samples, spread over the GPUs. Version-suffixed entry points
(nvmlDeviceGetComputeRunningProcesses_v3 / _v2 / plain) are tried in turn, so old drivers
without the newest symbol still report processes.

`nvml_session` / `nvml_start` are core's only way into NVML: the GPU discovery and facts
(core/telemetry/gpus.py) and `Nvml` all start it there. `lib` may be any object with
pynvml's interface (core/telemetry/fake.py for CI).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any
from collections.abc import Iterator


class _NA:
    """A value NVML could not give (unsupported query, no permission, lost GPU)."""

    _inst = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "N/A"

    def __bool__(self) -> bool:
        return False


NA = _NA()

# NVML return codes (nvml.h) we act on
_NOT_SUPPORTED, _NO_PERMISSION = 3, 4
_DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND, _FUNCTION_NOT_FOUND = 9, 12, 13
_NO_DRIVER = (_DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND)

# the metrics every GPU sample carries (None = N/A), in storage order
GPU_METRICS = (
    "util",
    "mem_util",
    "mem_used_mib",
    "mem_total_mib",
    "power_w",
    "temp_c",
    "sm_mhz",
    "mem_mhz",
    "pcie_rx_kbs",
    "pcie_tx_kbs",
    "nvlink_rx_kbs",
    "nvlink_tx_kbs",
)

_PROC_FUNCS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX: cumulative KiB over all links
_FI_NVLINK_TX, _FI_NVLINK_RX = 138, 139
# the slow set before its first read (or on a GPU that supports none of it)
_EMPTY_SLOW: dict[str, Any] = {
    "slow_t": None,
    "power_w": None,
    "temp_c": None,
    "sm_mhz": None,
    "mem_mhz": None,
    "pcie_rx_kbs": None,
    "pcie_tx_kbs": None,
    "nvlink_rx_kbs": None,
    "nvlink_tx_kbs": None,
    "procs": (),
}


class NvmlUnavailable(Exception):
    """NVML cannot be used here. `status` is "no_driver" (no library or driver: a machine
    without NVIDIA GPUs) or "error" (NVML is there but failed); `reason` says why."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def load_pynvml():
    """The nvidia-ml-py module; the one import of it in core (the fake borrows its errors)."""
    import pynvml

    return pynvml


def nvml_start(lib: Any = None) -> Any:
    """pynvml (or `lib`) with NVML initialised; the caller owes an `nvml_stop(lib)`.
    Raises NvmlUnavailable, never ImportError or NVMLError."""
    if lib is None:
        try:
            lib = load_pynvml()
        except ImportError:
            raise NvmlUnavailable("no_driver", "nvidia-ml-py is not installed") from None
    try:
        lib.nvmlInit()
    except lib.NVMLError as e:
        if getattr(e, "value", None) in _NO_DRIVER:
            raise NvmlUnavailable("no_driver", f"no NVIDIA driver ({e})") from e
        raise NvmlUnavailable("error", f"NVML failed to start: {e}") from e
    return lib


def nvml_stop(lib: Any) -> None:
    try:
        lib.nvmlShutdown()
    except Exception:  # noqa: BLE001 - shutting down must not turn into a failure
        pass


@contextmanager
def nvml_session(lib: Any = None) -> Iterator[Any]:
    """`with nvml_session(lib) as nv:` NVML started for the block and stopped after it. An
    NVMLError the block lets escape becomes NvmlUnavailable("error", ...), so one except
    clause covers every way NVML can fail."""
    lib = nvml_start(lib)
    try:
        yield lib
    except lib.NVMLError as e:
        raise NvmlUnavailable("error", f"NVML query failed: {e}") from e
    finally:
        nvml_stop(lib)


class Nvml:
    def __init__(self, lib: Any = None, slow_every: int = 10):
        self._lib = lib
        self.slow_every = slow_every  # samples between two reads of a GPU's slow set
        self._tick = 0
        self._slow: dict[int, dict[str, Any]] = {}
        self.status = "uninitialised"  # ok | no_driver | error
        self.message = ""
        self.driver = ""
        self._handles: list[Any] = []
        self.names: list[str] = []
        self._unsupported: set[tuple[int, str]] = set()
        self._proc_fn: str | None = None
        self._nvlink_prev: dict[int, tuple[float, float, float]] = {}

    # -- lifecycle --------------------------------------------------------------------------
    def init(self) -> bool:
        """Initialise once; True when GPUs can be sampled."""
        if self.status != "uninitialised":
            return self.status == "ok"
        try:
            lib = self._lib = nvml_start(self._lib)
        except NvmlUnavailable as e:
            self.status, self.message = e.status, e.reason
            return False
        try:
            n = lib.nvmlDeviceGetCount()
            self._handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            self.names = [as_text(lib.nvmlDeviceGetName(h)) for h in self._handles]
            self.driver = as_text(self._try(-1, "driver", lib.nvmlSystemGetDriverVersion) or "")
        except lib.NVMLError as e:
            self.status, self.message = "error", f"NVML device query failed: {e}"
            self._handles, self.names = [], []
            nvml_stop(lib)
            return False
        self.status = "ok"
        return True

    def close(self) -> None:
        if self.status == "ok":
            nvml_stop(self._lib)
        self.status = "uninitialised"

    @property
    def count(self) -> int:
        return len(self._handles)

    # -- queries ----------------------------------------------------------------------------
    def _try(self, gpu: int, what: str, fn, *args):
        """One NVML query; NA when unsupported (and never asked again for that GPU)."""
        if (gpu, what) in self._unsupported:
            return NA
        try:
            return fn(*args)
        except self._lib.NVMLError as e:
            if getattr(e, "value", None) in (_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND):
                self._unsupported.add((gpu, what))
            return NA
        except (AttributeError, TypeError):  # symbol missing in this nvidia-ml-py
            self._unsupported.add((gpu, what))
            return NA

    def sample(self, now: float | None = None) -> list[dict[str, Any]]:
        """One sample per GPU: {"gpu", "t", "slow_t", metric: value or None,
        "procs": [(pid, mib)]}.

        Tiered, because on virtualised H200s each NVML call costs ~0.4 ms of CPU: every call
        reads the fast set (utilisation, memory: 2 calls per GPU); the slow set (power,
        temperature, clocks, PCIe, NVLink, process list) is read for each GPU once every
        `slow_every` calls, one GPU's turn per call where there are fewer GPUs than calls in
        the period (no tick reads every GPU's slow set; the first call reads all of them).
        Between reads a sample carries the last known slow values (None while never read or
        unsupported); "slow_t" says when they were read."""
        if not self.init():
            return []
        now = time.time() if now is None else now
        lib = self._lib
        out = []
        n, every, tick = len(self._handles), max(1, int(self.slow_every)), self._tick
        self._tick += 1
        for i, h in enumerate(self._handles):
            s: dict[str, Any] = {"gpu": i, "t": now}
            u = self._try(i, "util", lib.nvmlDeviceGetUtilizationRates, h)
            s["util"] = _num(getattr(u, "gpu", NA))
            s["mem_util"] = _num(getattr(u, "memory", NA))
            m = self._try(i, "mem", lib.nvmlDeviceGetMemoryInfo, h)
            s["mem_used_mib"] = _num(getattr(m, "used", NA), 1 / 2**20)
            s["mem_total_mib"] = _num(getattr(m, "total", NA), 1 / 2**20)
            if tick == 0 or tick % every == (i * every // n) % every:
                self._slow[i] = self._slow_sample(i, h, now)
            s.update(self._slow.get(i) or _EMPTY_SLOW)
            s["procs"] = list(s["procs"])
            out.append(s)
        return out

    def _slow_sample(self, i: int, h, now: float) -> dict[str, Any]:
        lib = self._lib
        s: dict[str, Any] = {"slow_t": now}
        s["power_w"] = _num(self._try(i, "power", lib.nvmlDeviceGetPowerUsage, h), 1e-3)
        s["temp_c"] = _num(
            self._try(
                i, "temp", lib.nvmlDeviceGetTemperature, h, getattr(lib, "NVML_TEMPERATURE_GPU", 0)
            )
        )
        s["sm_mhz"] = _num(
            self._try(
                i, "sm_clock", lib.nvmlDeviceGetClockInfo, h, getattr(lib, "NVML_CLOCK_SM", 1)
            )
        )
        s["mem_mhz"] = _num(
            self._try(
                i, "mem_clock", lib.nvmlDeviceGetClockInfo, h, getattr(lib, "NVML_CLOCK_MEM", 2)
            )
        )
        s["pcie_rx_kbs"] = _num(
            self._try(
                i,
                "pcie_rx",
                lib.nvmlDeviceGetPcieThroughput,
                h,
                getattr(lib, "NVML_PCIE_UTIL_RX_BYTES", 1),
            )
        )
        s["pcie_tx_kbs"] = _num(
            self._try(
                i,
                "pcie_tx",
                lib.nvmlDeviceGetPcieThroughput,
                h,
                getattr(lib, "NVML_PCIE_UTIL_TX_BYTES", 0),
            )
        )
        s["nvlink_rx_kbs"], s["nvlink_tx_kbs"] = self._nvlink(i, h, now)
        s["procs"] = tuple(self._procs(i, h))
        return s

    def _nvlink(self, i: int, h, now: float) -> tuple[float | None, float | None]:
        """NVLink KiB/s from the cumulative data counters (None where there is no NVLink)."""
        vals = self._try(
            i, "nvlink", self._lib.nvmlDeviceGetFieldValues, h, [_FI_NVLINK_TX, _FI_NVLINK_RX]
        )
        if vals is NA:
            return None, None
        try:
            if any(v.nvmlReturn != 0 for v in vals):
                self._unsupported.add((i, "nvlink"))
                return None, None
            tx, rx = float(vals[0].value.ullVal), float(vals[1].value.ullVal)
        except (AttributeError, IndexError, TypeError):
            self._unsupported.add((i, "nvlink"))
            return None, None
        prev = self._nvlink_prev.get(i)
        self._nvlink_prev[i] = (now, tx, rx)
        if prev is None or now <= prev[0] or tx < prev[1] or rx < prev[2]:
            return None, None
        dt = now - prev[0]
        return round((rx - prev[2]) / dt, 1), round((tx - prev[1]) / dt, 1)

    def gpu_processes(self, i: int) -> list[tuple[int, float | None]]:
        """(pid, MiB) of the compute processes on GPU `i` (the queue asks who uses it)."""
        return self._procs(i, self._handles[i])

    def _procs(self, i: int, h) -> list[tuple[int, float | None]]:
        """(pid, MiB) of compute processes; tries the version-suffixed symbols in turn."""
        names = [self._proc_fn] if self._proc_fn else list(_PROC_FUNCS)
        for name in names:
            fn = getattr(self._lib, name, None)
            if fn is None:
                continue
            try:
                procs = fn(h)
            except self._lib.NVMLError as e:
                if getattr(e, "value", None) == _FUNCTION_NOT_FOUND and not self._proc_fn:
                    continue  # older driver: try the previous version of the call
                return []
            self._proc_fn = name
            out = []
            for p in procs:
                mem = getattr(p, "usedGpuMemory", None)
                out.append((int(p.pid), round(mem / 2**20, 1) if mem is not None else None))
            return out
        return []


def _num(v: Any, scale: float = 1.0) -> float | None:
    if v is NA or v is None:
        return None
    try:
        return round(float(v) * scale, 1)
    except (TypeError, ValueError):
        return None


def as_text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)
