"""Readings -> advice. Each rule is a small named function with its threshold and that threshold's source.

A rule takes the samples seen so far (oldest first) and an `AdviceContext`, and returns zero or more `Advice`.
Rules look at a trailing window so that a brief spike does not trigger them ("for minutes", not "once").
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rentwise.machine.readings import (
    HARDWARE_REASONS,
    REASON_SW_POWER_CAP,
    THERMAL_REASONS,
    GpuReading,
    MachineFacts,
    Sample,
)
from rentwise.units import format_duration, format_gib

if TYPE_CHECKING:
    from rentwise.memory.job import MemoryJob
    from rentwise.models.shape import ModelShape

Severity = Literal["info", "warn", "critical"]

# Issue 6 ("memory below ~70% for minutes"): below this a bigger micro-batch usually fits.
UNDERUSED_MEMORY_FRACTION = 0.70
UNDERUSED_MEMORY_WINDOW_S = 120.0
# nvidia-smi "used" includes the caching allocator's cached blocks (PyTorch docs, CUDA semantics, "Memory
# management"), so >= 97% on most samples means the allocator is at the wall: the next larger batch or
# sequence will OOM.
PINNED_MEMORY_FRACTION = 0.97
PINNED_MEMORY_WINDOW_S = 60.0
# Target when sizing a larger micro-batch: leave 10% for fragmentation and allocator growth.
MICRO_BATCH_TARGET_FRACTION = 0.90
# NVML utilization is the share of time any kernel ran (nvmlUtilization_t.gpu). A compute-bound training step
# keeps a kernel running nearly all the time; a mean under 60% over two minutes means the GPU waits for input.
LOW_UTILIZATION_PCT = 60.0
LOW_UTILIZATION_WINDOW_S = 120.0
# "Idle": no kernel ran in the sample period (nvidia-smi shows 0-1% on an idle card).
IDLE_UTILIZATION_PCT = 1.0
IDLE_JOB_WINDOW_S = 60.0
# Host CPU near saturation while the GPU starves: the data loader is CPU-bound.
BUSY_HOST_CPU_PCT = 90.0
# Disk writes faster than this while the GPU idles: the job is probably writing a checkpoint.
CHECKPOINT_WRITE_BYTES_PER_S = 50e6
# Thermal / hardware slowdown on more than 10% of samples is a card or host problem, not a blip.
THROTTLED_SAMPLE_FRACTION = 0.10
# An enforced power limit 5%+ below the card's default means someone lowered it (nvidia-smi -pl).
LOWERED_POWER_LIMIT_FRACTION = 0.95
# With no command watched, all GPUs idle and empty this long while the instance is billed.
IDLE_INSTANCE_WINDOW_S = 300.0


@dataclass(frozen=True)
class Advice:
    """One finding: what was seen, what to do, and the threshold behind it."""

    rule: str
    severity: Severity
    message: str
    action: str
    gpu_index: int | None = None


@dataclass(frozen=True)
class MicroBatchModel:
    """How a job's memory grows with micro-batch: fixed + micro_batch x per_sample (`rentwise memory`)."""

    micro_batch: int
    per_sample_bytes: int
    fixed_bytes: int


@dataclass(frozen=True)
class AdviceContext:
    facts: MachineFacts | None = None
    job_finished_at_s: float | None = None
    """When the watched command ended (seconds since the start); None while it runs or if none is watched."""
    watching_command: bool = False
    micro_batch_model: MicroBatchModel | None = None


def micro_batch_model_from_totals(
    micro_batch: int, total_bytes: int, total_next_bytes: int
) -> MicroBatchModel:
    """Derive the linear model from two estimates: at `micro_batch` and at `micro_batch + 1`."""
    per_sample = max(total_next_bytes - total_bytes, 1)
    return MicroBatchModel(micro_batch, per_sample, total_bytes - micro_batch * per_sample)


def micro_batch_model_for(shape: ModelShape, job: MemoryJob) -> MicroBatchModel:
    """The linear model from `rentwise memory`'s analytic estimate (nvidia-smi-comparable totals)."""
    from rentwise.memory.estimate import estimate_memory

    now = estimate_memory(shape, job).total_bytes
    bigger = estimate_memory(shape, dataclasses.replace(job, micro_batch=job.micro_batch + 1)).total_bytes
    return micro_batch_model_from_totals(job.micro_batch, now, bigger)


