"""Stop (through the StopFlag seam) and resume in-process: the result equals an uninterrupted run bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

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
