"""NF4 emulation stores exactly what bitsandbytes Linear4bit stores."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rentwise.trace.qlora import NF4Linear  # noqa: E402


def _bytes(module: torch.nn.Module) -> dict[str, int]:
    tensors = dict(module.named_parameters()) | dict(module.named_buffers())
    return {name: t.numel() * t.element_size() for name, t in tensors.items()}


def test_double_quant_storage() -> None:
    code = torch.empty(256, device="meta")
    layer = NF4Linear(4096, 1024, False, torch.bfloat16, True, code)
    blocks = 4096 * 1024 // 64
    assert _bytes(layer) == {
        "weight": 4096 * 1024 // 2,  # two 4-bit codes per byte
        "code": 16 * 4,
        "absmax": blocks,  # uint8 after double quantisation
        "nested_absmax": -(-blocks // 256) * 4,
        "offset": 4,
        "nested_code": 256 * 4,
    }


def test_single_quant_keeps_fp32_absmax() -> None:
    layer = NF4Linear(128, 64, True, torch.float16, False, torch.empty(256, device="meta"))
    sizes = _bytes(layer)
    assert sizes["absmax"] == 128 * 64 // 64 * 4
    assert sizes["bias"] == 64 * 2
    assert "nested_absmax" not in sizes
