"""`watch`: sample GPUs (and the host) every few seconds, optionally around a command, and sum the run up.

The loop reads through a `GpuSource`, so the same code follows a live job through NVML or replays a trace.
Time is a seam (`clock`, `sleep`): tests replay traces without waiting.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rentwise.errors import NotFoundError, RentwiseError
from rentwise.machine.advice import IDLE_UTILIZATION_PCT, Advice, AdviceContext, advise
from rentwise.machine.readings import (
    HARDWARE_REASONS,
    REASON_SW_POWER_CAP,
    THERMAL_REASONS,
    GpuReading,
    GpuSource,
    HostReading,
    MachineFacts,
    Sample,
    TraceWriter,
)

# A command that dies of signal N exits 128 + N, as shells report it (POSIX sh "Exit Status").
SIGNAL_EXIT_BASE = 128


@dataclass(frozen=True)
class GpuSummary:
    """One GPU over the whole run. Times are sample intervals during which the condition held."""

    index: int
    name: str
    peak_used_bytes: int
    total_bytes: int
    job_peak_bytes: int | None
    """Peak memory of the watched command's processes on this GPU (None: NVML could not attribute it)."""
    mean_utilization_pct: float | None
    idle_s: float
    throttled_s: float
    """Thermal or hardware slowdown active."""
    power_capped_s: float
    """At the power limit (normal under heavy load at the default limit)."""
    max_temperature_c: float | None
    mean_power_w: float | None


@dataclass(frozen=True)
class WatchSummary:
    """The end-of-run report."""

    duration_s: float
    sample_count: int
    gpus: tuple[GpuSummary, ...]
    advice: tuple[Advice, ...]
    command: tuple[str, ...] = ()
    exit_code: int | None = None
    lost_gpus: tuple[int, ...] = ()
    trace_path: str | None = None
    note: str | None = None
    interrupted: bool = False


class HostReader(Protocol):
    """Anything with `read() -> HostReading`: the psutil `HostSampler`, or a fake in tests."""

    def read(self) -> HostReading: ...


def sample_weights(samples: Sequence[Sample]) -> list[float]:
    """Seconds each sample stands for: the gap to the next one; the last gets the median gap."""
    gaps = [b.t_s - a.t_s for a, b in itertools.pairwise(samples)]
    last = statistics.median(gaps) if gaps else 0.0
    return [*gaps, last] if samples else []


def summarize(
    samples: Sequence[Sample],
    facts: MachineFacts,
    context: AdviceContext,
    command: Sequence[str] = (),
    exit_code: int | None = None,
    trace_path: Path | None = None,
    interrupted: bool = False,
) -> WatchSummary:
    """Peak memory, mean utilisation, idle and throttled time per GPU, and the advice for the whole run."""
    weights = sample_weights(samples)
    names = {g.index: g.name for g in facts.gpus}
    per_gpu: dict[int, list[tuple[GpuReading, float, tuple[int, ...]]]] = {}
    for sample, weight in zip(samples, weights, strict=True):
        for reading in sample.gpus:
            per_gpu.setdefault(reading.index, []).append((reading, weight, sample.job_pids))
    gpus = tuple(
        _summarize_gpu(index, names.get(index, "?"), rows) for index, rows in sorted(per_gpu.items())
    )
    note = None
    if not samples:
        note = "no readings were taken"
    elif not per_gpu:
        note = facts.unavailable or "no GPU answered"
    return WatchSummary(
        duration_s=(samples[-1].t_s - samples[0].t_s + weights[-1]) if samples else 0.0,
        sample_count=len(samples),
        gpus=gpus,
        advice=tuple(advise(samples, context)) if samples else (),
        command=tuple(command),
        exit_code=exit_code,
        lost_gpus=tuple(sorted({i for s in samples for i in s.lost_gpus})),
        trace_path=str(trace_path) if trace_path else None,
        note=note,
        interrupted=interrupted,
    )