# ---------------------------------------------------------------------------------------------------------
# Helpers


def _trailing(samples: Sequence[Sample], seconds: float) -> list[Sample]:
    """Samples from the last `seconds`, or [] when the recording does not yet cover that long."""
    if not samples or samples[-1].t_s - samples[0].t_s < seconds * 0.9:  # 10% slack for sampling jitter
        return []
    start = samples[-1].t_s - seconds
    return [s for s in samples if s.t_s >= start]


def _gpu_series(samples: Sequence[Sample]) -> dict[int, list[GpuReading]]:
    series: dict[int, list[GpuReading]] = {}
    for sample in samples:
        for reading in sample.gpus:
            series.setdefault(reading.index, []).append(reading)
    return series


def _mean_util(readings: Sequence[GpuReading]) -> float | None:
    values = [r.utilization_pct for r in readings if r.utilization_pct is not None]
    return statistics.fmean(values) if values else None


def _longest_idle_s(samples: Sequence[Sample], index: int) -> float:
    """The longest stretch (seconds) during which GPU `index` ran no kernel."""
    longest, start = 0.0, None
    for sample in samples:
        reading = next((r for r in sample.gpus if r.index == index), None)
        idle = reading is not None and (reading.utilization_pct or 0) <= IDLE_UTILIZATION_PCT
        if idle and start is None:
            start = sample.t_s
        elif not idle:
            start = None
        if start is not None:
            longest = max(longest, sample.t_s - start)
    return longest


# ---------------------------------------------------------------------------------------------------------
# Rules


def memory_underused(samples: Sequence[Sample], context: AdviceContext) -> list[Advice]:
    """Memory below 70% for two minutes while the GPU works: a larger micro-batch fits."""
    window = _trailing(samples, UNDERUSED_MEMORY_WINDOW_S)
    advice: list[Advice] = []
    for index, readings in _gpu_series(window).items():
        busy = (_mean_util(readings) or 0.0) > LOW_UTILIZATION_PCT / 2
        peak = max(readings, key=lambda r: r.memory_used_bytes)
        if not busy or peak.memory_used_fraction >= UNDERUSED_MEMORY_FRACTION:
            continue
        advice.append(
            Advice(
                "memory_underused",
                "info",
                f"GPU {index} used at most {peak.memory_used_fraction:.0%} of its memory "
                f"({format_gib(peak.memory_used_bytes)} of {format_gib(peak.memory_total_bytes)}) "
                f"for {format_duration(UNDERUSED_MEMORY_WINDOW_S)}",
                _raise_micro_batch_action(peak, context.micro_batch_model),
                index,
            )
        )
    return advice


def _raise_micro_batch_action(peak: GpuReading, model: MicroBatchModel | None) -> str:
    if model is None:
        free = MICRO_BATCH_TARGET_FRACTION * peak.memory_total_bytes - peak.memory_used_bytes
        return (
            f"raise the micro-batch (about {format_gib(free)} is free below a 90% target); size it with "
            "`rentwise memory MODEL --batch N`, or give `rentwise watch` the job (--job MODEL and "
            "the memory flags) for a number"
        )
    # Calibrate the fixed part on what the GPU shows, keep the estimator's per-sample slope.
    fixed_observed = peak.memory_used_bytes - model.micro_batch * model.per_sample_bytes
    target = MICRO_BATCH_TARGET_FRACTION * peak.memory_total_bytes
    suggested = max(model.micro_batch, math.floor((target - fixed_observed) / model.per_sample_bytes))
    if suggested <= model.micro_batch:
        return "keep the micro-batch: the next size up would pass 90% of memory by the estimator's slope"
    return (
        f"raise the micro-batch from {model.micro_batch} to {suggested} "
        f"(+{format_gib(model.per_sample_bytes)} per sample by `rentwise memory`, staying under 90%) "
        "and divide gradient accumulation to keep the same effective batch"
    )


