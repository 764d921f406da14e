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


TRACE_HEADER = json.dumps({"format": "rentwise-gpu-trace", "version": 1, "facts": {"source": "nvml"}})
READING = {"index": 0, "uuid": "GPU-x", "memory_used_bytes": 2**30, "memory_total_bytes": 80 * 2**30}


def test_replay_of_a_folder_or_a_binary_file(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    hint = "  hint: pass the .jsonl file `rentwise watch --record FILE` wrote\n"
    result = run_cli("watch", "--replay", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr == f"error: trace file '{tmp_path}' is not a file\n{hint}"
    binary = tmp_path / "trace.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    result = run_cli("watch", "--replay", str(binary))
    assert result.exit_code == 2
    assert result.stderr == f"error: trace file '{binary}' is not a text file\n{hint}"


@pytest.mark.parametrize(
    ("sample", "problem"),
    [
        (
            {"t_s": 0.0, "gpus": [{**READING, "memory_used_bytes": "lots"}]},
            "field 'gpus[0].memory_used_bytes' must be an integer, got 'lots'",
        ),
        ({"t_s": None, "gpus": []}, "field 't_s' must be a number, got null"),
        ({"t_s": 0.0, "gpus": "x"}, "field 'gpus' must be a list, got 'x'"),
        ({"t_s": 0.0, "gpus": [READING, 3]}, "field 'gpus[1]' must be an object, got 3"),
        (
            {"t_s": 0.0, "gpus": [{**READING, "power_w": True}]},
            "field 'gpus[0].power_w' must be a number or null, got true",
        ),
        (
            {"t_s": 0.0, "gpus": [{**READING, "processes": [{"pid": "7"}]}]},
            "field 'gpus[0].processes[0].pid' must be an integer, got '7'",
        ),
        ({"t_s": 0.0, "gpus": [], "host": {"cpu_pct": 5.0}}, "field 'host.ram_used_bytes' is missing"),
        (
            {"t_s": 0.0, "gpus": [], "job_alive": "yes"},
            "field 'job_alive' must be true, false or null, got 'yes'",
        ),
    ],
)
def test_replay_names_the_line_and_field_of_a_bad_sample(
    run_cli: Callable[..., Any], tmp_path: Path, sample: dict[str, Any], problem: str
) -> None:
    path = tmp_path / "bad.jsonl"
    good = {"t_s": 0.0, "gpus": [READING]}
    path.write_text(f"{TRACE_HEADER}\n{json.dumps(good)}\n{json.dumps(sample)}\n")
    result = run_cli("watch", "--replay", str(path))
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}: line 3: {problem}\n  hint: is this a trace file?\n"


def test_replay_names_a_bad_header_field(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    facts = {
        "source": "nvml",
        "gpus": [{"index": 0, "name": "H100", "uuid": "u", "memory_total_bytes": None}],
    }
    path.write_text(json.dumps({"format": "rentwise-gpu-trace", "version": 1, "facts": facts}) + "\n")
    result = run_cli("watch", "--replay", str(path))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {path}: line 1: field 'facts.gpus[0].memory_total_bytes' must be an integer, got null\n"
        "  hint: is this a trace file?\n"
    )
