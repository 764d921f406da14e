"""Golden output: `rentwise memory` table snapshots; refresh with UPDATE_GOLDEN=1 after a change."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SNAPSHOTS = Path(__file__).parent / "snapshots"
CASES = {
    "memory_qwen2.5-7b_lora_ckpt": ["memory", "qwen2.5-7b", "--method", "lora", "--grad-ckpt"],
    "memory_llama-3.1-8b_full_zero3_4gpu": [
        "memory", "llama-3.1-8b", "--method", "full", "--gpus", "4",
        "--sharding", "zero3", "--gpu", "A100-80G",
    ],
    "memory_mixtral_qlora": ["memory", "mixtral-8x7b", "--method", "qlora", "--seq", "4096", "--gpu", "H100"],
    "memory_llama-3.1-8b_inference": [
        "memory", "llama-3.1-8b", "--method", "inference",
        "--batch", "8", "--seq", "4096", "--generate", "512",
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_memory_table_snapshot(run_cli: Callable[..., Any], name: str) -> None:
    result = run_cli(*CASES[name])
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(result.stdout)
    assert result.stdout == path.read_text(), f"{name} changed; rerun with UPDATE_GOLDEN=1 if intended"
