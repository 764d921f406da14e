"""sdpa kernel selection per target GPU (sdp_utils.cpp gates) and kernel workspaces."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rentwise.trace.kernels import flash_backward_workspace_bytes, select_kernel, workspace_model  # noqa: E402
from rentwise.trace.target import CPU_TARGET, TraceTarget, target_from_gpu  # noqa: E402

H100 = TraceTarget()
T4 = target_from_gpu("T4", "7.5")


def _qkv(dtype: torch.dtype, head_dim: int = 64, kv_heads: int = 8) -> tuple[torch.Tensor, ...]:
    return (
        torch.empty(1, 8, 16, head_dim, dtype=dtype, device="meta"),
        torch.empty(1, kv_heads, 16, head_dim, dtype=dtype, device="meta"),
        torch.empty(1, kv_heads, 16, head_dim, dtype=dtype, device="meta"),
    )


def test_half_precision_without_mask_uses_flash_on_sm80_plus() -> None:
    assert select_kernel(H100, *_qkv(torch.bfloat16), None, True, False) == "flash"


def test_mask_fp32_or_old_gpu_falls_back_to_memory_efficient() -> None:
    q, k, v = _qkv(torch.float16)
    mask = torch.empty(1, 1, 16, 16, dtype=torch.float16, device="meta")
    assert select_kernel(H100, q, k, v, mask, False, False) == "efficient"
    assert select_kernel(H100, *_qkv(torch.float32), None, True, False) == "efficient"
    assert select_kernel(T4, *_qkv(torch.float16), None, True, False) == "efficient"


def test_gqa_with_mask_or_huge_heads_use_math() -> None:
    q, k, v = _qkv(torch.bfloat16, kv_heads=2)
    mask = torch.empty(1, 1, 16, 16, dtype=torch.bfloat16, device="meta")
    assert select_kernel(H100, q, k, v, mask, False, True) == "math"
    assert select_kernel(T4, *_qkv(torch.bfloat16), None, True, False) == "math"  # bf16 needs sm80


def test_cpu_target_keeps_cpu_kernels() -> None:
    assert select_kernel(CPU_TARGET, *_qkv(torch.bfloat16), None, True, False) == "cpu"


def test_flash_backward_workspace_formula() -> None:
    q = torch.empty(2, 32, 1000, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 8, 1000, 128, dtype=torch.bfloat16, device="meta")
    seq_rounded = 1024
    expected = 2 * 32 * seq_rounded * 4 + 2 * seq_rounded * 32 * 128 * 4 + 2 * 2 * 1000 * 32 * 128 * 2
    assert flash_backward_workspace_bytes(q, k) == expected


def test_cublas_workspace_once_per_thread_and_sized_by_arch() -> None:
    model = workspace_model(H100)
    mm = torch.ops.aten.mm.default
    assert model(mm, (), {}, "forward") == (0, 32 * 1024**2)
    assert model(mm, (), {}, "forward") == (0, 0)
    assert model(mm, (), {}, "backward") == (0, 32 * 1024**2)
    assert workspace_model(T4)(mm, (), {}, "forward") == (0, 4096 * 1024 * 2 + 16 * 1024 * 8)
    assert workspace_model(CPU_TARGET)(mm, (), {}, "forward") == (0, 0)
