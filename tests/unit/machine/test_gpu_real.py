"""On a real CUDA GPU (skipped elsewhere): NVML readings are plausible and bench reaches sane fractions."""

from __future__ import annotations

import pytest

from rentwise.hardware.catalog import find_gpu
from rentwise.machine.bench import QUICK, run_bench
from rentwise.machine.readings import open_source
from rentwise.machine.verdict import compare

pytestmark = pytest.mark.gpu


def test_nvml_facts_and_a_sample() -> None:
    source = open_source()
    facts = source.facts()
    assert facts.unavailable is None and facts.gpus, facts.unavailable
    assert facts.driver_version and facts.cuda_driver_version
    sample = source.sample(0.0)
    assert sample is not None and sample.gpus
    reading = sample.gpus[0]
    assert 0 <= reading.memory_used_bytes <= reading.memory_total_bytes == facts.gpus[0].memory_total_bytes
    assert reading.utilization_pct is None or 0 <= reading.utilization_pct <= 100


def test_quick_bench_is_within_physical_bounds() -> None:
    source = open_source()
    result = run_bench(source, QUICK)
    assert result.samples, "NVML was not sampled during the run"
    try:
        spec = find_gpu(result.gpu.name)
    except Exception:
        pytest.skip(f"{result.gpu.name} is not in the catalog")
    for row in compare(result, spec):
        if row.fraction is not None and row.name.startswith("matmul_"):
            # 4096³ is below the roofline size on the biggest cards, so only a loose lower bound.
            assert 0.2 < row.fraction < 1.1, row
        if row.name == "device_copy" and row.fraction is not None:
            assert 0.3 < row.fraction < 1.1, row
