"""No lost work, bit for bit: runs killed with SIGKILL at random moments (many mid-save) or stopped with
SIGTERM, then restarted until done, end with the same weights and optimizer state as an uninterrupted run.

Kill moments are reproducible: a seeded RNG picks, per kill, whether to wait for the attempt's 1st-3rd
checkpoint write to begin (the runner's RENTWISE_TEST_PAUSE_IN_SAVE seam sleeps after each file, so the kill
lands between files) or for its 1st-5th training step, and then how long to wait before killing. Waiting for
progress within each attempt makes the restarts resume from many different checkpoints.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rentwise.training.checkpoints import inspect_checkpoint

from .conftest import (
    assert_states_equal,
    final_state,
    rentwise_command,
    run_to_completion,
    subprocess_env,
    write_tiny_run,
)

TRIAL_FIELDS = {"max_steps": 40, "checkpoint": {"every_steps": 2, "keep": 2}}
SEAM_ENV = {"RENTWISE_TEST_PAUSE_IN_SAVE": "0.02", "RENTWISE_TEST_STEP_DELAY": "0.02"}


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as handle:
        return subprocess.Popen(
            rentwise_command("train", str(config), "--no-progress"),
            stdout=handle,
            stderr=handle,
            env=subprocess_env(**SEAM_ENV),
        )


def _wait_until(
    condition: Callable[[], bool], process: subprocess.Popen[bytes], timeout_s: float = 60
) -> bool:
    """Poll every 2 ms; False when the process ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.002)
    raise AssertionError("timed out waiting for the training process")


def _logged(out: Path, marker: bytes) -> int:
    """Metrics lines (all attempts) holding `marker`: b'"loss"' for steps, b'"checkpoint"' for saves."""
    path = out / "metrics.jsonl"
    return path.read_bytes().count(marker) if path.exists() else 0


def _saving(out: Path, since: float = 0.0) -> bool:
    """A checkpoint write is in progress: a `.tmp` folder changed after `since` (a stale one from an earlier
    killed attempt does not count; the restarted run removes it when it resumes)."""
    if not out.is_dir():
        return False
    for path in out.iterdir():
        try:
            if path.name.endswith(".tmp") and path.stat().st_mtime >= since:
                return True
        except FileNotFoundError:  # renamed or removed while we looked
            continue
    return False


def _pair(root: Path, method: str) -> tuple[Path, Path]:
    fields = {**TRIAL_FIELDS, "method": {"kind": method, "lora_dropout": 0.1}}
    reference = write_tiny_run(root / "reference", **fields)
    run_to_completion(reference)
    return reference, write_tiny_run(root / "trial", **fields)


@pytest.mark.slow
@pytest.mark.parametrize(("method", "seed"), [("full", 101), ("lora", 202)])
def test_sigkill_at_random_moments_loses_nothing(tmp_path: Path, method: str, seed: int) -> None:
    reference, trial = _pair(tmp_path, method)
    out, log = trial.parent / "out", trial.parent / "attempts.log"
    rng = random.Random(seed)
    kills = mid_save = 0
    while kills < 10:
        started = time.time()
        steps, saves = _logged(out, b'"loss"'), _logged(out, b'"checkpoint"')
        process = _start(trial, log)
        if rng.random() < 0.5:  # during the write of this attempt's 1st, 2nd or 3rd checkpoint
            after = rng.randint(0, 2)

            def writing(after: int = after, saves: int = saves, started: float = started) -> bool:
                return _logged(out, b'"checkpoint"') >= saves + after and _saving(out, since=started)

            alive = _wait_until(writing, process)
        else:  # a little after this attempt's 1st to 5th training step
            target = steps + rng.randint(1, 5)
            alive = _wait_until(lambda target=target: _logged(out, b'"loss"') >= target, process)  # type: ignore[misc]
        delay = rng.uniform(0.0, 0.1)
        time.sleep(delay)
        if not alive or process.poll() is not None:
            pytest.fail(f"run finished after {kills} kills; make the trial longer")
        in_save = _saving(out, since=started)
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
        mid_save += in_save
    assert mid_save >= 2, f"only {mid_save} of {kills} kills landed during a checkpoint write"
    run_to_completion(trial)
    events = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.endswith("}")
    ]
    resumed_at = {e["step"] for e in events if e.get("event") == "resume"}
    assert len(resumed_at) >= 3, f"the restarts resumed only from steps {sorted(resumed_at)}"
    assert_states_equal(final_state(reference.parent / "out"), final_state(out))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["full", "lora"])
def test_sigterm_saves_exits_75_and_resumes_exactly(tmp_path: Path, method: str) -> None:
    reference, trial = _pair(tmp_path, method)
    out = trial.parent / "out"
    for attempt, second_signal in enumerate([False, True]):
        process = subprocess.Popen(
            rentwise_command("train", str(trial), "--no-progress"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=subprocess_env(**SEAM_ENV),
        )
        steps = _logged(out, b'"loss"')
        assert _wait_until(lambda steps=steps: _logged(out, b'"loss"') > steps + 3, process)  # type: ignore[misc]
        process.send_signal(signal.SIGTERM)
        if second_signal:  # a second SIGTERM while the checkpoint is being written changes nothing
            assert _wait_until(lambda: _saving(out, since=time.time() - 1), process)
            process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 75, stderr
        last = stderr.decode().strip().splitlines()[-2:]
        assert last[0].startswith("error: stopped by SIGTERM at step "), (attempt, last)
        assert last[1] == "  hint: rerun the same command to resume"
        step = int(last[0].split("at step ")[1].split(";")[0])
        assert inspect_checkpoint(out / f"step-{step:06d}").state == "valid"
    run_to_completion(trial)
    assert_states_equal(final_state(reference.parent / "out"), final_state(out))
