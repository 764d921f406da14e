"""`NvmlSource` against a stand-in for the pynvml module: unit conversions, unsupported queries, a lost GPU.

The stand-in only answers the calls NvmlSource makes, with values shaped like pynvml's (milliwatts, an int
CUDA version, (major, minor) tuples, structs with attributes). It checks NvmlSource's own logic, not NVML
itself; the real NVML path runs in benchmarks/gpu_hardware_check.sh (test_gpu_real.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pynvml = pytest.importorskip("pynvml")

from rentwise.machine.nvml import NvmlSource  # noqa: E402

MIB = 2**20


def _error(code: int) -> Exception:
    return pynvml.NVMLError(code)  # pynvml maps the code to its NVMLError_* subclass


class FakeNvml:
    """Two GPUs; GPU 1 supports nothing optional; `lose(1)` makes GPU 1 answer GPU_IS_LOST."""

    def __init__(self) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError")):
                setattr(self, name, getattr(pynvml, name))
        self.lost: set[int] = set()

    def lose(self, index: int) -> None:
        self.lost.add(index)

    def _check(self, handle: int) -> None:
        if handle in self.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)

    def _optional(self, handle: int, value: Any) -> Any:
        self._check(handle)
        if handle == 1:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12040

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        self._check(h)
        return f"GPU-{h}"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        self._check(h)
        return SimpleNamespace(total=81559 * MIB, used=1024 * MIB, free=80535 * MIB)

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return self._optional(h, (9, 0))  # type: ignore[no-any-return]

    def nvmlDeviceGetCurrentEccMode(self, h: int) -> int:
        return self._optional(h, 1)  # type: ignore[no-any-return]

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self._optional(h, 700_000)  # type: ignore[no-any-return]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: int) -> int:
        return self._optional(h, 700_000)  # type: ignore[no-any-return]

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return self._optional(h, (0, 0, 0, 0))  # type: ignore[no-any-return]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return self._optional(h, 0)  # type: ignore[no-any-return]

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return self._optional(h, 1980)  # type: ignore[no-any-return]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._optional(h, 5)  # type: ignore[no-any-return]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._optional(h, 16)  # type: ignore[no-any-return]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._optional(h, 5)  # type: ignore[no-any-return]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._optional(h, 16)  # type: ignore[no-any-return]

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return self._optional(h, 1)  # type: ignore[no-any-return]

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return self._optional(h, 0)  # type: ignore[no-any-return]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 18:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._optional(h, pynvml.NVML_FEATURE_ENABLED)  # type: ignore[no-any-return]

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        return pynvml.NVML_P2P_STATUS_OK  # type: ignore[no-any-return]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 50

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return self._optional(h, SimpleNamespace(gpu=97, memory=60))

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._optional(h, 612_345)  # type: ignore[no-any-return]

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._optional(h, 64)  # type: ignore[no-any-return]

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return self._optional(h, 1755 if clock == pynvml.NVML_CLOCK_SM else 2619)  # type: ignore[no-any-return]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._optional(h, 0x4)  # type: ignore[no-any-return]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        self._check(h)
        return [
            SimpleNamespace(pid=4242, usedGpuMemory=900 * MIB),
            SimpleNamespace(pid=7, usedGpuMemory=2**64 - 1),
        ]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        return self._optional(h, [])  # type: ignore[no-any-return]


def test_facts_convert_units_and_tolerate_unsupported_queries() -> None:
    facts = NvmlSource(FakeNvml()).facts()
    assert (facts.driver_version, facts.cuda_driver_version) == ("550.90.07", "12.4")
    first, second = facts.gpus
    assert first.name == "NVIDIA H100 80GB HBM3" and first.compute_capability == "9.0"
    assert first.power_limit_w == 700.0 and first.nvlink_active_links == 18
    assert (first.pcie_gen, first.pcie_width, first.ecc_enabled, first.persistence_mode) == (
        5,
        16,
        True,
        True,
    )
    assert (
        second.compute_capability is None
        and second.power_limit_w is None
        and second.nvlink_active_links is None
    )
    assert facts.topology == ((0, 1, "NVLink"),)


def test_sample_reads_watts_clocks_reasons_and_processes() -> None:
    sample = NvmlSource(FakeNvml()).sample(1.5)
    assert sample is not None and sample.t_s == 1.5
    reading = sample.gpus[0]
    assert reading.power_w == pytest.approx(612.345) and reading.sm_clock_mhz == 1755.0
    assert reading.utilization_pct == 97.0 and reading.clock_event_reasons == 0x4
    assert [(p.pid, p.used_memory_bytes) for p in reading.processes] == [(4242, 900 * MIB), (7, None)]
    assert sample.gpus[1].utilization_pct is None and sample.gpus[1].clock_event_reasons == 0


def test_a_gpu_that_falls_off_the_bus_is_reported_lost() -> None:
    nvml = FakeNvml()
    source = NvmlSource(nvml)
    assert [g.index for g in source.sample(0.0).gpus] == [0, 1]  # type: ignore[union-attr]
    nvml.lose(1)
    later = source.sample(2.0)
    assert later is not None and [g.index for g in later.gpus] == [0] and later.lost_gpus == (1,)
    assert source.sample(4.0).lost_gpus == (1,)  # type: ignore[union-attr]
