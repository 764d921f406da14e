"""bench: the measurement code on CPU with tiny sizes (no GPU pretended), and the CLI paths that need none."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rentwise.machine.bench import BenchConfig, run_bench
from rentwise.machine.readings import GpuFacts, NoGpuSource
from rentwise.machine.verdict import BenchResult, Measurement, judge, result_document

TINY = BenchConfig(
    repeats=3, matmul_n=64, matmul_dtypes=("bf16", "tf32", "fp32"), copy_bytes=2**20, seconds_per_repeat=0.005
)


def test_measurements_run_on_cpu() -> None:
    pytest.importorskip("torch")
    result = run_bench(NoGpuSource("no NVML"), TINY, device="cpu")
    assert [m.name for m in result.measurements] == [
        "matmul_bf16",
        "matmul_tf32",
        "matmul_fp32",
        "device_copy",
    ]
    for m in result.measurements:
        assert len(m.values) == 3 and all(v > 0 for v in m.values)
    assert result.measurements[0].size == "64x64x64" and result.measurements[0].unit == "TFLOPS"
    assert result.gpu.name == "cpu" and result.samples  # the sampler ran (empty NoGpu samples)


def _saved(tmp_path: Path, name: str, bf16: float, started: str = "") -> Path:
    gpu = GpuFacts(index=0, name="NVIDIA H100 80GB HBM3", uuid="u", memory_total_bytes=81559 * 2**20)
    result = BenchResult(
        gpu=gpu,
        measurements=(Measurement("matmul_bf16", "TFLOPS", (bf16, bf16 + 1, bf16 + 2)),),
        started_at=started,
    )
    path = tmp_path / name
    path.write_text(json.dumps(result_document(result, judge(result, None), None)))
    return path


def test_bench_from_a_saved_result(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    result = run_cli("bench", "--from", str(_saved(tmp_path, "a.json", 790.0)))
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "GPU 0: NVIDIA H100 80GB HBM3 = catalog 'H100 SXM5'"
    assert "verdict: healthy" in result.stdout


def test_bench_compare_flags_a_slower_run(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    day = _saved(tmp_path, "day.json", 790.0, "2026-12-01T14:00:00+00:00")
    night = _saved(tmp_path, "night.json", 350.0)
    result = run_cli("bench", "--from", str(night), "--compare", str(day), "--json")
    assert result.exit_code == 1
    verdict = json.loads(result.stdout)["verdict"]
    assert verdict["status"] == "likely shared or noisy"
    assert verdict["reasons"][0].startswith("matmul_bf16 351 TFLOPS is 56% slower than the earlier run")


def test_bench_expect_another_card(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    result = run_cli("bench", "--from", str(_saved(tmp_path, "a.json", 790.0)), "--expect", "B200")
    assert result.exit_code == 1
    assert "verdict: not the card advertised" in result.stdout


def test_bench_without_cuda(run_cli: Callable[..., Any]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run_cli("bench")
    assert result.exit_code == 1
    assert (
        result.stderr
        == "error: cannot benchmark: torch sees no CUDA GPU\n  hint: run `rentwise doctor` to see why\n"
    )


def test_bench_bad_expect(run_cli: Callable[..., Any]) -> None:
    result = run_cli("bench", "--expect", "H100-80")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: no GPU named 'H100-80' in the catalog (did you mean ")


def _document(tmp_path: Path, values: object) -> Path:
    """A saved result whose bf16 measurement holds `values` (as a hand-edited file might)."""
    document = json.loads(_saved(tmp_path, "a.json", 790.0).read_text())
    document["result"]["measurements"][0]["values"] = values
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(document))
    return path


HINT = "  hint: save one with `rentwise bench --save FILE`\n"


def test_bench_from_a_result_without_repeats(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    path = _document(tmp_path, [])
    result = run_cli("bench", "--from", str(path))
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}: field 'result.measurements[0].values' is empty\n{HINT}"


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ("790", "field 'result.measurements[0].values' must be a list, got '790'"),
        ([790.0, None], "field 'result.measurements[0].values[1]' must be a number, got null"),
    ],
)
def test_bench_from_a_result_with_bad_values(
    run_cli: Callable[..., Any], tmp_path: Path, values: object, problem: str
) -> None:
    path = _document(tmp_path, values)
    result = run_cli("bench", "--from", str(path))
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}: {problem}\n{HINT}"


def test_bench_from_a_folder_or_not_json(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    result = run_cli("bench", "--from", str(tmp_path))
    assert result.exit_code == 2
    assert result.stderr == f"error: bench result '{tmp_path}' is not a file\n{HINT}"
    path = tmp_path / "notes.json"
    path.write_text("not json")
    result = run_cli("bench", "--compare", str(path), "--from", str(_saved(tmp_path, "a.json", 790.0)))
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}: not JSON (Expecting value)\n{HINT}"


def test_bench_from_a_slow_result_says_slower_not_a_different_card(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    result = run_cli("bench", "--from", str(_saved(tmp_path, "slow.json", 600.0)))
    assert result.exit_code == 1
    assert "verdict: slower than expected for this card (possibly not the card advertised)\n" in result.stdout
