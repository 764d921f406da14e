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


HEADER = "id,provider,region,gpu,gpu_count,currency,source,on_demand_per_hour\n"
COLUMNS = (
    "id, provider, region, instance_type, gpu, gpu_count, interconnect, vcpus, ram_gb, currency, "
    "on_demand_per_hour, spot_per_hour, weekly_per_hour, monthly_per_hour, billing_unit_s, "
    "storage_per_gb_day, storage_bills_stopped, egress_per_gb, snapshot_per_gb_month, spot_mtbi_h, "
    "source, as_of, notes"
)


@pytest.mark.parametrize(
    ("flag", "value", "error"),
    [
        ("--eval-fraction", "inf", "error: eval fraction must be a finite number, 0 or more, got inf"),
        ("--snapshot-months", "nan", "error: snapshot months must be a finite number, 0 or more, got nan"),
        ("--restart-min", "nan", "error: restart time must be a finite number, 0 or more, got nan"),
    ],
)
def test_plan_non_finite_numbers_exit_2(run_cli: Run, flag: str, value: str, error: str) -> None:
    result = run_cli("plan", "qwen2.5-0.5b", "--tokens", "5M", flag, value)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [error, "  hint: run `rentwise plan --help` for the valid options"]


def test_offers_file_with_non_finite_price_or_extra_values_exits_2(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(
        HEADER + "a,P,r,H100 SXM5,1,USD,s,nan\nb,P,r,H100 SXM5,1,USD,s,2,x,y\nc,P,r,H100 SXM5,1,USD,s,inf\n"
    )
    result = run_cli("prices", "--offers", str(path), "--json")
    assert result.exit_code == 2
    assert result.stdout == ""  # no NaN in a JSON document
    assert result.stderr.splitlines() == [
        f"error: bad offers file {path}: row 2: on_demand_per_hour must be a finite number, got nan; "
        "row 3: more values than the header has columns (extra: 'x', 'y'); "
        "row 4: on_demand_per_hour must be a finite number, got inf",
        f"  hint: fix the rows named above; the columns are {COLUMNS}",
    ]


def test_offers_file_that_is_not_utf8_exits_2(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(HEADER.encode() + "a,Señor GPU,r,H100 SXM5,1,USD,s,2\n".encode("latin-1"))
    result = run_cli("prices", "--offers", str(path))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        # the 69-byte header line, then "a,Se": the latin-1 'ñ' (0xf1) is byte 72
        f"error: offers file '{path}' is not UTF-8 text (byte 0xf1 at offset 72)",
        "  hint: save it as UTF-8 CSV or TOML",
    ]


def test_zero_price_is_an_offer_and_sorts_first(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "zero.csv"
    path.write_text(HEADER + "free,Mine,r,H100 SXM5,1,USD,s,0\n")
    result = run_cli("prices", "--offers", str(path), "--max-price", "1", "--json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert rows[0]["id"] == "free"
    assert rows[0]["on_demand_per_hour"] == 0


def test_fix_refuses_a_card_of_no_size(run_cli: Run) -> None:
    result = run_cli("fix", "llama-3.1-8b", "--gpu", "0GB")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: card size '0GB' must be more than 0",
        "  hint: give a catalog name (--gpu 'RTX 4090') or a size (--gpu 24GB)",
    ]


def test_plan_gpus_must_be_positive_and_exist(run_cli: Run) -> None:
    result = run_cli("plan", "qwen2.5-0.5b", "--tokens", "5M", "--gpus", "0")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: --gpus must be at least 1, got 0",
        "  hint: give the GPUs per machine, e.g. --gpus 8, or drop it to search every count",
    ]
    result = run_cli("plan", "qwen2.5-0.5b", "--tokens", "5M", "--gpus", "3")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: no offer has 3 GPUs in one machine (the offers have 1, 2, 4, 8)",
        "  hint: pick one of those counts for --gpus, or drop --gpus to search them all",
    ]


def test_plan_rejections_name_their_offer(run_cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "three.csv"
    path.write_text(HEADER + "three,P,r,H100 SXM5,3,USD,s,9\n")
    args = ("--tokens", "5M", "--gpus", "3", "--global-batch", "2", "--offers", str(path))
    result = run_cli("plan", "qwen2.5-0.5b", *args)
    assert result.exit_code == 1
    assert "  P r 3xH100 SXM5: 3 GPUs need a global batch of at least 3 sequences (--global-batch 2)" in (
        result.stdout.splitlines()
    )
