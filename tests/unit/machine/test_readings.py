"""Trace files: the format watch records and the tests replay."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rentwise.errors import ConfigError, NotFoundError
from rentwise.machine.readings import (
    GpuFacts,
    GpuProcess,
    GpuReading,
    HostReading,
    MachineFacts,
    NoGpuSource,
    Sample,
    TraceSource,
    TraceWriter,
    read_trace,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "machine"


def _sample(t: float) -> Sample:
    reading = GpuReading(
        index=0,
        uuid="GPU-x",
        memory_used_bytes=10 * 2**30,
        memory_total_bytes=80 * 2**30,
        utilization_pct=90.0,
        power_w=500.0,
        power_limit_w=700.0,
        temperature_c=60.0,
        sm_clock_mhz=1980.0,
        clock_event_reasons=0x4,
        processes=(GpuProcess(pid=7, used_memory_bytes=9 * 2**30), GpuProcess(pid=8, used_memory_bytes=None)),
    )
    return Sample(t_s=t, gpus=(reading,), host=HostReading(10.0, 1, 2), job_pids=(7,), job_alive=True)


def test_trace_round_trip(tmp_path: Path) -> None:
    facts = MachineFacts(
        source="nvml",
        driver_version="550.90.07",
        cuda_driver_version="12.4",
        gpus=(GpuFacts(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-x", memory_total_bytes=80 * 2**30),),
        topology=((0, 1, "NVLink"),),
    )
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path, facts)
    samples = (_sample(0.0), _sample(2.0))
    for sample in samples:
        writer.write(sample)
    writer.close()
    assert read_trace(path) == (facts, samples)
    source = TraceSource.from_file(path)
    assert source.facts() == facts
    assert [source.sample(99.0), source.sample(99.0), source.sample(99.0)] == [*samples, None]


def test_missing_and_malformed_traces(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match=r"^trace file '.*nope.jsonl' does not exist$"):
        read_trace(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "something-else", "version": 1}\n')
    with pytest.raises(ConfigError, match=r"line 1 is not a rentwise-gpu-trace v1 header$"):
        read_trace(bad)
    bad.write_text(
        json.dumps({"format": "rentwise-gpu-trace", "version": 1, "facts": {"source": "x"}}) + "\nnot json\n"
    )
    with pytest.raises(ConfigError, match=r"line 2 is not JSON"):
        read_trace(bad)
    bad.write_text(
        json.dumps({"format": "rentwise-gpu-trace", "version": 1, "facts": {"source": "x"}})
        + '\n{"gpus": []}\n'
    )
    with pytest.raises(ConfigError, match=r"line 2: .*t_s"):
        read_trace(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"empty trace file$"):
        read_trace(empty)


def test_no_gpu_source_says_why() -> None:
    source = NoGpuSource("no NVIDIA driver/NVML (libnvidia-ml.so not found)")
    assert source.facts().unavailable == "no NVIDIA driver/NVML (libnvidia-ml.so not found)"
    assert source.sample(1.0) == Sample(t_s=1.0, gpus=())


def test_synthetic_fixtures_are_labelled_and_reproducible(tmp_path: Path) -> None:
    files = sorted(FIXTURES.glob("*.jsonl"))
    assert files, "no fixture traces"
    for path in files:
        facts, _ = read_trace(path)
        if path.name.startswith("synthetic-"):
            assert facts.synthetic and facts.description.startswith("SYNTHETIC scenario")
        else:
            assert path.name.startswith("recorded-") and not facts.synthetic
    # The committed files are exactly what the generator writes (written here to a temp folder).
    spec = importlib.util.spec_from_file_location(
        "make_synthetic_traces", FIXTURES / "make_synthetic_traces.py"
    )
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    fresh = {p.name: p.read_bytes() for p in generator.write_all(tmp_path)}
    committed = {p.name: p.read_bytes() for p in files if p.name.startswith("synthetic-")}
    assert fresh == committed


def test_slowdown_reasons_name_only_real_slowdowns() -> None:
    reading = GpuReading(0, "u", 0, 1, clock_event_reasons=0x1 | 0x4 | 0x40)  # idle + power cap + HW thermal
    assert reading.slowdown_reasons() == ["power cap", "thermal (hardware)"]
