"""Two processes (`accelerate launch --num_processes 2`, CPU/gloo): SIGTERM to the launcher makes both ranks
agree on one step, save once and exit 75; the relaunched run resumes and matches an uninterrupted 2-process
run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rentwise.training.checkpoints import inspect_checkpoint

from .conftest import assert_states_equal, final_state, subprocess_env, write_tiny_run

FIELDS = {"max_steps": 16, "micro_batch": 2, "grad_accum": 2, "checkpoint": {"every_steps": 100, "keep": 2}}


def _launch(config: Path, **env: str) -> subprocess.Popen[str]:
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    command = [
        accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
        "-m", "rentwise.cli.train", str(config), "--no-progress",
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1", **env),
    )


def _steps_logged(out: Path) -> int:
    path = out / "metrics.jsonl"
    return sum('"loss"' in line for line in path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_two_processes_sigterm_save_once_and_resume_exactly(tmp_path: Path) -> None:
    reference = write_tiny_run(tmp_path / "reference", **FIELDS)
    done = _launch(reference)
    _, stderr = done.communicate(timeout=180)
    assert done.returncode == 0, stderr

    trial = write_tiny_run(tmp_path / "trial", **FIELDS)
    out = trial.parent / "out"
    process = _launch(trial, RENTWISE_TEST_STEP_DELAY="0.1")
    deadline = time.monotonic() + 120
    while _steps_logged(out) < 4:
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1]
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)  # what a cloud does: the launcher forwards it to both ranks
    _, stderr = process.communicate(timeout=120)
    assert process.returncode != 0
    stops = [line for line in stderr.splitlines() if line.startswith("error: stopped by SIGTERM at step ")]
    assert len(stops) == 2, stderr  # both ranks stop, at the same step
    assert len({line.split(";")[0] for line in stops}) == 1, stops
    saved = [p for p in out.iterdir() if p.name.startswith("step-")]
    assert len(saved) == 1, saved  # saved once
    info = inspect_checkpoint(saved[0])
    assert info.state == "valid"
    assert {"rng-rank0.pt", "rng-rank1.pt"} <= {p.name for p in saved[0].iterdir()}
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e.get("event") == "preempted"] == [info.step]

    resumed = _launch(trial)
    _, stderr = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, stderr
    assert_states_equal(final_state(reference.parent / "out"), final_state(out))
