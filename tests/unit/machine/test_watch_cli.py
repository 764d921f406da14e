"""`rentwise watch`: replayed traces end to end, and the error lines."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "machine"


def _replay(run_cli: Callable[..., Any], name: str, *extra: str) -> Any:
    return run_cli("watch", "--replay", str(FIXTURES / f"synthetic-{name}.jsonl"), *extra)


def test_replay_prints_a_summary_and_the_advice(run_cli: Callable[..., Any]) -> None:
    result = _replay(run_cli, "memory-pinned")
    assert result.exit_code == 0
    assert result.stdout.startswith("watched 2m 02s, 61 samples\n")
    assert "⚠ GPU 0 memory at 98% for 1m 00s" in result.stdout
    assert result.stderr == ""


def test_replay_of_a_lost_gpu_exits_1(run_cli: Callable[..., Any]) -> None:
    result = _replay(run_cli, "gpu-lost")
    assert result.exit_code == 1
    assert "✗ GPU 1 stopped answering during the run" in result.stdout


def test_replay_without_readings(run_cli: Callable[..., Any]) -> None:
    result = _replay(run_cli, "no-readings")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[:2] == ["watched 0.0s, 0 samples", "note: no readings were taken"]


def test_replay_json(run_cli: Callable[..., Any]) -> None:
    result = _replay(run_cli, "stuck-job", "--json")
    document = json.loads(result.stdout)
    assert document["sample_count"] == 121
    assert [a["rule"] for a in document["advice"]] == ["gpu_idle_job_alive"]
    assert document["gpus"][0]["idle_s"] == pytest.approx(122.0)


def test_without_nvml_watch_says_why(run_cli: Callable[..., Any]) -> None:
    pytest.importorskip("pynvml")
    from rentwise.machine.nvml import nvml_unavailable_reason

    reason = nvml_unavailable_reason()
    if reason is None:
        pytest.skip("this machine has NVML")
    result = run_cli("watch", "--duration", "1")
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: cannot watch GPUs: {reason}\n"
        "  hint: `rentwise doctor` explains the machine; `rentwise watch --replay FILE` replays a trace\n"
    )


def test_usage_errors(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    result = run_cli("watch", "--replay", str(FIXTURES / "synthetic-stuck-job.jsonl"), "--", "echo", "hi")
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --replay reads a finished recording; it cannot run a command\n  hint: drop one of them\n"
    )
    result = run_cli("watch", "--duration", "5", "--", "sleep", "1")
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "error: --duration stops a plain watch; with a command, watch ends when it does\n"
    )
    result = run_cli("watch", "--interval", "0")
    assert result.exit_code == 2
    assert result.stderr == "error: --interval must be positive, got 0.0\n  hint: e.g. --interval 2\n"
    result = run_cli("watch", "--replay", str(tmp_path / "missing.jsonl"))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: trace file '{tmp_path / 'missing.jsonl'}' does not exist\n")


def test_job_flags_turn_the_headroom_into_a_micro_batch(run_cli: Callable[..., Any]) -> None:
    import math

    from rentwise.machine.advice import micro_batch_model_for
    from rentwise.memory.job import MemoryJob
    from rentwise.models.catalog import load_shape

    model = micro_batch_model_for(
        load_shape("qwen2.5-7b"), MemoryJob(method="lora", precision="bf16", micro_batch=2)
    )
    peak = int(0.45 * 81559 * 2**20)  # the synthetic trace's steady memory
    expected = math.floor(
        (0.9 * 81559 * 2**20 - (peak - 2 * model.per_sample_bytes)) / model.per_sample_bytes
    )
    result = _replay(
        run_cli, "memory-underused", "--job", "qwen2.5-7b", "--method", "lora", "--batch", "2", "--json"
    )
    assert result.exit_code == 0
    (advice,) = json.loads(result.stdout)["advice"]
    assert advice["action"].startswith(f"raise the micro-batch from 2 to {expected} (+")


def test_live_view_renders_a_sample(capsys: pytest.CaptureFixture[str]) -> None:
    from rentwise.cli.watch import _LiveView
    from rentwise.machine.advice import advise
    from rentwise.machine.readings import read_trace

    from .conftest import context_for

    facts, samples = read_trace(FIXTURES / "synthetic-memory-pinned.jsonl")
    view = _LiveView()
    view.update(samples, advise(samples, context_for(facts, samples)))
    view.stop()
    err = capsys.readouterr().err
    assert "rentwise watch  t=2m 00s" in err and "(98%)" in err and "GPU 0 memory at 98%" in err
