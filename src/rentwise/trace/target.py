"""`TraceTarget`: the GPU a trace predicts for, and what CUDA does differently from the CPU (switchable).

1. The attention kernel. `F.scaled_dot_product_attention` picks its kernel per device. On a fake CPU tensor it
   would pick the CPU kernels; `target_sdpa` instead applies the CUDA selection rules of PyTorch's
   aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (priority order flash -> memory-efficient -> math) and
   calls that kernel's aten op, whose meta function gives the exact output and saved tensors (flash: output +
   fp32 logsumexp, no seq^2 matrix).
2. Kernel-internal buffers the dispatcher never sees: the flash-attention backward's fp32 dq accumulator, and
   the cuBLAS workspace PyTorch allocates per (handle, stream) through the caching allocator.
3. The caching allocator itself (see allocator.py) and the CUDA context, which only nvidia-smi sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rentwise.memory.overhead import CUDA_CONTEXT_BYTES

# CUDA context + kernel images: the analytic estimator's sourced constant (memory/overhead.py), so both
# answers agree on it; benchmarks/gpu_validate.py measures it on the card at hand.

# cuBLAS workspace per (handle, stream), allocated through the caching allocator on first GEMM.
# aten/src/ATen/cuda/CublasHandlePool.cpp parseChosenWorkspaceSize(): sm90 -> 4096 KiB x 8 = 32 MiB,
# otherwise 4096 KiB x 2 + 16 KiB x 8 = 8 MiB + 128 KiB. cuBLASLt shares it (TORCH_CUBLASLT_UNIFIED_WORKSPACE
# defaults on).
CUBLAS_WORKSPACE_SM90_BYTES = 4096 * 1024 * 8
CUBLAS_WORKSPACE_DEFAULT_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8


@dataclass(frozen=True)
class TraceTarget:
    """The device a trace predicts for. `CPU_TARGET` reproduces a real CPU run (for the exactness tests)."""

    name: str = "H100"
    device: Literal["cuda", "cpu"] = "cuda"
    compute_capability: tuple[int, int] = (9, 0)
    gpu_attention_kernels: bool = True
    """Replace the CPU's sdpa kernel with the one CUDA would pick on this compute capability."""
    kernel_workspaces: bool = True
    """Add the flash-attention backward accumulator and the cuBLAS workspaces."""
    simulate_allocator: bool = True
    """Replay allocations through the caching-allocator model to predict max_memory_reserved."""
    memory_bytes: int | None = None
    """Card memory; when set, the allocator model frees cached segments on a would-be OOM, as PyTorch does."""
    cuda_context_bytes: int = CUDA_CONTEXT_BYTES

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def cublas_workspace_bytes(self) -> int:
        return (
            CUBLAS_WORKSPACE_SM90_BYTES
            if self.compute_capability == (9, 0)
            else CUBLAS_WORKSPACE_DEFAULT_BYTES
        )


CPU_TARGET = TraceTarget(
    name="cpu",
    device="cpu",
    compute_capability=(0, 0),
    gpu_attention_kernels=False,
    kernel_workspaces=False,
    simulate_allocator=False,
    cuda_context_bytes=0,
)


def target_from_gpu(name: str, compute_capability: str, memory_bytes: int | None = None) -> TraceTarget:
    """Build a CUDA target from a catalog GPU's name and compute capability ("8.0")."""
    major, _, minor = compute_capability.partition(".")
    capability = (int(major), int(minor or 0)) if major.isdigit() else (8, 0)
    return TraceTarget(name=name, compute_capability=capability, memory_bytes=memory_bytes)
