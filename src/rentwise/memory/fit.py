"""Which GPUs a job fits on, with headroom, and how many of a card it needs when one is not enough.

A job fits when its predicted nvidia-smi figure (`MemoryBreakdown.total_bytes`: allocated + allocator slack +
CUDA context) is at most the card's usable memory (`GpuSpec.usable_bytes`, nvidia-smi's total).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from rentwise.hardware.catalog import GpuSpec
from rentwise.memory.breakdown import MemoryBreakdown
from rentwise.memory.estimate import estimate_memory
from rentwise.memory.job import MemoryJob
from rentwise.models.shape import ModelShape

GPU_COUNTS = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class GpuFit:
    """How `job` sits on one catalog GPU."""

    gpu: str
    usable_bytes: int
    needed_bytes: int
    """Predicted nvidia-smi figure per GPU with `gpu_count` cards and `strategy`."""
    gpu_count: int
    strategy: str
    fits: bool

    @property
    def headroom_bytes(self) -> int:
        return self.usable_bytes - self.needed_bytes


def scale_out_job(job: MemoryJob, count: int) -> MemoryJob:
    """The usual way to spread `job` over `count` GPUs: ZeRO-3 for training, tensor parallel for inference."""
    if not job.is_training:
        return dataclasses.replace(job, num_gpus=count, tensor_parallel=count)
    sharding = job.sharding if job.sharding in ("zero3", "fsdp") else "zero3"
    return dataclasses.replace(job, num_gpus=count, sharding=sharding)


def fit_on_gpus(
    shape: ModelShape, job: MemoryJob, single: MemoryBreakdown, gpus: Sequence[GpuSpec]
) -> list[GpuFit]:
    """For each GPU: does `single` (the estimate for `job` as given) fit; if not, the fewest cards that do."""
    strategy = _strategy(job)
    scaled: dict[int, MemoryBreakdown] = {}
    fits: list[GpuFit] = []
    for gpu in gpus:
        if single.total_bytes <= gpu.usable_bytes:
            fits.append(GpuFit(gpu.name, gpu.usable_bytes, single.total_bytes, job.num_gpus, strategy, True))
            continue
        no_fit = GpuFit(gpu.name, gpu.usable_bytes, single.total_bytes, job.num_gpus, strategy, False)
        fits.append(_fewest_cards(shape, job, gpu, scaled) or no_fit)
    return sorted(fits, key=lambda f: (not f.fits, f.gpu_count, f.usable_bytes))


def _fewest_cards(
    shape: ModelShape, job: MemoryJob, gpu: GpuSpec, cache: dict[int, MemoryBreakdown]
) -> GpuFit | None:
    if job.num_gpus > 1:
        return None  # the user chose the layout; we do not second-guess it
    for count in GPU_COUNTS:
        if count not in cache:
            cache[count] = estimate_memory(shape, scale_out_job(job, count))
        needed = cache[count].total_bytes
        if needed <= gpu.usable_bytes:
            return GpuFit(
                gpu.name, gpu.usable_bytes, needed, count, _strategy(scale_out_job(job, count)), False
            )
    return None


def _strategy(job: MemoryJob) -> str:
    if job.num_gpus == 1:
        return "1 GPU"
    if not job.is_training:
        return f"tensor parallel {job.tensor_parallel}"
    return f"{job.sharding}" + (f" + offload {job.offload}" if job.offload != "none" else "")