def memory_pinned(samples: Sequence[Sample], context: AdviceContext) -> list[Advice]:
    """Memory at 97%+ on most samples of the last minute: one longer batch from an OOM."""
    window = _trailing(samples, PINNED_MEMORY_WINDOW_S)
    advice: list[Advice] = []
    for index, readings in _gpu_series(window).items():
        pinned = [r for r in readings if r.memory_used_fraction >= PINNED_MEMORY_FRACTION]
        if len(pinned) * 2 < len(readings):
            continue
        advice.append(
            Advice(
                "memory_pinned",
                "warn",
                f"GPU {index} memory at {max(r.memory_used_fraction for r in readings):.0%} for "
                f"{format_duration(PINNED_MEMORY_WINDOW_S)}",
                "halve the micro-batch and double gradient accumulation (same effective batch), or enable "
                "gradient checkpointing; if the job never OOMs this can also be PyTorch's allocator cache",
                index,
            )
        )
    return advice


def input_bound(samples: Sequence[Sample], context: AdviceContext) -> list[Advice]:
    """Utilization low while memory is fine: the GPU waits for data."""
    window = _trailing(samples, LOW_UTILIZATION_WINDOW_S)
    if any(s.job_alive is False for s in window):
        return []
    advice: list[Advice] = []
    host_cpu = [s.host.cpu_pct for s in window if s.host is not None]
    cpu_bound = bool(host_cpu) and statistics.fmean(host_cpu) >= BUSY_HOST_CPU_PCT
    for index, readings in _gpu_series(window).items():
        mean = _mean_util(readings)
        memory_ok = max(r.memory_used_fraction for r in readings) < PINNED_MEMORY_FRACTION
        if mean is None or not (IDLE_UTILIZATION_PCT < mean < LOW_UTILIZATION_PCT) or not memory_ok:
            continue
        if _longest_idle_s(window, index) >= IDLE_JOB_WINDOW_S / 2:
            continue  # a long pause (checkpoint, evaluation, stall) is not a slow input pipeline
        action = (
            "the host CPUs are saturated: pre-tokenise the dataset once, or rent more vCPUs per GPU"
            if cpu_bound
            else "the data pipeline is the bottleneck: more DataLoader workers (num_workers), "
            "pin_memory=True, pre-tokenised data on local disk; with several GPUs, check communication "
            "(NCCL) too"
        )
        advice.append(
            Advice(
                "input_bound",
                "warn",
                f"GPU {index} busy only {mean:.0f}% of the time over "
                f"{format_duration(LOW_UTILIZATION_WINDOW_S)}",
                action,
                index,
            )
        )
    return advice


def throttling(samples: Sequence[Sample], context: AdviceContext) -> list[Advice]:
    """Thermal or hardware slowdown on many samples, or a power limit lowered below the card's default."""
    advice: list[Advice] = []
    defaults = {g.index: g.default_power_limit_w for g in context.facts.gpus} if context.facts else {}
    for index, readings in _gpu_series(samples).items():
        slowed = [r for r in readings if r.clock_event_reasons & (THERMAL_REASONS | HARDWARE_REASONS)]
        if readings and len(slowed) / len(readings) > THROTTLED_SAMPLE_FRACTION:
            reasons = sorted({name for r in slowed for name in r.slowdown_reasons() if name != "power cap"})
            hottest = max((r.temperature_c for r in readings if r.temperature_c is not None), default=None)
            heat = f", up to {hottest:.0f} °C" if hottest is not None else ""
            advice.append(
                Advice(
                    "throttling",
                    "warn",
                    f"GPU {index} slowed by {', '.join(reasons)} on {len(slowed) / len(readings):.0%} of "
                    f"samples{heat}",
                    "the card or the host is the problem (cooling, airflow, power supply), not your job: "
                    "ask the provider for another machine",
                    index,
                )
            )
        default = defaults.get(index)
        limits = [r.power_limit_w for r in readings if r.power_limit_w is not None]
        capped = any(r.clock_event_reasons & REASON_SW_POWER_CAP for r in readings)
        if default and limits and capped and min(limits) < LOWERED_POWER_LIMIT_FRACTION * default:
            advice.append(
                Advice(
                    "throttling",
                    "warn",
                    f"GPU {index} hits a power limit of {min(limits):.0f} W, "
                    f"below its default {default:.0f} W",
                    "the limit was lowered (nvidia-smi -pl): ask the provider, or raise it with "
                    f"`sudo nvidia-smi -i {index} -pl {default:.0f}` if you are allowed to",
                    index,
                )
            )
    return advice


