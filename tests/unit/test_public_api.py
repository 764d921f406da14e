"""The public API: a sorted __all__ whose every name resolves, without importing torch."""

from __future__ import annotations

import subprocess
import sys

import rentwise


def test_all_is_sorted_and_resolves() -> None:
    assert rentwise.__all__ == sorted(rentwise.__all__)
    for name in rentwise.__all__:
        assert getattr(rentwise, name) is not None


def test_import_is_lazy_and_torch_free() -> None:
    code = "import sys, rentwise; rentwise.estimate_memory; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_library_use_from_the_docstring() -> None:
    from rentwise import MemoryJob, estimate_memory, load_shape

    total = estimate_memory(load_shape("qwen2.5-7b"), MemoryJob(method="lora", precision="bf16")).total_bytes
    assert total > 14 * 2**30
