"""Every advice rule against the synthetic scenario traces, plus the edges (no readings, one sample)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from rentwise.machine import advice
from rentwise.machine.advice import (
    AdviceContext,
    MicroBatchModel,
    advise,
    micro_batch_model_from_totals,
)
from rentwise.machine.readings import MachineFacts, Sample

from .conftest import context_for

Trace = Callable[[str], tuple[MachineFacts, tuple[Sample, ...]]]
GIB = 2**30


def _rules(trace: Trace, name: str, context: AdviceContext | None = None) -> list[tuple[str, str]]:
    facts, samples = trace(name)
    found = advise(samples, context or context_for(facts, samples))
    return [(a.rule, a.severity) for a in found]


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("healthy-training", []),
        ("memory-underused", [("memory_underused", "info")]),
        ("memory-pinned", [("memory_pinned", "warn")]),
        ("input-bound", [("input_bound", "warn")]),
        ("input-bound-cpu-saturated", [("input_bound", "warn")]),
        ("thermal-throttle", [("throttling", "warn")]),
        ("power-limit-lowered", [("throttling", "warn")]),
        ("stuck-job", [("gpu_idle_job_alive", "warn")]),
        ("checkpoint-pause", [("gpu_idle_job_alive", "info")]),
        ("gpu-lost", [("gpu_lost", "critical")]),
        ("idle-instance", [("release_instance", "warn")]),
        ("job-exits-immediately", [("release_instance", "info")]),
        ("no-readings", []),
    ],
)
def test_each_scenario_triggers_exactly_its_rule(
    trace: Trace, scenario: str, expected: list[tuple[str, str]]
) -> None:
    assert _rules(trace, scenario) == expected


def test_messages_carry_the_numbers(trace: Trace) -> None:
    facts, samples = trace("memory-pinned")
    (pinned,) = advise(samples, context_for(facts, samples))
    assert pinned.message == "GPU 0 memory at 98% for 1m 00s"
    assert pinned.action.startswith("halve the micro-batch and double gradient accumulation")
    facts, samples = trace("input-bound-cpu-saturated")
    (bound,) = advise(samples, context_for(facts, samples))
    assert bound.action.startswith("the host CPUs are saturated")
    facts, samples = trace("input-bound")
    (bound,) = advise(samples, context_for(facts, samples))
    assert bound.action.startswith("the data pipeline is the bottleneck")
    facts, samples = trace("thermal-throttle")
    (hot,) = advise(samples, context_for(facts, samples))
    assert (
        hot.message
        == "GPU 0 slowed by thermal (hardware), thermal (software) on 41% of samples, up to 89 °C"  # 37 of 91
    )
    facts, samples = trace("power-limit-lowered")
    (capped,) = advise(samples, context_for(facts, samples))
    assert capped.message == "GPU 0 hits a power limit of 400 W, below its default 700 W"
    facts, samples = trace("stuck-job")
    (stuck,) = advise(samples, context_for(facts, samples))
    assert stuck.action.endswith("`py-spy dump --pid 4242`")
    facts, samples = trace("gpu-lost")
    (lost,) = advise(samples, context_for(facts, samples))
    assert lost.message == "GPU 1 stopped answering during the run"


def test_underused_memory_without_a_job_model_gives_the_free_headroom(trace: Trace) -> None:
    facts, samples = trace("memory-underused")
    (found,) = advise(samples, context_for(facts, samples))
    assert found.message == "GPU 0 used at most 45% of its memory (35.84 GiB of 79.65 GiB) for 2m 00s"
    # 90% of 79.65 GiB minus 35.84 GiB in use
    assert found.action.startswith("raise the micro-batch (about 35.84 GiB is free below a 90% target)")


def test_underused_memory_with_a_job_model_says_how_far_to_raise(trace: Trace) -> None:
    facts, samples = trace("memory-underused")
    # micro-batch 4, 6 GiB per sample by the estimator: the GPU shows 35.84 GiB, so the fixed part is
    # 35.84 - 4 x 6 = 11.84 GiB, and floor((0.9 x 79.65 - 11.84) / 6) = 9.
    model = MicroBatchModel(micro_batch=4, per_sample_bytes=6 * GIB, fixed_bytes=0)
    context = dataclasses.replace(context_for(facts, samples), micro_batch_model=model)
    (found,) = advise(samples, context)
    assert found.action.startswith("raise the micro-batch from 4 to 9 (+6.00 GiB per sample")


def test_micro_batch_model_from_two_estimates() -> None:
    model = micro_batch_model_from_totals(2, total_bytes=20 * GIB, total_next_bytes=23 * GIB)
    assert model == MicroBatchModel(micro_batch=2, per_sample_bytes=3 * GIB, fixed_bytes=14 * GIB)


def test_no_readings_and_a_single_sample_give_no_windowed_advice(trace: Trace) -> None:
    assert advise((), AdviceContext()) == []
    facts, samples = trace("memory-pinned")
    assert advise(samples[:1], context_for(facts, samples[:1])) == []  # one sample covers no window


def test_rules_wait_for_their_window(trace: Trace) -> None:
    facts, samples = trace("memory-underused")
    short = tuple(s for s in samples if s.t_s < 100)  # under the two-minute window
    assert advise(short, context_for(facts, short)) == []


def test_release_instance_stays_quiet_while_a_command_runs(trace: Trace) -> None:
    facts, samples = trace("idle-instance")
    context = AdviceContext(facts=facts, watching_command=True)
    assert advice.release_instance(samples, context) == []


def test_every_rule_is_registered() -> None:
    names = {rule.__name__ for rule in advice.RULES}
    assert names == {
        "gpu_lost",
        "memory_pinned",
        "memory_underused",
        "input_bound",
        "throttling",
        "gpu_idle_job_alive",
        "release_instance",
    }


RECORDED = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "machine").glob("recorded-*.jsonl"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
def test_recorded_traces_replay_without_critical_advice(path: Path) -> None:
    """Real NVML recordings (written by benchmarks/gpu_hardware_check.sh on a GPU machine)."""
    from rentwise.machine.readings import read_trace
    from rentwise.machine.watch import summarize

    facts, samples = read_trace(path)
    assert not facts.synthetic and samples
    summary = summarize(samples, facts, context_for(facts, samples))
    assert summary.gpus and all(g.peak_used_bytes <= g.total_bytes for g in summary.gpus)
    assert not [a for a in summary.advice if a.severity == "critical"]
    if path.name.endswith("-train.jsonl"):
        assert max(g.mean_utilization_pct or 0 for g in summary.gpus) > 10  # the training job used the GPU