def _summarize_gpu(
    index: int, name: str, rows: list[tuple[GpuReading, float, tuple[int, ...]]]
) -> GpuSummary:
    readings = [r for r, _, _ in rows]
    utils = [r.utilization_pct for r in readings if r.utilization_pct is not None]
    temps = [r.temperature_c for r in readings if r.temperature_c is not None]
    powers = [r.power_w for r in readings if r.power_w is not None]
    job_peaks = [_job_bytes(r, pids) for r, _, pids in rows if pids]
    known_job = [b for b in job_peaks if b is not None]
    return GpuSummary(
        index=index,
        name=name,
        peak_used_bytes=max(r.memory_used_bytes for r in readings),
        total_bytes=readings[-1].memory_total_bytes,
        job_peak_bytes=max(known_job) if known_job else None,
        mean_utilization_pct=statistics.fmean(utils) if utils else None,
        idle_s=sum(w for r, w, _ in rows if (r.utilization_pct or 0) <= IDLE_UTILIZATION_PCT),
        throttled_s=sum(
            w for r, w, _ in rows if r.clock_event_reasons & (THERMAL_REASONS | HARDWARE_REASONS)
        ),
        power_capped_s=sum(w for r, w, _ in rows if r.clock_event_reasons & REASON_SW_POWER_CAP),
        max_temperature_c=max(temps) if temps else None,
        mean_power_w=statistics.fmean(powers) if powers else None,
    )


def _job_bytes(reading: GpuReading, pids: Sequence[int]) -> int | None:
    mine = [p for p in reading.processes if p.pid in pids]
    if any(p.used_memory_bytes is None for p in mine):
        return None
    return sum(p.used_memory_bytes or 0 for p in mine)


# ---------------------------------------------------------------------------------------------------------
# The loop


@dataclass
class WatchRun:
    """State of one watch: the samples so far, the child process, the trace writer."""

    source: GpuSource
    interval_s: float
    command: tuple[str, ...] = ()
    record_path: Path | None = None
    host: HostReader | None = None
    context: AdviceContext = dataclasses.field(default_factory=AdviceContext)
    max_duration_s: float | None = None
    on_update: Callable[[Sequence[Sample], list[Advice]], None] | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    process_tree: Callable[[int], tuple[int, ...]] | None = None

    def run(self) -> WatchSummary:
        """Sample until the command ends, the trace runs out, `max_duration_s` passes, or Ctrl-C."""
        facts = self.source.facts()
        writer = TraceWriter(self.record_path, facts) if self.record_path else None
        process = self._start()
        samples: list[Sample] = []
        finished_at: float | None = None
        interrupted = False
        start = self.clock()
        try:
            while True:
                sample = self.source.sample(self.clock() - start)
                if sample is None:
                    break
                sample, alive = self._attach(sample, process)
                samples.append(sample)
                if writer:
                    writer.write(sample)
                if self.on_update:
                    self.on_update(samples, advise(samples, self._context(facts, None)))
                if (process is not None and not alive) or sample.job_alive is False:
                    finished_at = sample.t_s  # a replayed trace says so through job_alive
                    break
                if self.max_duration_s is not None and sample.t_s >= self.max_duration_s:
                    break
                self.sleep(self.interval_s)
        except KeyboardInterrupt:
            interrupted = True
            if process is not None:
                process.terminate()  # Ctrl-C in a terminal already reached it; this covers other cases
        finally:
            if writer:
                writer.close()
        exit_code = self._exit_code(process)
        context = self._context(facts, finished_at)
        return summarize(samples, facts, context, self.command, exit_code, self.record_path, interrupted)

    def _start(self) -> subprocess.Popen[bytes] | None:
        if not self.command:
            return None
        try:
            return subprocess.Popen(list(self.command))
        except FileNotFoundError:
            raise NotFoundError(
                f"cannot run '{self.command[0]}': no such program", hint="check the command after `--`"
            ) from None
        except PermissionError:
            raise RentwiseError(
                f"cannot run '{self.command[0]}': permission denied", hint="is it executable?"
            ) from None

    def _attach(self, sample: Sample, process: subprocess.Popen[bytes] | None) -> tuple[Sample, bool]:
        """Add host readings and the command's process tree to a sample read from the source."""
        host = self.host.read() if self.host else sample.host
        if process is None:
            return dataclasses.replace(sample, host=host), True
        alive = process.poll() is None
        tree = self.process_tree(process.pid) if (alive and self.process_tree) else ()
        pids = tree or ((process.pid,) if alive else ())
        return dataclasses.replace(sample, host=host, job_pids=pids, job_alive=alive), alive

    def _context(self, facts: MachineFacts, finished_at: float | None) -> AdviceContext:
        return dataclasses.replace(
            self.context, facts=facts, job_finished_at_s=finished_at, watching_command=bool(self.command)
        )

    @staticmethod
    def _exit_code(process: subprocess.Popen[bytes] | None) -> int | None:
        if process is None:
            return None
        code = process.wait()
        return SIGNAL_EXIT_BASE - code if code < 0 else code
