"""`NvmlSource`: live readings through NVML (`nvidia-ml-py`, imported only here). Needs an NVIDIA driver.

Every query that a card or driver may not support (NVML_ERROR_NOT_SUPPORTED on GeForce, on MIG slices, in some
containers) yields None instead of failing the whole reading. A GPU that stops answering with
NVML_ERROR_GPU_IS_LOST is reported in `Sample.lost_gpus`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from rentwise.machine.readings import GpuFacts, GpuProcess, GpuReading, MachineFacts, Sample

T = TypeVar("T")
_LOCK = threading.Lock()
_initialised = False

# nvmlGpuTopologyLevel_t -> words (nvml.h). NVLink is checked separately, per link.
_TOPOLOGY_WORDS = {
    0: "same board",
    10: "same PCIe switch",
    20: "across PCIe switches",
    30: "same CPU host bridge",
    40: "same CPU socket (NUMA node)",
    50: "across CPU sockets",
}


def nvml_unavailable_reason() -> str | None:
    """Why NVML cannot be used here, in words a user understands; None when it works."""
    global _initialised
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed (pip install 'rentwise[gpu]'), so GPUs cannot be queried"
    with _LOCK:
        if _initialised:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            return "no NVIDIA driver/NVML (libnvidia-ml.so not found): this machine has no usable NVIDIA GPU"
        except pynvml.NVMLError_DriverNotLoaded:
            return (
                "the NVIDIA driver is installed but not loaded (no GPU attached, or the kernel module failed)"
            )
        except pynvml.NVMLError as error:
            return f"NVML failed to start: {error}"
        _initialised = True
    return None


def _maybe(call: Callable[[], T]) -> T | None:
    """Run one NVML query; None when the card, driver or container does not support it."""
    import pynvml

    try:
        return call()
    except pynvml.NVMLError_GpuIsLost:
        raise
    except (pynvml.NVMLError, AttributeError, TypeError):
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    """Reads the machine's GPUs through NVML. Create it only after `nvml_unavailable_reason()` is None."""

    def __init__(self, nvml: Any = None) -> None:
        """`nvml` is the `pynvml` module (tests pass a stand-in with the same functions)."""
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._lost: set[int] = set()

    def facts(self) -> MachineFacts:
        nvml = self._nvml
        cuda = _maybe(nvml.nvmlSystemGetCudaDriverVersion_v2)
        return MachineFacts(
            source="nvml",
            driver_version=_maybe(lambda: _text(nvml.nvmlSystemGetDriverVersion())),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
            gpus=tuple(self._gpu_facts(i, h) for i, h in enumerate(self._handles)),
            topology=self._topology(),
        )

    def _gpu_facts(self, index: int, handle: Any) -> GpuFacts:
        nvml = self._nvml
        capability = _maybe(lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
        ecc = _maybe(lambda: nvml.nvmlDeviceGetCurrentEccMode(handle))
        limit_mw = _maybe(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        default_mw = _maybe(lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle))
        remapped = _maybe(lambda: nvml.nvmlDeviceGetRemappedRows(handle))  # (corr, unc, pending, failed)
        pending = _maybe(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        max_clock = _maybe(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        return GpuFacts(
            index=index,
            name=_text(nvml.nvmlDeviceGetName(handle)),
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
            pcie_gen=_maybe(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
            pcie_width=_maybe(lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
            pcie_max_gen=_maybe(lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
            pcie_max_width=_maybe(lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
            persistence_mode=_maybe(lambda: nvml.nvmlDeviceGetPersistenceMode(handle) == 1),
            ecc_enabled=bool(ecc) if ecc is not None else None,
            ecc_uncorrected_volatile=_maybe(
                lambda: nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            ),
            retired_pages_pending=bool(pending) if pending is not None else None,
            remapped_rows_failed=bool(remapped[3]) if remapped else None,
            power_limit_w=limit_mw / 1000 if limit_mw else None,
            default_power_limit_w=default_mw / 1000 if default_mw else None,
            max_sm_clock_mhz=float(max_clock) if max_clock else None,
            nvlink_active_links=self._active_nvlinks(handle),
        )

    def _active_nvlinks(self, handle: Any) -> int | None:
        nvml = self._nvml
        active = 0
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            state = _maybe(lambda link=link: nvml.nvmlDeviceGetNvLinkState(handle, link))  # type: ignore[misc]
            if state is None:
                return active if link else None  # NOT_SUPPORTED on link 0: no NVLink on this card
            active += int(state == nvml.NVML_FEATURE_ENABLED)
        return active

    def _topology(self) -> tuple[tuple[int, int, str], ...]:
        pairs: list[tuple[int, int, str]] = []
        for a, handle_a in enumerate(self._handles):
            for b in range(a + 1, len(self._handles)):
                pairs.append((a, b, self._link(handle_a, self._handles[b])))
        return tuple(pairs)

    def _link(self, handle_a: Any, handle_b: Any) -> str:
        nvml = self._nvml
        nvlink = _maybe(
            lambda: nvml.nvmlDeviceGetP2PStatus(handle_a, handle_b, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
        )
        if nvlink == nvml.NVML_P2P_STATUS_OK:
            return "NVLink"
        level = _maybe(lambda: nvml.nvmlDeviceGetTopologyCommonAncestor(handle_a, handle_b))
        return _TOPOLOGY_WORDS.get(int(level), "unknown") if level is not None else "unknown"

    def sample(self, t_s: float) -> Sample | None:
        readings: list[GpuReading] = []
        for index, handle in enumerate(self._handles):
            if index in self._lost:
                continue
            try:
                readings.append(self._reading(index, handle))
            except self._nvml.NVMLError_GpuIsLost:
                self._lost.add(index)
        return Sample(t_s=t_s, gpus=tuple(readings), lost_gpus=tuple(sorted(self._lost)))

    def _reading(self, index: int, handle: Any) -> GpuReading:
        nvml = self._nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        rates = _maybe(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        power_mw = _maybe(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        limit_mw = _maybe(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        return GpuReading(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            utilization_pct=float(rates.gpu) if rates is not None else None,
            memory_utilization_pct=float(rates.memory) if rates is not None else None,
            power_w=power_mw / 1000 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000 if limit_mw else None,
            temperature_c=_maybe(
                lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            ),
            sm_clock_mhz=_maybe(lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))),
            memory_clock_mhz=_maybe(lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))),
            clock_event_reasons=self._clock_event_reasons(handle),
            processes=self._processes(handle),
        )

    def _clock_event_reasons(self, handle: Any) -> int:
        """The reasons bitmask; nvidia-ml-py before 12.535 only has the older "throttle reasons" name."""
        nvml = self._nvml
        query = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if query is None:
            query = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return _maybe(lambda: int(query(handle))) or 0

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        nvml = self._nvml
        found: dict[int, GpuProcess] = {}
        for query in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
            for process in _maybe(lambda query=query: query(handle)) or []:  # type: ignore[misc]
                used = process.usedGpuMemory
                # NVML reports NVML_VALUE_NOT_AVAILABLE (2**64 - 1) or None where it cannot see the figure,
                # e.g. inside containers without the host PID namespace.
                memory = int(used) if used is not None and used < 2**63 else None
                found[int(process.pid)] = GpuProcess(pid=int(process.pid), used_memory_bytes=memory)
        return tuple(found.values())
