"""Tiny model configs for trace tests (a few layers, hidden 64-256): real CPU runs take milliseconds."""

from __future__ import annotations

from typing import Any

import pytest

from rentwise.models.shape import ModelShape, shape_from_config

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-gqa": {
        "model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
    },
    "llama-tied": {
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512, "tie_word_embeddings": True,
    },
    "qwen2-bias": {
        "model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 800, "tie_word_embeddings": False,
    },
    "mixtral-moe": {
        "model_type": "mixtral", "hidden_size": 128, "intermediate_size": 192, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 600, "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
}  # fmt: skip


def tiny_shape(name: str) -> ModelShape:
    return shape_from_config(TINY_CONFIGS[name], name=f"tiny-{name}")


@pytest.fixture
def tiny() -> Any:
    return tiny_shape
