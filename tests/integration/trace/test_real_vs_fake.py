"""The fake trace equals a real CPU execution of the same step, byte for byte (issue 3's exactness bar).

Both runs use the same tracker and the same code; only the tensors differ (real CPU storage vs FakeTensor).
The whole allocation/free sequence is compared, so the peak (and every phase's peak) must match too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from rentwise.memory.job import MemoryJob
from rentwise.models.shape import ModelShape
from rentwise.trace.run import record_step
from rentwise.trace.target import CPU_TARGET

BASE = MemoryJob(method="full", precision="fp32", micro_batch=2, seq_len=48, attention="sdpa")

SLOW = pytest.mark.slow
# The variants (full / LoRA / checkpointed / eager vs sdpa) run by default; the rest are slow.
VARIANTS: list[tuple[str, MemoryJob] | Any] = [
    ("llama-gqa", BASE),
    ("llama-gqa", replace(BASE, method="lora")),
    ("llama-gqa", replace(BASE, grad_checkpointing=True)),
    ("llama-gqa", replace(BASE, attention="eager")),
    ("llama-gqa", replace(BASE, method="lora", attention="eager", grad_checkpointing=True)),
    ("llama-gqa", replace(BASE, method="inference", seq_len=32, generate_len=3)),
]
VARIANTS += [
    pytest.param(model, job, marks=SLOW)
    for model, job in [
        ("llama-gqa", replace(BASE, precision="bf16")),
        ("llama-gqa", replace(BASE, method="lora", precision="amp_bf16", lora_targets=("all-linear",))),
        ("llama-gqa", replace(BASE, optimizer="sgd_momentum")),
        ("llama-gqa", replace(BASE, optimizer="adafactor")),
        ("llama-tied", replace(BASE, lora_rank=4, method="lora", lora_dropout=0.1)),
        ("llama-tied", BASE),
        ("qwen2-bias", replace(BASE, method="lora", lora_targets=("all-linear",), grad_checkpointing=True)),
    ]
]


def _events(shape: ModelShape, job: MemoryJob, fake: bool) -> tuple[list[tuple[int, str]], int]:
    tracker = record_step(shape, job, CPU_TARGET, fake=fake).tracker
    return [(e.nbytes, e.phase) for e in tracker.events()], tracker.peak().peak_bytes


@pytest.mark.parametrize(("model", "job"), VARIANTS)
def test_fake_trace_matches_real_cpu_run_byte_for_byte(
    tiny: Callable[[str], ModelShape], model: str, job: MemoryJob
) -> None:
    shape = tiny(model)
    real_events, real_peak = _events(shape, job, fake=False)
    fake_events, fake_peak = _events(shape, job, fake=True)
    assert fake_peak == real_peak
    assert fake_events == real_events
    assert real_peak > 0


@pytest.mark.slow
def test_moe_peak_matches_real_cpu_run(tiny: Callable[[str], ModelShape]) -> None:
    # Routing is balanced in both runs (build._balanced_experts_forward). The sequences differ only inside
    # one_hot, whose CPU kernel allocates 8-byte min/max scalars the fake decomposition does not; the peak
    # and every phase's peak still match.
    shape = tiny("mixtral-moe")
    real = record_step(shape, BASE, CPU_TARGET, fake=False).tracker.peak()
    fake = record_step(shape, BASE, CPU_TARGET, fake=True).tracker.peak()
    assert (fake.peak_bytes, fake.phase_peaks) == (real.peak_bytes, real.phase_peaks)


def test_the_comparison_can_fail(tiny: Callable[[str], ModelShape]) -> None:
    # Guard against a comparison that is vacuously true: a different step gives a different sequence.
    shape = tiny("llama-gqa")
    assert _events(shape, BASE, fake=True) != _events(shape, replace(BASE, seq_len=64), fake=True)
