"""Trace mode: exact memory of one real training (or inference) step of the real Hugging Face model, run on
fake tensors: no GPU, no weights. Needs the `rentwise[trace]` extra (torch, transformers, peft).

`trace_memory(shape, job)` builds the model on the meta device, materialises it as `FakeTensor`s, runs one
step under a storage-counting `TorchDispatchMode`, and reports the peak as a `MemoryBreakdown`
(source="trace"), with the GPU's attention kernel, kernel workspaces and caching allocator modelled
(see `target.py`). Importing this package does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable

from rentwise.errors import require_extra
from rentwise.memory.job import MemoryJob
from rentwise.models.shape import ModelShape
from rentwise.trace.result import TimelineEvent, TraceResult
from rentwise.trace.target import CPU_TARGET, TraceTarget, target_from_gpu

__all__ = ["CPU_TARGET", "TimelineEvent", "TraceResult", "TraceTarget", "target_from_gpu", "trace_memory"]


def trace_memory(
    shape: ModelShape,
    job: MemoryJob,
    *,
    target: TraceTarget | None = None,
    progress: Callable[[str], None] | None = None,
    keep_timeline: bool = False,
) -> TraceResult:
    """Trace one step of `job` on `shape` with fake tensors and return its peak memory per device.

    Raises MissingExtraError without torch/transformers (and peft for LoRA/QLoRA), ConfigError when the
    model cannot be built for this job.
    """
    require_extra("torch", "trace")
    require_extra("transformers", "trace")
    if job.uses_adapter:
        require_extra("peft", "trace")
    from rentwise.trace.run import run_trace

    return run_trace(shape, job, target or TraceTarget(), progress=progress, keep_timeline=keep_timeline)
