"""OOM guard: a CUDA out-of-memory in the first steps halves the micro-batch, doubles accumulation, retries.

The OOM is injected through the runner's FaultInjector seam (a real `torch.OutOfMemoryError` raised before a
forward pass); nothing in torch is patched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rentwise.errors import RentwiseError
from rentwise.training.config import load_config
from rentwise.training.runner import RunOptions, train

from .conftest import write_tiny_run


class OomAbove:
    """Raise a CUDA-style OOM whenever the micro-batch exceeds `limit` (during the first `steps` steps)."""

    def __init__(self, limit: int, steps: int = 100) -> None:
        self.limit, self.steps, self.raised = limit, steps, 0

    def before_micro_step(self, step: int, micro: int, micro_batch: int) -> None:
        if micro_batch > self.limit and step < self.steps:
            self.raised += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_oom_halves_micro_batch_keeps_global_batch_and_logs(tmp_path: Path) -> None:
    config = load_config(write_tiny_run(tmp_path, micro_batch=4, grad_accum=1, max_steps=3))
    faults = OomAbove(limit=1)
    warnings: list[str] = []
    result = train(config, RunOptions(show_progress=False), faults=faults, warn=warnings.append)
    assert result.steps == 3 and faults.raised == 2
    assert warnings == [
        "out of memory at step 0: retrying with micro_batch 2, grad_accum 2 (global batch unchanged)",
        "out of memory at step 0: retrying with micro_batch 1, grad_accum 4 (global batch unchanged)",
    ]
    events = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(e["micro_batch"], e["grad_accum"]) for e in events if e.get("event") == "oom"] == [
        (2, 2),
        (1, 4),
    ]
    progress = json.loads((config.output_dir / "step-000003" / "progress.json").read_text())
    assert (progress["micro_batch"], progress["grad_accum"]) == (1, 4)  # a resume keeps the smaller split


def test_oom_after_the_guard_window_is_not_retried(tmp_path: Path) -> None:
    config = load_config(
        write_tiny_run(tmp_path, micro_batch=2, grad_accum=1, max_steps=3, oom_guard_steps=0)
    )
    with pytest.raises(torch.OutOfMemoryError):
        train(config, RunOptions(show_progress=False), faults=OomAbove(limit=1))


def test_oom_at_micro_batch_one_gives_up_with_advice(tmp_path: Path) -> None:
    config = load_config(write_tiny_run(tmp_path, micro_batch=1, grad_accum=2, max_steps=2))
    with pytest.raises(RentwiseError, match=r"^out of memory at micro_batch 1$") as caught:
        train(config, RunOptions(show_progress=False), faults=OomAbove(limit=0))
    assert caught.value.hint is not None and "gradient_checkpointing" in caught.value.hint
