"""Shared helpers for the machine tests: the synthetic scenario traces in tests/fixtures/machine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rentwise.machine.advice import AdviceContext
from rentwise.machine.readings import MachineFacts, Sample, read_trace

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "machine"


@pytest.fixture
def trace() -> Callable[[str], tuple[MachineFacts, tuple[Sample, ...]]]:
    """Load tests/fixtures/machine/synthetic-<name>.jsonl."""

    def _load(name: str) -> tuple[MachineFacts, tuple[Sample, ...]]:
        return read_trace(FIXTURES / f"synthetic-{name}.jsonl")

    return _load


def context_for(facts: MachineFacts, samples: tuple[Sample, ...]) -> AdviceContext:
    """The context watch would build replaying these samples."""
    finished = next((s.t_s for s in samples if s.job_alive is False), None)
    watching = any(s.job_alive is not None for s in samples)
    return AdviceContext(facts=facts, job_finished_at_s=finished, watching_command=watching)
