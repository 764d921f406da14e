from __future__ import annotations

import math
from pathlib import Path

import pytest

from rentwise.errors import ConfigError, NotFoundError
from rentwise.planning.job import JobSpec, count_dataset_tokens, tokens_from_samples


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(ConfigError) as raised:
        JobSpec(model="m", method="sft", tokens=0, epochs=-1, billings=("hourly",), utilisation=2.0)
    message = raised.value.message
    expected = ("method 'sft'", "billing 'hourly'", "the job has no data", "epochs must be a positive",
                "mfu is a share of peak")  # fmt: skip
    for part in expected:
        assert part in message


def test_precision_follows_the_method_unless_given() -> None:
    assert JobSpec(model="m", method="full", tokens=1).precision_for("full") == "amp_bf16"
    assert JobSpec(model="m", method="lora", tokens=1).precision_for("lora") == "bf16"
    assert JobSpec(model="m", method="full", tokens=1).precision_for("qlora") == "bf16"
    assert JobSpec(model="m", method="lora", tokens=1, precision="fp32").precision_for("full") == "fp32"


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_numbers_are_rejected(value: float) -> None:
    with pytest.raises(ConfigError) as raised:
        JobSpec(
            model="m", tokens=1, eval_fraction=value, snapshot_months=value, restart_s=value, epochs=value
        )
    assert raised.value.message == (
        f"epochs must be a positive number, got {value}; eval fraction must be a finite number, 0 or more, "
        f"got {value}; snapshot months must be a finite number, 0 or more, got {value}; restart time must be "
        f"a finite number, 0 or more, got {value}"
    )


def test_methods_to_try_only_get_lighter() -> None:
    assert JobSpec(model="m", method="full", tokens=1).methods_to_try() == ("full",)
    changeable = JobSpec(model="m", method="full", tokens=1, allow_method_change=True)
    assert changeable.methods_to_try() == ("full", "lora", "qlora")
    assert JobSpec(model="m", method="lora", tokens=1, allow_method_change=True).methods_to_try() == (
        "lora",
        "qlora",
    )


def test_total_tokens_and_samples() -> None:
    assert JobSpec(model="m", tokens=1000, epochs=2.5).total_tokens == 2500
    assert tokens_from_samples(20_000, 512) == 10_240_000
    with pytest.raises(ConfigError):
        tokens_from_samples(0, 512)


def test_dataset_tokens_fall_back_to_stated_approximation(tmp_path: Path) -> None:
    path = tmp_path / "d.txt"
    path.write_text("x" * 4001)
    counted = count_dataset_tokens(path, tokenizer_id=None)
    assert counted.tokens == 1001  # ceil(4001 / 4)
    assert counted.method == "chars/4 approximation"
    with pytest.raises(NotFoundError):
        count_dataset_tokens(tmp_path / "missing.txt")
