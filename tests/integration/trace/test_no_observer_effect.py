"""Tracking storages does not change what PyTorch runs (no extra references that defeat in-place paths).

Autograd steals or accumulates gradients in place depending on reference counts; a tracker holding tensors
would change that. Ours holds weak references to storages only: the op sequence is identical to a run whose
dispatch mode merely logs ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rentwise.memory.job import MemoryJob
from rentwise.models.shape import ModelShape
from rentwise.trace.run import record_step
from rentwise.trace.target import CPU_TARGET
from rentwise.trace.tracker import MemoryTracker


class _LoggingTracker(MemoryTracker):
    ops: list[str]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        type(self).ops.append(str(func))
        return super().__torch_dispatch__(func, types, args, kwargs)


class _LoggingOnly(MemoryTracker):
    ops: list[str]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        type(self).ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fake", [False, True])
def test_tracking_does_not_change_the_op_sequence(
    tiny: Callable[[str], ModelShape], monkeypatch: pytest.MonkeyPatch, fake: bool
) -> None:
    job = MemoryJob(method="full", precision="fp32", micro_batch=2, seq_len=32)
    sequences = []
    for tracker_class in (_LoggingTracker, _LoggingOnly):
        tracker_class.ops = []
        monkeypatch.setattr("rentwise.trace.run.MemoryTracker", tracker_class)
        record_step(tiny("llama-tied"), job, CPU_TARGET, fake=fake)
        sequences.append(tracker_class.ops)
    assert sequences[0] == sequences[1]
    assert "aten.add.Tensor" in sequences[0]  # the tied embedding's two gradients, summed out of place
