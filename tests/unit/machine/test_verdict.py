"""The bench verdict: every status and its reasons, from constructed results on an H100 SXM5 spec."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rentwise.errors import ConfigError, NotFoundError
from rentwise.hardware.catalog import find_gpu
from rentwise.machine.readings import GpuFacts, GpuProcess, GpuReading, Sample
from rentwise.machine.verdict import (
    BenchResult,
    Measurement,
    compare,
    judge,
    load_result,
    result_document,
)

H100 = find_gpu("H100 SXM5")
H100_PCIE = find_gpu("H100 PCIe")
GPU = GpuFacts(
    index=0,
    name="NVIDIA H100 80GB HBM3",
    uuid="GPU-x",
    memory_total_bytes=81559 * 2**20,
    default_power_limit_w=700.0,
    max_sm_clock_mhz=1980.0,
)


def _measurements(scale: float = 1.0, spread: float = 0.01) -> tuple[Measurement, ...]:
    """Figures an H100 SXM normally reaches (~80% of dense peaks, 90% of memory bandwidth), times `scale`."""
    base = {
        "matmul_bf16": (790.0, "TFLOPS"),
        "matmul_fp16": (800.0, "TFLOPS"),
        "matmul_tf32": (380.0, "TFLOPS"),
        "matmul_fp32": (51.0, "TFLOPS"),
        "device_copy": (3000.0, "GB/s"),
        "host_to_device": (52.0, "GB/s"),
        "device_to_host": (50.0, "GB/s"),
    }
    return tuple(
        Measurement(
            name, unit, (value * scale * (1 - spread / 2), value * scale, value * scale * (1 + spread / 2))
        )
        for name, (value, unit) in base.items()
    )


def _samples(
    reasons: int = 0, limit: float = 700.0, processes: tuple[GpuProcess, ...] = ()
) -> tuple[Sample, ...]:
    reading = GpuReading(
        0, "GPU-x", 10 * 2**30, GPU.memory_total_bytes, utilization_pct=100.0, power_w=limit - 10,
        power_limit_w=limit, temperature_c=70.0, sm_clock_mhz=1755.0, clock_event_reasons=reasons,
        processes=(GpuProcess(99, 9 * 2**30), *processes),
    )  # fmt: skip
    return tuple(Sample(t_s=i * 0.2, gpus=(reading,)) for i in range(20))


def _result(**changes: object) -> BenchResult:
    result = BenchResult(gpu=GPU, measurements=_measurements(), samples=_samples(), own_pids=(99,))
    return dataclasses.replace(result, **changes)  # type: ignore[arg-type]


def test_healthy() -> None:
    verdict = judge(_result(), H100)
    assert verdict.status == "healthy"
    bf16 = next(c for c in verdict.comparisons if c.name == "matmul_bf16")
    assert bf16.peak == 989 and bf16.fraction == pytest.approx(790 / 989) and bf16.normal_fraction == 0.70
    h2d = next(c for c in verdict.comparisons if c.name == "host_to_device")
    assert h2d.peak == 64  # one direction of PCIe Gen5 x16 (128 GB/s both ways)


def test_thermal_throttling() -> None:
    verdict = judge(_result(samples=_samples(reasons=0x40), measurements=_measurements(0.8)), H100)
    assert verdict.status == "throttled"
    assert verdict.reasons[0] == "thermal (hardware) on 100% of samples (up to 70 °C)"
    assert any("below the 70% such a card normally reaches" in r for r in verdict.reasons)  # explained by it


def test_lowered_power_limit() -> None:
    verdict = judge(_result(samples=_samples(reasons=0x4, limit=450.0)), H100)
    assert verdict.status == "throttled"
    assert verdict.reasons == ("power limit 450 W, below the card's default 700 W",)


def test_power_cap_at_the_default_limit_is_normal() -> None:
    assert judge(_result(samples=_samples(reasons=0x4)), H100).status == "healthy"


def test_noisy_repeats() -> None:
    verdict = judge(_result(measurements=_measurements(spread=0.25)), H100)
    assert verdict.status == "likely shared or noisy"
    assert verdict.reasons[0] == "matmul_bf16 varies 25% between repeats (over 10%)"


def test_other_processes_during_the_run() -> None:
    verdict = judge(_result(samples=_samples(processes=(GpuProcess(5150, 30 * 2**30),))), H100)
    assert verdict.status == "likely shared or noisy"
    assert verdict.reasons == ("other processes used the GPU during the run (PID 5150)",)


def test_slower_than_an_earlier_run_of_the_same_card() -> None:
    earlier = _result(started_at="2026-12-01T14:00:00+00:00")
    verdict = judge(_result(measurements=_measurements(622 / 790)), H100, earlier=earlier)
    assert verdict.status == "likely shared or noisy"
    assert verdict.reasons[0].startswith(
        "matmul_bf16 622 TFLOPS is 21% slower than the earlier run (790 TFLOPS"
    )


def test_a_pcie_card_sold_as_sxm() -> None:
    # An H100 PCIe reaches ~80% of its own 756 TFLOPS peak: 61% of the SXM peak, with nothing to explain it.
    pcie = _result(
        measurements=(
            Measurement("matmul_bf16", "TFLOPS", (600.0, 605.0, 610.0)),
            Measurement("device_copy", "GB/s", (1850.0, 1860.0, 1870.0)),  # 93% of 2000: PCIe's HBM2e
        )
    )
    verdict = judge(pcie, H100)
    # A shortfall alone does not prove another card (a healthy card on a smaller shape can fall short too).
    assert verdict.status == "slower than expected for this card (possibly not the card advertised)"
    assert verdict.reasons[0] == (
        "matmul_bf16 reaches 61% of the catalog peak (605 of 989 TFLOPS), "
        "below the 70% such a card normally reaches"
    )
    assert judge(pcie, H100_PCIE).status == "healthy"  # judged against its own peak it is fine


def test_a_shortfall_with_an_identity_signal_is_not_the_card() -> None:
    slow = _result(measurements=(Measurement("matmul_bf16", "TFLOPS", (600.0, 605.0, 610.0)),))
    verdict = judge(slow, H100, detected=find_gpu("H100 PCIe"))
    assert verdict.status == "not the card advertised"
    assert verdict.reasons == (
        "NVML reports 'NVIDIA H100 80GB HBM3' (catalog 'H100 PCIe'), not a H100 SXM5",
        "matmul_bf16 reaches 61% of the catalog peak (605 of 989 TFLOPS), "
        "below the 70% such a card normally reaches",
    )


def test_a_quick_run_shortfall_says_the_matmul_was_small() -> None:
    quick = Measurement("matmul_bf16", "TFLOPS", (640.0, 650.0, 660.0), "4096x4096x4096")
    verdict = judge(_result(measurements=(quick,)), H100)
    assert verdict.status == "slower than expected for this card (possibly not the card advertised)"
    assert verdict.reasons == (
        "matmul_bf16 reaches 66% of the catalog peak (650 of 989 TFLOPS), below the 70% such a card "
        "normally reaches on large matmuls; 4096x4096x4096 is smaller and can fall short on a healthy card "
        "(rerun without --quick)",
    )
    full = dataclasses.replace(quick, size="8192x8192x8192")
    assert judge(_result(measurements=(full,)), H100).reasons[0].endswith("such a card normally reaches")


def test_host_copies_are_judged_against_one_direction_of_the_link() -> None:
    # H100 SXM5: PCIe Gen5 x16 is 128 GB/s both directions together in the catalog, 64 each way.
    rows = {c.name: c for c in compare(_result(), H100)}
    assert H100.pcie_gbps == 128
    assert rows["host_to_device"].peak == rows["device_to_host"].peak == 64
    assert rows["host_to_device"].normal_fraction == 0.60


def test_memory_size_and_name_mismatch() -> None:
    verdict = judge(_result(gpu=dataclasses.replace(GPU, memory_total_bytes=40 * 2**30)), H100)
    assert verdict.status == "not the card advertised"
    assert (
        verdict.reasons[0]
        == "40.00 GiB of memory where a H100 SXM5 has 79.65 GiB (nvidia-smi total 81559 MiB)"
    )
    named = judge(_result(), H100, detected=find_gpu("H800"))
    assert named.reasons[0] == "NVML reports 'NVIDIA H100 80GB HBM3' (catalog 'H800 SXM5'), not a H100 SXM5"


def test_faster_than_the_peak() -> None:
    verdict = judge(_result(measurements=_measurements(1.5)), H100)
    assert verdict.status == "not the card advertised"
    assert "a faster card than the catalog row" in verdict.reasons[0]


def test_inconclusive_without_a_catalog_row() -> None:
    verdict = judge(_result(), None)
    assert verdict.status == "inconclusive"
    assert all(c.peak is None for c in compare(_result(), None))


def test_gpu_to_gpu_is_shown_not_judged() -> None:
    result = _result(measurements=(Measurement("gpu_to_gpu", "GB/s", (300.0, 310.0)),), peer_link="NVLink")
    (row,) = judge(result, H100).comparisons
    assert row.peak == 450 and row.normal_fraction is None  # half of 900 GB/s, one direction


def test_save_and_load(tmp_path: Path) -> None:
    result = _result(started_at="2026-12-02T10:00:00+00:00", torch_version="2.13.0")
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result_document(result, judge(result, H100), H100.name)))
    assert load_result(path) == result
    with pytest.raises(NotFoundError, match=r"does not exist"):
        load_result(tmp_path / "none.json")
    path.write_text('{"format": "other"}')
    with pytest.raises(ConfigError, match=r"not a saved rentwise bench result"):
        load_result(path)


def test_someone_on_the_card_before_the_benchmark() -> None:
    busy = GpuReading(0, "GPU-x", 30 * 2**30, GPU.memory_total_bytes, utilization_pct=85.0)
    verdict = judge(_result(baseline=Sample(0.0, (busy,))), H100)
    assert verdict.status == "likely shared or noisy"
    assert verdict.reasons == (
        "the GPU was 85% busy before the benchmark started",
        "30.00 GiB of GPU memory was in use before the benchmark started",
    )
    idle = GpuReading(0, "GPU-x", 4 * 2**20, GPU.memory_total_bytes, utilization_pct=0.0)
    assert judge(_result(baseline=Sample(0.0, (idle,))), H100).status == "healthy"


def test_save_and_load_keeps_the_baseline(tmp_path: Path) -> None:
    idle = GpuReading(0, "GPU-x", 4 * 2**20, GPU.memory_total_bytes, utilization_pct=0.0)
    result = _result(baseline=Sample(0.0, (idle,)))
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result_document(result, judge(result, H100), H100.name)))
    assert load_result(path) == result
