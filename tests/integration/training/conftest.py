"""A tiny run on CPU: a 2-layer Llama shape (random init), a byte tokenizer and 96 generated rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

TINY_MODEL = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 258,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "attention_dropout": 0.1,  # dropout draws from the torch RNG, so resume must restore it to match
}


def write_tiny_run(root: Path, **fields: Any) -> Path:
    """Write model config, data and a run config under `root`; `fields` override the run config."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "tiny.json").write_text(json.dumps(TINY_MODEL))
    with open(root / "data.jsonl", "w") as handle:
        for i in range(96):
            words = " ".join(str(i * j % 97) for j in range(4 + i % 9))
            handle.write(json.dumps({"text": f"row {i}: {words}"}) + "\n")
    config: dict[str, Any] = {
        "model": {"source": "tiny.json"},
        "tokenizer": "bytes",
        "data": {"path": "data.jsonl", "max_length": 48},
        "micro_batch": 2,
        "grad_accum": 2,
        "max_steps": 12,
        "lr": 1e-3,
        "warmup_steps": 2,
        "seed": 7,
        "output_dir": "out",
        "checkpoint": {"every_steps": 3, "keep": 2},
    }
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def tiny_run(tmp_path: Path) -> Path:
    return write_tiny_run(tmp_path / "run")


def rentwise_command(*args: str) -> list[str]:
    """`rentwise ARGS` as a subprocess command line, using this interpreter's console script."""
    return [str(Path(sys.executable).with_name("rentwise")), *args]


def subprocess_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "RENTWISE_DEBUG": "0", **extra}


def run_to_completion(config: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        rentwise_command("train", str(config), "--no-progress"),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=timeout_s,
    )
    assert result.returncode == 0, result.stderr
    return result


def final_state(out: Path) -> dict[str, Any]:
    """Trainable weights and optimizer state of the newest valid checkpoint of a run."""
    import torch
    from safetensors.torch import load_file

    from rentwise.training.checkpoints import newest_valid

    info = newest_valid(out)
    assert info is not None, f"no valid checkpoint in {out}"
    return {
        "step": info.step,
        "weights": load_file(info.path / "trainable.safetensors"),
        "optimizer": torch.load(info.path / "optimizer.pt", weights_only=True),
    }


def assert_states_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Bit-for-bit equality of weights and of every optimizer state tensor."""
    import torch

    assert a["step"] == b["step"]
    assert a["weights"].keys() == b["weights"].keys()
    for name in a["weights"]:
        assert torch.equal(a["weights"][name], b["weights"][name]), name
    state_a, state_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert state_a.keys() == state_b.keys()
    for index in state_a:
        for key, value in state_a[index].items():
            assert torch.equal(value, state_b[index][key]), (index, key)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
