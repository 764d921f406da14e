"""`rentwise models`: the table, the JSON, a user's config.json, and the exact error lines."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rentwise.models.catalog import list_models

RunCli = Callable[..., Any]


def test_table_lists_every_bundled_model(run_cli: RunCli) -> None:
    result = run_cli("models")
    assert result.exit_code == 0, result.stderr
    for entry in list_models():
        assert entry.name in result.stdout
        assert entry.hf_id in result.stdout  # piped output is never truncated
    assert "mixtral-8x7b" in result.stdout and "46.7B" in result.stdout and "12.9B" in result.stdout
    assert result.stderr == ""


def test_filter_keeps_matching_rows_only(run_cli: RunCli) -> None:
    result = run_cli("models", "gemma")
    assert result.exit_code == 0
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("gemma-")]
    assert rows == ["gemma-2-2b", "gemma-2-9b", "gemma-2-27b"]
    assert "llama" not in result.stdout


def test_json_has_exact_counts(run_cli: RunCli) -> None:
    result = run_cli("models", "llama-3.1", "--json")
    assert result.exit_code == 0
    records = json.loads(result.stdout)
    assert [r["name"] for r in records] == ["llama-3.1-8b", "llama-3.1-70b"]
    assert records[0]["num_params"] == records[0]["published_params"] == 8_030_261_248
    assert records[0]["hf_id"] == "meta-llama/Llama-3.1-8B"
    assert (records[0]["num_heads"], records[0]["num_kv_heads"], records[0]["tie_embeddings"]) == (
        32,
        8,
        False,
    )


def test_no_match_prints_error_and_hint(run_cli: RunCli) -> None:
    result = run_cli("models", "llma")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: no bundled model matches 'llma' (did you mean 'llama'?)",
        "  hint: run `rentwise models` to list bundled models",
    ]


def test_a_config_path_shows_that_model(run_cli: RunCli, tmp_path: Path) -> None:
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 96, "vocab_size": 128}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run_cli("models", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    (record,) = json.loads(result.stdout)
    # 2 layers x (4 x 64x64 attention + 3 x 64x96 MLP + 2 x 64 norms) + 2 x 128x64 embeddings + 64 final norm
    assert record["num_params"] == 2 * (4 * 64 * 64 + 3 * 64 * 96 + 2 * 64) + 2 * 128 * 64 + 64


def test_malformed_config_path_exits_2(run_cli: RunCli, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",\n "hidden_size": }')
    result = run_cli("models", str(path))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: '{path}' is not valid JSON: Expecting value at line 2 column 17",
        "  hint: fix the file, or pass a bundled name from `rentwise models`",
    ]


def test_incomplete_config_path_exits_2(run_cli: RunCli, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
                                "num_hidden_layers": 32, "num_key_value_heads": 5}))  # fmt: skip
    result = run_cli("models", str(path))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: cannot read model config '{path}': 'vocab_size' must be a positive integer, got nothing; "
        "num_attention_heads=32 is not a multiple of num_key_value_heads=5",
        "  hint: pass a Hugging Face config.json of a decoder-only model, "
        "or a bundled name from `rentwise models`",
    ]
