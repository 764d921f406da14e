"""MemoryJob validation lists every problem at once."""

from __future__ import annotations

import pytest

from rentwise.errors import ConfigError
from rentwise.memory.job import MemoryJob


def test_every_problem_is_listed() -> None:
    with pytest.raises(ConfigError, match=r"micro-batch must be a positive integer, got 0; seq-len must be"):
        MemoryJob(micro_batch=0, seq_len=-3)


def test_qlora_with_fp32_makes_no_sense() -> None:
    with pytest.raises(ConfigError, match="QLoRA computes in bf16 or fp16"):
        MemoryJob(method="qlora", precision="fp32")


def test_offload_needs_a_sharded_engine() -> None:
    with pytest.raises(ConfigError, match="offload 'optimizer' needs sharding zero2, zero3 or fsdp"):
        MemoryJob(offload="optimizer")
