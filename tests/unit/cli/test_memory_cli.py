"""`rentwise memory`: output, JSON, speed and every error path (exact lines, exit codes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def test_breakdown_table_and_fit_list(run_cli: Callable[..., Any]) -> None:
    result = run_cli(
        "memory", "qwen2.5-7b", "--method", "lora", "--seq", "2048", "--batch", "1", "--grad-ckpt"
    )
    assert result.exit_code == 0, result.stderr
    assert "total per GPU (nvidia-smi)" in result.stdout
    assert "fits on (smallest first):" in result.stdout
    assert "leaves out:" in result.stdout


def test_json_has_the_breakdown_and_fits(run_cli: Callable[..., Any]) -> None:
    result = run_cli("memory", "llama-3.1-8b", "--method", "qlora", "--json")
    assert result.exit_code == 0
    payload = json.loads(result.stdout)
    breakdown = payload["breakdown"]
    assert payload["total_bytes"] == sum(v for k, v in breakdown.items() if k.endswith("_bytes"))
    assert any(f["fits"] for f in payload["fits"])


def test_too_big_for_one_card_lists_how_many(run_cli: Callable[..., Any]) -> None:
    result = run_cli("memory", "llama-3.1-70b", "--method", "full", "--grad-ckpt", "--gpu", "H100", "--json")
    fit = json.loads(result.stdout)["fits"][0]
    assert result.exit_code == 1  # the one GPU asked about does not fit
    assert not fit["fits"] and fit["gpu_count"] > 1 and fit["strategy"] == "zero3"


@pytest.mark.parametrize(
    ("args", "error", "hint"),
    [
        (
            ["memory", "llama-9000"],
            "error: no model named 'llama-9000' in the catalog",
            "  hint: run `rentwise models` to list bundled models",
        ),
        (
            ["memory", "qwen2.5-7b", "--batch", "0"],
            "error: micro-batch must be a positive integer, got 0",
            "  hint: run `rentwise memory --help` for the valid options",
        ),
        (
            ["memory", "qwen2.5-0.5b", "--lora-rank", "4096"],
            "error: lora-rank 4096 is larger than the hidden size 896",
            "  hint: run `rentwise memory --help` for the valid options",
        ),
        (
            ["memory", "qwen2.5-7b", "--method", "qlora", "--precision", "fp32"],
            "error: QLoRA computes in bf16 or fp16; precision fp32 makes no sense with a 4-bit base",
            "  hint: run `rentwise memory --help` for the valid options",
        ),
        (
            ["memory", "qwen2.5-7b", "--gpu", "H100-80"],
            "error: no GPU named 'H100-80'",
            "  hint: run `rentwise gpus` to list known GPUs",
        ),
        (
            ["memory", "qwen2.5-7b", "--method", "lora-ish"],
            "error: Invalid value for '--method' / '-m'",
            "  hint: run `rentwise memory --help`",
        ),
    ],
)
def test_bad_input_is_one_line_with_a_hint(
    run_cli: Callable[..., Any], args: list[str], error: str, hint: str
) -> None:
    result = run_cli(*args)
    lines = result.stderr.splitlines()
    assert result.exit_code == 2
    assert lines[0].startswith(error), lines
    assert lines[1].startswith(hint), lines
    assert "Traceback" not in result.stderr


def test_malformed_config_json(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": ')
    result = run_cli("memory", str(bad))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert "config.json" in result.stderr.splitlines()[0]


def test_answers_fast_without_torch() -> None:
    # The < 100 ms figure is measured on a quiet machine by benchmarks/memory_latency.py (75 ms median); this
    # guard allows 2x for a loaded test machine and still catches an accidental torch import (~1 s).
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "rentwise.cli.main",
        "memory",
        "qwen2.5-7b",
        "--method",
        "lora",
        "--grad-ckpt",
    ]
    subprocess.run(cmd, check=True, capture_output=True, env=env)  # warm the file cache
    best = min(_timed(cmd, env) for _ in range(5))
    assert best < 0.200, f"took {best * 1000:.0f} ms"


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


@pytest.mark.slow
def test_trace_prints_next_to_the_analytic_answer(run_cli: Callable[..., Any]) -> None:
    result = run_cli(
        "memory", "qwen2.5-0.5b", "--method", "lora", "--seq", "256", "--trace", "--gpu", "A100-80G"
    )
    assert result.exit_code == 0, result.stderr
    assert "analytic GiB  trace GiB" in result.stdout
    assert "trace: peak at" in result.stdout


def test_trace_without_torch_says_how_to_install(run_cli: Callable[..., Any], monkeypatch: Any) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real_find_spec(name, *a)
    )
    result = run_cli("memory", "qwen2.5-0.5b", "--trace")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: this needs the 'torch' package, which is not installed",
        "  hint: pip install 'rentwise[trace]'",
    ]
