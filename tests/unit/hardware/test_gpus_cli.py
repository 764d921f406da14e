"""`rentwise gpus`: table, filters, JSON and error lines."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _no_user_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RENTWISE_CONFIG_DIR", str(tmp_path / "config"))


def test_table_lists_the_catalog(run_cli: Callable[..., Any]) -> None:
    result = run_cli("gpus")
    assert result.exit_code == 0
    assert "A100 80GB SXM4" in result.stdout and "MI300X" in result.stdout
    assert result.stderr == ""


def test_filter_and_min_memory(run_cli: Callable[..., Any]) -> None:
    result = run_cli("gpus", "h", "--min-memory", "90", "--json")
    assert result.exit_code == 0
    assert [row["name"] for row in json.loads(result.stdout)] == ["H20", "H200 SXM"]
    rows = json.loads(run_cli("gpus", "a100", "--json").stdout)
    assert [row["name"] for row in rows] == [
        "A100 40GB PCIe",
        "A100 40GB SXM4",
        "A100 80GB PCIe",
        "A100 80GB SXM4",
    ]
    assert rows[3]["usable_bytes"] == 81920 * 2**20


def test_min_memory_keeps_big_cards(run_cli: Callable[..., Any]) -> None:
    rows = json.loads(run_cli("gpus", "--min-memory", "141GiB", "--json").stdout)
    assert [row["name"] for row in rows] == ["H200 SXM", "B200", "MI300X"]


def test_no_match_is_an_error(run_cli: Callable[..., Any]) -> None:
    result = run_cli("gpus", "zzzz")
    assert result.exit_code == 2
    assert result.stderr == "error: no GPU in the catalog matches 'zzzz'\n  hint: run `rentwise gpus`\n"


def test_bad_catalog_file_is_a_config_error(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[gpu]]\nname = "T4"\ntdp_w = -5\n')
    result = run_cli("gpus", "--catalog", str(bad))
    assert result.exit_code == 2
    assert (
        result.stderr.splitlines()[0] == f"error: {bad}: gpu #1 'T4': field 'tdp_w' must be positive, got -5"
    )