def gpu_idle_job_alive(samples: Sequence[Sample], context: AdviceContext) -> list[Advice]:
    """The watched job is alive but its GPUs ran nothing for a minute after being busy: stuck or on I/O."""
    window = _trailing(samples, IDLE_JOB_WINDOW_S)
    if not window or not all(s.job_alive for s in window):
        return []
    earlier = samples[: len(samples) - len(window)]
    was_busy = any((r.utilization_pct or 0) > LOW_UTILIZATION_PCT / 2 for s in earlier for r in s.gpus)
    idle = all((r.utilization_pct or 0) <= IDLE_UTILIZATION_PCT for s in window for r in s.gpus)
    if not (was_busy and idle and window[-1].gpus):
        return []
    writes = [s.host.disk_write_bytes_per_s for s in window if s.host is not None]
    if writes and statistics.fmean(writes) >= CHECKPOINT_WRITE_BYTES_PER_S:
        return [
            Advice(
                "gpu_idle_job_alive",
                "info",
                f"GPUs idle for {format_duration(IDLE_JOB_WINDOW_S)} while the job writes "
                f"{statistics.fmean(writes) / 1e6:.0f} MB/s to disk",
                "probably a checkpoint: if this happens often, checkpoint less often or to faster local disk",
            )
        ]
    pids = ", ".join(str(p) for p in window[-1].job_pids[:3]) or "?"
    return [
        Advice(
            "gpu_idle_job_alive",
            "warn",
            f"the job is alive but its GPUs ran nothing for {format_duration(IDLE_JOB_WINDOW_S)}",
            f"it is stuck or waiting on I/O or the network: look with `py-spy dump --pid {pids}`",
        )
    ]


def release_instance(samples: Sequence[Sample], context: AdviceContext) -> list[Advice]:
    """The job is over (or the GPUs sit empty for five minutes) and the instance is still billed."""
    if context.job_finished_at_s is not None:
        return [
            Advice(
                "release_instance",
                "info",
                f"the job finished at {format_duration(context.job_finished_at_s)}",
                "if nothing else is queued, stop or release the instance now: it is billed until you do",
            )
        ]
    if context.watching_command:
        return []
    window = _trailing(samples, IDLE_INSTANCE_WINDOW_S)
    empty = all(
        s.gpus and all((r.utilization_pct or 0) <= IDLE_UTILIZATION_PCT and not r.processes for r in s.gpus)
        for s in window
    )
    if not window or not empty:
        return []
    return [
        Advice(
            "release_instance",
            "warn",
            f"every GPU has been idle with no process for {format_duration(IDLE_INSTANCE_WINDOW_S)}",
            "if nothing else is queued, stop or release the instance: idle GPUs are billed like busy ones",
        )
    ]


def gpu_lost(samples: Sequence[Sample], context: AdviceContext) -> list[Advice]:
    """A GPU stopped answering (NVML_ERROR_GPU_IS_LOST, usually an Xid 79 'fallen off the bus')."""
    lost = sorted({index for s in samples for index in s.lost_gpus})
    seen = {r.index for s in samples for r in s.gpus}
    vanished = sorted(seen - {r.index for r in samples[-1].gpus}) if samples else []
    gone = sorted(set(lost) | set(vanished))
    if not gone:
        return []
    return [
        Advice(
            "gpu_lost",
            "critical",
            f"GPU {', '.join(str(i) for i in gone)} stopped answering during the run",
            "the hardware failed (see `dmesg | grep -i xid`): resume from the last checkpoint on another "
            "machine and report the instance to the provider",
        )
    ]


RULES: tuple[Callable[[Sequence[Sample], AdviceContext], list[Advice]], ...] = (
    gpu_lost,
    memory_pinned,
    memory_underused,
    input_bound,
    throttling,
    gpu_idle_job_alive,
    release_instance,
)


def advise(samples: Sequence[Sample], context: AdviceContext) -> list[Advice]:
    """Run every rule; critical findings first."""
    order = {"critical": 0, "warn": 1, "info": 2}
    found = [item for rule in RULES for item in rule(samples, context)]
    return sorted(found, key=lambda a: order[a.severity])
