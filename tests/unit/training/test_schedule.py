"""Learning-rate schedules: linear warmup, then constant, linear or cosine decay to zero."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rentwise.training.config import DataConfig, ModelConfig, TrainConfig
from rentwise.training.runner import _lr_lambda


def config(schedule: str, warmup: int) -> TrainConfig:
    fields = {"schedule": schedule, "warmup_steps": warmup, "max_steps": 10}
    return TrainConfig(model=ModelConfig(source="x"), data=DataConfig(path=Path("x")), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_warmup_is_linear_up_to_the_peak(schedule: str) -> None:
    factor = _lr_lambda(config(schedule, warmup=4), total_steps=10)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == 1.0


def test_decays_end_at_zero() -> None:
    linear = _lr_lambda(config("linear", 0), total_steps=10)
    cosine = _lr_lambda(config("cosine", 0), total_steps=10)
    assert linear(5) == 0.5 and linear(10) == 0.0
    assert cosine(5) == pytest.approx(0.5) and cosine(10) == pytest.approx(0.0)
    assert cosine(2) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.2)))
    assert _lr_lambda(config("constant", 0), total_steps=10)(9) == 1.0
