"""Per-rank memory under FSDP full sharding, traced: FSDP2 `fully_shard` over a fake process group.

The approach of PyTorch's `FSDPMemTracker` tests: a "fake" process-group backend (collectives are no-ops on
shapes) lets FSDP2 run on fake CPU tensors exactly as it would on rank 0 of `world_size` GPUs: sharded
DTensor parameters, all-gathered unsharded parameters per layer in forward and backward, reduce-scattered
gradient shards, optimizer states on the shards. Each decoder layer is one FSDP unit, plus the root (the
wrapping accelerate/torchtitan use). ZeRO-3 is modelled by the same run.

CPU offload is modelled by attribution: the storages that live in host memory under FSDP's CPUOffloadPolicy
(sharded parameters with "optimizer+params"; gradient shards and optimizer states with either offload) are
tagged "host" and left out of the device figures. The per-unit host-to-device copy of a parameter shard
before its all-gather is not counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rentwise.errors import ConfigError
from rentwise.memory.job import MemoryJob


def traced_sharding(job: MemoryJob) -> bool:
    """Whether trace mode runs this job sharded (FSDP/ZeRO-3 over >1 GPU, no tensor parallelism)."""
    return job.data_parallel > 1 and job.sharding in ("fsdp", "zero3") and job.tensor_parallel == 1


@contextmanager
def fake_process_group(world_size: int) -> Iterator[DeviceMesh]:
    """A process group of `world_size` ranks whose collectives do nothing (we are rank 0)."""
    # The fake backend ships with PyTorch for exactly this (FSDPMemTracker's tests use it).
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ConfigError(
            "cannot trace a sharded job inside a process that already has a torch.distributed process group",
            hint="run the trace in a separate process",
        )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, nn.ModuleList):
            return list(module)
    return []


def shard_model(model: nn.Module, mesh: DeviceMesh, param_dtype: torch.dtype | None) -> set[int]:
    """fully_shard every decoder layer, then the root; returns the ids of the FSDP units."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # AMP under FSDP (accelerate's mixed_precision=bf16): parameters all-gathered in the half dtype,
    # gradients reduced in fp32.
    policy = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None
    )
    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return {id(layer) for layer in layers} | {id(model)}
