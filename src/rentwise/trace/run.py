"""Run one traced step and turn the tracker's records into a `TraceResult`.

`record_step` is shared by the fake trace and by the exactness tests, which run the very same code on real
CPU tensors (`fake=False`) and compare the peaks byte for byte.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from torch._subclasses.fake_tensor import FakeTensorMode

from rentwise.memory.breakdown import MemoryBreakdown, Phase
from rentwise.memory.job import MemoryJob
from rentwise.models.shape import ModelShape
from rentwise.trace.allocator import AllocatorStats, simulate
from rentwise.trace.build import build_model, materialise
from rentwise.trace.kernels import target_sdpa, workspace_model
from rentwise.trace.result import TimelineEvent, TraceResult
from rentwise.trace.shard import fake_process_group, shard_model, traced_sharding
from rentwise.trace.step import run_inference, run_training_step
from rentwise.trace.target import TraceTarget
from rentwise.trace.tracker import CATEGORY_FIELDS, MemoryTracker, ModuleAttribution

TOP_MODULES = 10
_PEFT_PREFIX = "base_model.model."


@contextlib.contextmanager
def _unpacked_batches() -> Iterator[None]:
    """Tell transformers the batch holds one sequence per row, as it concludes on real tensors.

    `masking_utils.find_packed_sequence_indices` reads position_ids values to detect packed sequences; on
    fake tensors it cannot, assumes packing, and builds a full mask (which would also rule out flash
    attention). Our steps never pack, so the answer is None, as a real run finds.
    """
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


@dataclass
class RecordedStep:
    """The tracker after one step, and which attention kernels ran."""

    tracker: MemoryTracker
    attention_kernels: dict[str, int]


def record_step(
    shape: ModelShape,
    job: MemoryJob,
    target: TraceTarget,
    *,
    fake: bool = True,
    progress: Callable[[str], None] | None = None,
) -> RecordedStep:
    """Build the model, materialise it (fake or real CPU tensors) and run one step under the tracker."""
    if progress:
        progress("building model")
    built = build_model(shape, job)
    tracker = MemoryTracker(workspace_model(target))
    tracker.is_logits_module = built.is_logits_module
    attribution = ModuleAttribution(tracker)
    chosen: dict[str, int] = {}
    tensor_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    sharded = traced_sharding(job)
    group = fake_process_group(job.data_parallel) if sharded else contextlib.nullcontext()
    with group as mesh, tensor_mode, tracker, target_sdpa(target, chosen), _unpacked_batches():
        if progress:
            progress("materialising fake weights" if fake else "materialising weights")
        materialise(built.model, tracker)
        if mesh is not None:
            if progress:
                progress(f"sharding over {job.data_parallel} ranks (FSDP2)")
            attribution.sharded_units = shard_model(built.model, mesh, built.autocast_dtype)
            if job.offload == "optimizer+params":
                for param in built.model.parameters():
                    tracker.retag(param, "host")
        attribution.attach(built.model)
        try:
            if job.is_training:
                run_training_step(built, job, tracker, attribution, progress)
            else:
                run_inference(built, job, tracker, progress)
        finally:
            attribution.detach()
    return RecordedStep(tracker, chosen)


def _short(module: str) -> str:
    """Module names as in the plain HF model; the top-level CausalLM module (loss, logits upcast) named so."""
    if module in ("", "base_model", _PEFT_PREFIX.rstrip(".")):
        return "(top level: loss)"
    return module.removeprefix(_PEFT_PREFIX)


def _leaves_out(shape: ModelShape, job: MemoryJob, target: TraceTarget) -> tuple[str, ...]:
    notes = [
        "CUDA autocast is emulated by CPU autocast (same casts for matmul/linear/sdpa; the HF models upcast "
        "norms, softmax and loss explicitly)",
        "kernel-internal buffers other than flash-attention backward and cuBLAS workspaces (e.g. "
        "memory-efficient attention backward, cuDNN) are not counted",
    ]
    if traced_sharding(job):
        notes.append(
            f"per rank of {job.data_parallel} under FSDP2 full sharding (each decoder layer a unit; ZeRO-3 "
            "modelled the same way); collectives' internal buffers (NCCL) not counted"
        )
        if job.offload != "none":
            notes.append(
                f"offload {job.offload}: offloaded shards counted as host memory; H2D copies not counted"
            )
    elif job.num_gpus > 1:
        notes.append(
            f"multi-GPU not traced: this is one device holding the whole model; {job.sharding} sharding over "
            f"{job.num_gpus} GPUs is not applied in trace mode"
        )
    if job.method == "qlora":
        notes.append(
            "QLoRA: bitsandbytes storage emulated (NF4, blocksize 64); MoE expert tensors stay unquantised"
        )
    if not target.simulate_allocator:
        notes.append("caching-allocator slack not modelled")
    return tuple(notes)


def run_trace(
    shape: ModelShape,
    job: MemoryJob,
    target: TraceTarget,
    *,
    progress: Callable[[str], None] | None = None,
    keep_timeline: bool = False,
) -> TraceResult:
    """Trace one step of `job` and summarise its peak as a `TraceResult`."""
    start = time.perf_counter()
    recorded = record_step(shape, job, target, progress=progress)
    tracker = recorded.tracker
    peak = tracker.peak()
    events = tracker.step_events()
    stats: AllocatorStats | None = None
    if target.is_cuda and target.simulate_allocator:
        if progress:
            progress("simulating the caching allocator")
        stats = simulate(events, target.memory_bytes)
    by_field = {field: peak.by_category.get(category, 0) for category, field in CATEGORY_FIELDS.items()}
    slack = max(0, stats.max_reserved_bytes - peak.peak_bytes) if stats else 0
    phase: Phase = peak.peak_phase if peak.peak_phase != "setup" else "forward"  # type: ignore[assignment]
    breakdown = MemoryBreakdown(
        **by_field,
        allocator_slack_bytes=slack,
        cuda_context_bytes=target.cuda_context_bytes if target.is_cuda else 0,
        peak_phase=phase,
        source="trace",
        phase_peaks=peak.phase_peaks,
        leaves_out=_leaves_out(shape, job, target),
    )
    by_label: dict[str, int] = {}
    for name, size in peak.by_module.items():
        by_label[_short(name)] = by_label.get(_short(name), 0) + size
    modules = sorted(by_label.items(), key=lambda item: -item[1])[:TOP_MODULES]
    timeline = None
    if keep_timeline:
        timeline = tuple(
            TimelineEvent(
                e.key, e.nbytes, e.phase, tracker.records[e.key].category, tracker.records[e.key].module
            )
            for e in events
        )
    return TraceResult(
        breakdown=breakdown,
        peak_phase=phase,
        peak_module=_short(peak.peak_module),
        top_modules=tuple(modules),
        attention_kernels=tuple(sorted(recorded.attention_kernels.items())),
        allocator_max_allocated_bytes=stats.max_allocated_bytes if stats else None,
        allocator_max_reserved_bytes=stats.max_reserved_bytes if stats else None,
        allocator_segments=stats.segments if stats else None,
        target=target.name,
        elapsed_s=time.perf_counter() - start,
        notes=("caching allocator predicts an out-of-memory error on this card",)
        if stats and stats.out_of_memory
        else (),
        timeline=timeline,
    )
