"""Stop (through the StopFlag seam) and resume in-process: the result equals an uninterrupted run exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rentwise.errors import PreemptedError
from rentwise.training.config import load_config
from rentwise.training.preemption import StopFlag
from rentwise.training.runner import RunOptions, train

from .conftest import assert_states_equal, final_state, write_tiny_run


class StopAtStep:
    """Fault seam that 'sends a signal' when a given optimizer step starts."""

    def __init__(self, flag: StopFlag, step: int) -> None:
        self.flag, self.step = flag, step

    def before_micro_step(self, step: int, micro: int, micro_batch: int) -> None:
        if step == self.step and micro == 0:
            self.flag.set("SIGTERM")


@pytest.mark.parametrize("method", ["full", "lora"])
def test_stop_and_resume_matches_uninterrupted(tmp_path: Path, method: str) -> None:
    fields = {"method": {"kind": method, "lora_dropout": 0.1}, "max_steps": 8}
    straight = load_config(write_tiny_run(tmp_path / "straight", **fields))
    train(straight, RunOptions(show_progress=False))

    interrupted = load_config(write_tiny_run(tmp_path / "interrupted", **fields))
    flag = StopFlag()
    with pytest.raises(PreemptedError, match=r"^stopped by SIGTERM at step 5; checkpoint step-000005 saved"):
        train(interrupted, RunOptions(show_progress=False), faults=StopAtStep(flag, 4), stop=flag)
    result = train(interrupted, RunOptions(show_progress=False))
    assert result.resumed_from == 5 and result.steps == 8
    assert_states_equal(final_state(straight.output_dir), final_state(interrupted.output_dir))


class CrashAtStep:
    """Fault seam: an unexpected error (a stand-in for SIGKILL) when a given step starts."""

    def __init__(self, step: int) -> None:
        self.step = step

    def before_micro_step(self, step: int, micro: int, micro_batch: int) -> None:
        if step == self.step:
            raise RuntimeError("crash")


def test_crash_before_the_first_checkpoint_restarts_identically(tmp_path: Path) -> None:
    # The first attempt writes the random base, then dies with no checkpoint; the restart finds the base
    # on disk and must still start from the same adapters as a run that never crashed.
    fields = {"method": {"kind": "lora"}, "max_steps": 4}
    straight = load_config(write_tiny_run(tmp_path / "straight", **fields))
    train(straight, RunOptions(show_progress=False))
    crashed = load_config(write_tiny_run(tmp_path / "crashed", **fields))
    with pytest.raises(RuntimeError, match="crash"):
        train(crashed, RunOptions(show_progress=False), faults=CrashAtStep(1))
    assert (crashed.output_dir / "base" / "config.json").is_file()
    assert train(crashed, RunOptions(show_progress=False)).resumed_from is None
    assert_states_equal(final_state(straight.output_dir), final_state(crashed.output_dir))


@pytest.mark.parametrize("method", ["full", "lora"])
def test_gradient_checkpointing_gives_the_same_training(tmp_path: Path, method: str) -> None:
    # Recomputing activations in backward must not change the result; torch's checkpoint replays the stashed
    # RNG state, so even the attention dropout of the tiny model draws the same masks.
    fields = {"method": {"kind": method}, "max_steps": 2}
    plain = load_config(write_tiny_run(tmp_path / "plain", **fields))
    checkpointed = load_config(write_tiny_run(tmp_path / "ckpt", gradient_checkpointing=True, **fields))
    train(plain, RunOptions(show_progress=False))
    train(checkpointed, RunOptions(show_progress=False))
    a, b = final_state(plain.output_dir), final_state(checkpointed.output_dir)
    for name, tensor in a["weights"].items():
        assert torch.allclose(tensor, b["weights"][name], atol=1e-6), name
