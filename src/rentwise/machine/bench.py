"""`bench`: fixed, short, repeatable GPU measurements (needs torch; CUDA for the real thing).

Dense matmul TFLOPS per dtype (2·n³ FLOPs per n×n×n product), device memory bandwidth (a copy reads and writes
every byte: 2·size per copy, BabelStream's convention), host<->device and GPU<->GPU copies (size per copy).
Each figure is repeated K times; NVML is sampled in the background meanwhile (clocks, power, slowdown reasons,
other processes). Timing: synchronise, wall clock around a loop long enough (~0.2 s) that launch overhead
and the clock's resolution do not matter.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rentwise.errors import RentwiseError, require_extra
from rentwise.machine.readings import GpuFacts, GpuSource, Sample
from rentwise.machine.verdict import BenchResult, Measurement
from rentwise.units import GIB, MIB

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "tf32": "float32", "fp32": "float32"}


@dataclass(frozen=True)
class BenchConfig:
    """What to run. Defaults finish in well under 60 s on a datacenter GPU (see docs/machine.md)."""

    repeats: int = 5
    matmul_n: int = 8192
    """Square size: 8192 reaches the dense roofline on A100/H100-class cards (arithmetic intensity n/3
    FLOP/byte in bf16 ≈ 2700, far above the ~150-300 ridge points of those cards)."""
    matmul_dtypes: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp32")
    copy_bytes: int = GIB
    host_copy_bytes: int = 256 * MIB
    seconds_per_repeat: float = 0.2
    sample_interval_s: float = 0.2


QUICK = BenchConfig(
    repeats=3, matmul_n=4096, copy_bytes=256 * MIB, host_copy_bytes=64 * MIB, seconds_per_repeat=0.1
)


class BackgroundSampler:
    """Reads the `GpuSource` every `interval_s` on a thread while the benchmark runs (NVML is thread-safe)."""

    def __init__(self, source: GpuSource, interval_s: float) -> None:
        self._source, self._interval = source, interval_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._start = time.monotonic()

    def __enter__(self) -> BackgroundSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            sample = self._source.sample(time.monotonic() - self._start)
            if sample is not None:
                self.samples.append(sample)
            self._stop.wait(self._interval)


def run_bench(
    source: GpuSource,
    config: BenchConfig = BenchConfig(),
    gpu_index: int = 0,
    device: str | None = None,
    on_progress: Callable[[str], None] = lambda _: None,
) -> BenchResult:
    """Run every measurement on one GPU (or on `device="cpu"` in tests) and return the raw result."""
    require_extra("torch", "train")
    import torch

    target = device or f"cuda:{gpu_index}"
    if target.startswith("cuda") and not torch.cuda.is_available():
        raise RentwiseError(
            "cannot benchmark: torch sees no CUDA GPU", hint="run `rentwise doctor` to see why"
        )
    if target.startswith("cuda") and gpu_index >= torch.cuda.device_count():
        raise RentwiseError(
            f"no GPU {gpu_index}: torch sees {torch.cuda.device_count()}", hint="pick one with --gpu INDEX"
        )
    facts = source.facts()
    gpu = _gpu_facts(facts.gpus, gpu_index, target)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    baseline = source.sample(0.0)  # before any CUDA context of ours exists
    with BackgroundSampler(source, config.sample_interval_s) as sampler:
        measurements = _measure_all(torch, config, target, on_progress)
    peer = next((link for a, b, link in facts.topology if {a, b} == {gpu_index, (gpu_index + 1)}), None)
    return BenchResult(
        gpu=gpu,
        measurements=tuple(measurements),
        samples=tuple(sampler.samples),
        own_pids=(os.getpid(),),
        started_at=started,
        torch_version=str(torch.__version__),
        cuda_build=str(torch.version.cuda or ""),
        peer_link=peer,
        baseline=baseline,
    )


def _gpu_facts(gpus: tuple[GpuFacts, ...], index: int, target: str) -> GpuFacts:
    for gpu in gpus:
        if gpu.index == index:
            return gpu
    if target == "cpu":
        return GpuFacts(index=index, name="cpu", uuid="", memory_total_bytes=0)
    import torch  # NVML unavailable but CUDA works (rare): identify the card through torch

    props = torch.cuda.get_device_properties(index)
    return GpuFacts(
        index=index,
        name=props.name,
        uuid="",
        memory_total_bytes=int(props.total_memory),
        compute_capability=f"{props.major}.{props.minor}",
    )


def _measure_all(
    torch: Any, config: BenchConfig, target: str, progress: Callable[[str], None]
) -> list[Measurement]:
    measurements = []
    is_cuda = target.startswith("cuda")
    for dtype in config.matmul_dtypes:
        if dtype == "bf16" and is_cuda and not _native_bf16(torch):
            progress("skipping bf16 matmul: this GPU has no bf16 tensor cores (torch would emulate it)")
            continue
        progress(f"matmul {dtype} {config.matmul_n}³ x{config.repeats}")
        measurements.append(measure_matmul(torch, dtype, config, target))
    progress(f"device copy {config.copy_bytes // MIB} MiB x{config.repeats}")
    measurements.append(measure_device_copy(torch, config, target))
    if is_cuda:
        progress(f"host<->device copies {config.host_copy_bytes // MIB} MiB x{config.repeats}")
        measurements.extend(measure_host_copies(torch, config, target))
        if torch.cuda.device_count() > 1:
            progress("GPU-to-GPU copy")
            measurements.append(measure_peer_copy(torch, config, target))
    return measurements


def _native_bf16(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch < 2.3 has no including_emulation and reports native support only
        return bool(torch.cuda.is_bf16_supported())


def _synchronize(torch: Any, target: str) -> None:
    if target.startswith("cuda"):
        torch.cuda.synchronize()


def _repeat(
    torch: Any, target: str, step: Callable[[], None], config: BenchConfig
) -> list[tuple[int, float]]:
    """Warm up, size the loop to ~`seconds_per_repeat`, then time `repeats` loops: [(iterations, seconds)]."""
    for _ in range(2):
        step()
    _synchronize(torch, target)
    start = time.perf_counter()
    step()
    _synchronize(torch, target)
    once = max(time.perf_counter() - start, 1e-6)
    iterations = max(1, min(10_000, math.ceil(config.seconds_per_repeat / once)))
    timings = []
    for _ in range(config.repeats):
        _synchronize(torch, target)
        start = time.perf_counter()
        for _ in range(iterations):
            step()
        _synchronize(torch, target)
        timings.append((iterations, time.perf_counter() - start))
    return timings


def measure_matmul(torch: Any, dtype: str, config: BenchConfig, target: str) -> Measurement:
    """Dense n×n @ n×n: 2·n³ FLOPs per product. tf32 = fp32 tensors with TF32 allowed; fp32 = IEEE fp32."""
    n = config.matmul_n
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(n, n, device=target).to(torch_dtype)
    b = torch.randn(n, n, device=target).to(torch_dtype)
    out = torch.empty(n, n, device=target, dtype=torch_dtype)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        timings = _repeat(torch, target, lambda: torch.mm(a, b, out=out), config)
    finally:
        torch.set_float32_matmul_precision(previous)
    flops = 2 * n**3
    values = tuple(flops * iters / seconds / 1e12 for iters, seconds in timings)
    return Measurement(f"matmul_{dtype}", "TFLOPS", values, f"{n}x{n}x{n}")


def measure_device_copy(torch: Any, config: BenchConfig, target: str) -> Measurement:
    """dst.copy_(src) within one device: reads and writes `copy_bytes` each, so 2·size bytes move."""
    src = torch.empty(config.copy_bytes, dtype=torch.uint8, device=target)
    dst = torch.empty_like(src)
    timings = _repeat(torch, target, lambda: dst.copy_(src), config)
    values = tuple(2 * config.copy_bytes * iters / seconds / 1e9 for iters, seconds in timings)
    return Measurement("device_copy", "GB/s", values, f"{config.copy_bytes // MIB} MiB")


def measure_host_copies(torch: Any, config: BenchConfig, target: str) -> list[Measurement]:
    """Pinned host memory <-> device, each direction on its own: size bytes per copy."""
    host = torch.empty(config.host_copy_bytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(config.host_copy_bytes, dtype=torch.uint8, device=target)
    size = f"{config.host_copy_bytes // MIB} MiB pinned"
    results = []
    for name, step in (
        ("host_to_device", lambda: device.copy_(host, non_blocking=True)),
        ("device_to_host", lambda: host.copy_(device, non_blocking=True)),
    ):
        timings = _repeat(torch, target, step, config)
        values = tuple(config.host_copy_bytes * iters / seconds / 1e9 for iters, seconds in timings)
        results.append(Measurement(name, "GB/s", values, size))
    return results


def measure_peer_copy(torch: Any, config: BenchConfig, target: str) -> Measurement:
    """This GPU -> the next one: size bytes per copy, over NVLink or PCIe peer-to-peer as the driver picks."""
    index = int(target.split(":")[1])
    other = f"cuda:{(index + 1) % torch.cuda.device_count()}"
    src = torch.empty(config.host_copy_bytes, dtype=torch.uint8, device=target)
    dst = torch.empty(config.host_copy_bytes, dtype=torch.uint8, device=other)
    timings = _repeat(torch, target, lambda: dst.copy_(src), config)
    values = tuple(config.host_copy_bytes * iters / seconds / 1e9 for iters, seconds in timings)
    return Measurement("gpu_to_gpu", "GB/s", values, f"{config.host_copy_bytes // MIB} MiB {target}->{other}")
