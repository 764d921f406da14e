"""The watch loop and its summary: replayed traces, real child commands, a vanished GPU, Ctrl-C."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rentwise.errors import NotFoundError
from rentwise.machine.readings import MachineFacts, Sample, TraceSource, read_trace
from rentwise.machine.watch import WatchRun, sample_weights, summarize

from .conftest import context_for

Trace = Callable[[str], tuple[MachineFacts, tuple[Sample, ...]]]
GIB = 2**30


def _replay(trace: Trace, name: str) -> TraceSource:
    facts, samples = trace(name)
    return TraceSource(facts_=facts, samples=samples)


def _no_sleep(_: float) -> None:
    return None


def test_summary_of_a_healthy_run(trace: Trace) -> None:
    facts, samples = trace("healthy-training")
    summary = summarize(samples, facts, context_for(facts, samples))
    (gpu,) = summary.gpus
    assert summary.sample_count == 151
    assert summary.duration_s == pytest.approx(302.0)  # 150 gaps of 2 s + the last sample's 2 s
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.peak_used_bytes == int(0.88 * 81559 * 2**20)
    assert gpu.job_peak_bytes == gpu.peak_used_bytes - 512 * 2**20  # the job's process, not the context
    assert gpu.mean_utilization_pct == pytest.approx(97.0, abs=0.5)
    assert gpu.idle_s == 0 and gpu.throttled_s == 0
    assert gpu.power_capped_s == pytest.approx(31 * 2.0)  # every fifth sample at the power cap
    assert summary.advice == ()


def test_summary_counts_idle_and_throttled_time(trace: Trace) -> None:
    facts, samples = trace("stuck-job")
    (gpu,) = summarize(samples, facts, context_for(facts, samples)).gpus
    assert gpu.idle_s == pytest.approx(122.0)  # samples at t = 120 .. 240, 2 s each
    facts, samples = trace("thermal-throttle")
    (gpu,) = summarize(samples, facts, context_for(facts, samples)).gpus
    assert gpu.throttled_s == pytest.approx(37 * 2.0)


def test_summary_without_readings() -> None:
    summary = summarize((), MachineFacts(source="none"), context_for(MachineFacts(source="none"), ()))
    assert summary.note == "no readings were taken" and summary.duration_s == 0 and summary.gpus == ()
    no_gpu = MachineFacts(source="none", unavailable="no NVIDIA driver/NVML")
    summary = summarize((Sample(0.0, ()),), no_gpu, context_for(no_gpu, ()))
    assert summary.note == "no NVIDIA driver/NVML"


def test_sample_weights() -> None:
    samples = [Sample(t, ()) for t in (0.0, 2.0, 5.0)]
    assert sample_weights(samples) == [2.0, 3.0, 2.5]
    assert sample_weights([]) == []
    assert sample_weights(samples[:1]) == [0.0]


def test_replay_of_a_gpu_that_disappears(trace: Trace) -> None:
    summary = WatchRun(source=_replay(trace, "gpu-lost"), interval_s=2.0, sleep=_no_sleep).run()
    assert summary.lost_gpus == (1,)
    assert [g.index for g in summary.gpus] == [0, 1]
    assert summary.advice[0].rule == "gpu_lost"


def test_command_that_exits_immediately(trace: Trace, tmp_path: Path) -> None:
    record = tmp_path / "run.jsonl"
    run = WatchRun(
        source=_replay(trace, "healthy-training"),
        interval_s=0.05,
        command=(sys.executable, "-c", "pass"),
        record_path=record,
        sleep=time.sleep,
    )
    summary = run.run()
    assert summary.exit_code == 0
    assert summary.sample_count <= 40  # stops once the command is gone, not at the end of the trace
    assert summary.advice[-1].rule == "release_instance"
    facts, recorded = read_trace(record)
    assert facts.synthetic  # the facts came from the replayed (synthetic) source
    assert len(recorded) == summary.sample_count and recorded[-1].job_alive is False


def test_command_that_fails_passes_its_exit_code_through(trace: Trace) -> None:
    run = WatchRun(
        source=_replay(trace, "healthy-training"),
        interval_s=0.05,
        command=(sys.executable, "-c", "import sys; sys.exit(3)"),
        sleep=time.sleep,
    )
    assert run.run().exit_code == 3


def test_command_killed_by_a_signal_reports_128_plus_n(trace: Trace) -> None:
    if sys.platform == "win32":
        pytest.skip("POSIX signals")
    run = WatchRun(
        source=_replay(trace, "healthy-training"),
        interval_s=0.05,
        command=(sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"),
        sleep=time.sleep,
    )
    assert run.run().exit_code == 128 + 15


def test_missing_program_is_a_not_found_error(trace: Trace) -> None:
    run = WatchRun(source=_replay(trace, "healthy-training"), interval_s=1, command=("no-such-program-xyz",))
    with pytest.raises(NotFoundError, match=r"^cannot run 'no-such-program-xyz': no such program$"):
        run.run()


def test_ctrl_c_stops_the_loop_and_still_summarises(trace: Trace) -> None:
    calls = []

    def interrupt_on_third(_: float) -> None:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    summary = WatchRun(
        source=_replay(trace, "healthy-training"), interval_s=2.0, sleep=interrupt_on_third
    ).run()
    assert summary.interrupted and summary.sample_count == 3


def test_max_duration(trace: Trace) -> None:
    summary = WatchRun(
        source=_replay(trace, "idle-instance"), interval_s=2.0, max_duration_s=10, sleep=_no_sleep
    ).run()
    assert summary.sample_count == 6  # t = 0, 2, ..., 10


def test_on_update_sees_every_sample(trace: Trace) -> None:
    seen: list[int] = []
    WatchRun(
        source=_replay(trace, "memory-pinned"),
        interval_s=2.0,
        sleep=_no_sleep,
        on_update=lambda samples, advice: seen.append(len(samples)),
    ).run()
    assert seen == list(range(1, 62))
