"""CLI paths of plan, prices, fix and tco: exit codes and the exact error lines."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Run = Callable[..., Any]


@pytest.fixture(autouse=True)
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RENTWISE_CONFIG_DIR", str(tmp_path / "config"))


def test_plan_ranks_and_recommends(run_cli: Run) -> None:
    result = run_cli("plan", "qwen2.5-0.5b", "--method", "lora", "--tokens", "50M", "--top", "3")
    assert result.exit_code == 0, result.stderr
    assert "ranked by cost" in result.stdout
    assert "Cheapest:" in result.stdout and "Fastest:" in result.stdout and "Best value" in result.stdout
    assert "Leaves out:" in result.stdout


def test_plan_json_is_the_same_result(run_cli: Run) -> None:
    result = run_cli(
        "plan", "qwen2.5-0.5b", "--tokens", "5M", "--json", "--currency", "CNY", "--sort", "time"
    )
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["currency"] == "CNY" and data["sort"] == "time"
    hours = [p["wall_h"] for p in data["plans"]]
    assert hours == sorted(hours)
    assert data["recommendation"][0].startswith("Cheapest:")


def test_plan_impossible_deadline_exits_1_with_reasons(run_cli: Run) -> None:
    result = run_cli("plan", "qwen2.5-0.5b", "--tokens", "5B", "--deadline", "0.01")
    assert result.exit_code == 1
    assert "No offer can run this job within the constraints." in result.stdout
    assert "deadline 0.01 h" in result.stdout


def test_plan_bad_values_exit_2(run_cli: Run) -> None:
    result = run_cli("plan", "qwen2.5-0.5b", "--tokens", "5M", "--deadline", "-1")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: deadline must be a positive number, got -1.0",
        "  hint: run `rentwise plan --help` for the valid options",
    ]
    result = run_cli("plan", "qwen2.5-0.5b")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == "error: the job has no data size"
    result = run_cli("plan", "qwen2.5-0.5b", "--tokens", "lots")
    assert result.stderr.splitlines() == [
        "error: cannot read 'lots' as a count",
        "  hint: write it like 50M, 1.5B or 20000",
    ]


def test_plan_unknown_currency_exits_2(run_cli: Run) -> None:
    result = run_cli("plan", "qwen2.5-0.5b", "--tokens", "5M", "--currency", "EUR")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: unknown currency 'EUR'",
        "  hint: known: CNY, USD; add a rate with --fx EUR=UNITS_PER_USD",
    ]
    assert result.stdout == ""


def test_plan_bad_offers_file_exits_2_and_names_row(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "offers.csv"
    path.write_text(
        "id,provider,region,gpu,gpu_count,currency,on_demand_per_hour,source\nx,P,r,L4,1,USD,cheap,me\n"
    )
    result = run_cli("plan", "qwen2.5-0.5b", "--tokens", "5M", "--offers", str(path))
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[0] == f"error: bad offers file {path}: row 2: on_demand_per_hour 'cheap' is not a number"
    assert lines[1].startswith("  hint: fix the rows named above; the columns are id, provider")
    assert result.stdout == ""


def test_plan_samples_and_dataset(run_cli: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No tokenizer lookup here (importing transformers takes seconds); the chars/4 fallback is what runs.
    monkeypatch.setattr("rentwise.planning.job._count_with_tokenizer", lambda text, tokenizer_id: None)
    result = run_cli("plan", "qwen2.5-0.5b", "--samples", "20k", "--avg-tokens", "500", "--json")
    assert json.loads(result.stdout)["total_tokens"] == 10_000_000
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello world"}\n' * 1000)
    result = run_cli("plan", "qwen2.5-0.5b", "--dataset", str(data), "--json")
    assert result.exit_code == 0
    assert "tokens (chars/4 approximation)" in result.stderr
    result = run_cli("plan", "qwen2.5-0.5b", "--tokens", "1M", "--samples", "3")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[1] == "  hint: drop all but one of --tokens, --samples"


def test_prices_filters_and_converts(run_cli: Run) -> None:
    result = run_cli("prices", "--gpu", "4090", "--currency", "CNY")
    assert result.exit_code == 0
    assert "prices in CNY per machine-hour" in result.stdout
    assert all("4090" in line for line in result.stdout.splitlines()[2:-2] if line.strip())
    none = run_cli("prices", "--gpu", "no-such-card")
    assert none.exit_code == 1


def test_fix_ranks_remedies(run_cli: Run) -> None:
    result = run_cli("fix", "llama-3.1-8b", "--gpu", "RTX 4090", "--method", "full", "--batch", "4")
    assert result.exit_code == 0
    out = result.stdout
    assert "GiB over" in out and "Largest parts:" in out
    first = next(line for line in out.splitlines() if line.strip().startswith("1 "))
    assert "yes" in first


def test_fix_accepts_a_size_and_rejects_unknown_names(run_cli: Run) -> None:
    assert run_cli("fix", "qwen2.5-0.5b", "--gpu", "8GB", "--method", "full").exit_code == 0
    result = run_cli("fix", "qwen2.5-0.5b", "--gpu", "H100-80")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: no GPU named 'H100-80' in the catalog")


def test_tco_break_even_hand_checked(run_cli: Run) -> None:
    args = ["--card-price", "2000", "--machine-price", "1500", "--watts", "600", "--idle-watts", "80"]
    result = run_cli("tco", *args, "--tariff", "0.15", "--pue", "1.2", "--rent-price", "0.69", "--json")
    data = json.loads(result.stdout)
    # (3500/36 + 730.5·0.0144) / (0.69 − (0.108 − 0.0144)) = 180.6 h
    assert data["break_even_hours"] == pytest.approx((3500 / 36 + 730.5 * 0.0144) / (0.69 - (0.108 - 0.0144)))
    assert data["cheaper"] == "buy"


def test_tco_errors(run_cli: Run) -> None:
    result = run_cli("tco", "--card-price", "2000")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: nothing to compare with",
        "  hint: pass --rent-price PRICE or --offer ID (`rentwise prices`)",
    ]
    result = run_cli("tco", "--card-price", "2000", "--rent-price", "1", "--pue", "0.5")
    assert result.stderr.splitlines()[0] == "error: PUE is facility/IT power and cannot be below 1, got 0.5"
