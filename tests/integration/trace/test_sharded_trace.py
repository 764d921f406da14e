"""Per-rank memory under FSDP2 full sharding, traced over a fake process group."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch.distributed as dist

from rentwise.memory.job import MemoryJob
from rentwise.models.shape import ModelShape
from rentwise.trace import CPU_TARGET, trace_memory
from rentwise.trace.run import record_step

SINGLE = MemoryJob(method="full", precision="fp32", micro_batch=2, seq_len=64)
SHARDED = replace(SINGLE, num_gpus=4, sharding="fsdp")


def test_fsdp_shards_weights_and_optimizer_states_per_rank(tiny: Callable[[str], ModelShape]) -> None:
    shape = tiny("llama-gqa")
    single = trace_memory(shape, SINGLE, target=CPU_TARGET).breakdown
    sharded = trace_memory(shape, SHARDED, target=CPU_TARGET).breakdown
    # FSDP2 pads each parameter's dim 0 to a multiple of the world size, so a shard is >= 1/4.
    assert single.weights_bytes / 4 <= sharded.weights_bytes < single.weights_bytes / 4 * 1.05
    buffers = single.weights_bytes - 4 * shape.num_params  # rotary inv_freq: a buffer, not sharded
    assert sharded.optimizer_bytes == 2 * (sharded.weights_bytes - buffers)  # Adam moments of the shards
    assert sharded.allocated_bytes < single.allocated_bytes
    assert any("FSDP2" in note for note in sharded.leaves_out)
    assert not dist.is_initialized()  # the fake process group is torn down


def test_sharded_fake_trace_matches_a_real_cpu_run(tiny: Callable[[str], ModelShape]) -> None:
    # The fake process group's collectives are no-ops on real CPU tensors too, so FSDP2 runs for real.
    shape = tiny("llama-gqa")
    real = record_step(shape, SHARDED, CPU_TARGET, fake=False).tracker
    fake = record_step(shape, SHARDED, CPU_TARGET, fake=True).tracker
    assert [(e.nbytes, e.phase) for e in real.events()] == [(e.nbytes, e.phase) for e in fake.events()]


def test_cpu_offload_moves_shards_grads_and_states_to_the_host(tiny: Callable[[str], ModelShape]) -> None:
    shape = tiny("llama-gqa")
    sharded = trace_memory(shape, SHARDED, target=CPU_TARGET).breakdown
    offloaded = trace_memory(shape, replace(SHARDED, offload="optimizer+params"), target=CPU_TARGET).breakdown
    assert offloaded.optimizer_bytes == offloaded.gradients_bytes == 0
    assert offloaded.weights_bytes < sharded.weights_bytes / 100  # only unsharded buffers stay on the device
    assert offloaded.allocated_bytes < sharded.allocated_bytes
