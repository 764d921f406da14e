"""CUDA kernel behaviour on fake CPU tensors: sdpa kernel selection and kernel-internal workspaces.

See target.py for what is modelled and why; every rule cites the PyTorch source it follows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch

from rentwise.trace.target import TraceTarget

Kernel = Literal["flash", "efficient", "math", "cpu"]


# --- 1. attention kernel selection (sdp_utils.cpp) ----------------------------------------------------------
def select_kernel(
    target: TraceTarget,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    enable_gqa: bool,
) -> Kernel:
    """The sdpa kernel CUDA would run, by the gates of sdp_utils.cpp (dropout is 0 in our steps)."""
    if not (target.is_cuda and target.gpu_attention_kernels):
        return "cpu"
    head_dim = query.shape[-1]
    same_head_dim = key.shape[-1] == head_dim == value.shape[-1]
    half = query.dtype in (torch.float16, torch.bfloat16)
    sm = target.compute_capability
    # check_flash_attention_hardware_support (sm80+), check_tensor_dtype (fp16/bf16), check_for_attn_mask,
    # check_head_dim_size_flash (<= 256), check_flash_causal_non_square_seqlens.
    square = query.shape[-2] == key.shape[-2]
    flash_ok = half and sm >= (8, 0) and attn_mask is None and same_head_dim and head_dim <= 256
    if flash_ok and (not is_causal or square):
        return "flash"
    # check_mem_efficient_hardware_support (sm50+; bf16 needs sm80), head dim multiple of 8 (4 for fp32),
    # check_batch_size_and_num_heads_dense<supports_gqa=false>.
    gqa = enable_gqa and query.shape[-3] != key.shape[-3]
    align = 4 if query.dtype == torch.float32 else 8
    dtype_ok = query.dtype in (torch.float32, torch.float16) or (
        query.dtype == torch.bfloat16 and sm >= (8, 0)
    )
    if dtype_ok and not gqa and same_head_dim and head_dim % align == 0:
        return "efficient"
    return "math"


def _float_mask(attn_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    # attention.cpp convert_boolean_attn_mask: a bool mask becomes an additive float mask (-inf where False).
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    zeros = torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device)
    return zeros.masked_fill(attn_mask.logical_not(), -math.inf)


@contextmanager
def target_sdpa(target: TraceTarget, chosen: dict[str, int]) -> Iterator[None]:
    """Route `F.scaled_dot_product_attention` to the kernel `target` would pick; count choices in `chosen`."""
    original: Callable[..., torch.Tensor] = torch.nn.functional.scaled_dot_product_attention
    kernel_target_active = target.is_cuda and target.gpu_attention_kernels

    def sdpa(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if kernel_target_active and torch.is_autocast_enabled("cpu"):
            # sdpa is on autocast's lower-precision list (CUDA and CPU): inputs are cast before dispatch.
            half = torch.get_autocast_dtype("cpu")
            query, key, value = (t.to(half) for t in (query, key, value))
        kernel = select_kernel(target, query, key, value, attn_mask, is_causal, enable_gqa)
        chosen[kernel] = chosen.get(kernel, 0) + 1
        if kernel == "flash":
            out = torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )
            return out[0]  # type: ignore[no-any-return]
        if kernel == "efficient":
            needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            out = torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, _float_mask(attn_mask, query.dtype), needs_lse, dropout_p, is_causal,
                scale=scale,
            )  # fmt: skip
            return out[0]  # type: ignore[no-any-return]
        return original(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
            enable_gqa=enable_gqa,
        )  # fmt: skip

    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


# --- 2. kernel-internal buffers ---------------------------------------------------------------------------
def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def flash_backward_workspace_bytes(query: torch.Tensor, key: torch.Tensor) -> int:
    """fp32 buffers flash-attention's mha_bwd allocates inside the kernel (flash_attn/flash_api.cpp).

    softmax_d: (batch, heads, round128(seq_q)) fp32; dq_accum: (batch, round128(seq_q), heads,
    round32(head_dim)) fp32; with grouped-query attention also dk/dv expanded to all query heads (input
    dtype), then summed down to the key/value heads.
    """
    batch, heads, seq_q, head_dim = query.shape
    kv_heads, seq_k = key.shape[1], key.shape[2]
    seq_q_rounded = _round_up(seq_q, 128)
    head_dim_rounded = _round_up(head_dim, 32) if head_dim <= 192 else 256
    softmax_d = batch * heads * seq_q_rounded * 4
    dq_accum = batch * seq_q_rounded * heads * head_dim_rounded * 4
    expanded = 2 * batch * seq_k * heads * head_dim * query.element_size() if kv_heads != heads else 0
    return softmax_d + dq_accum + expanded


_GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm")


def workspace_model(
    target: TraceTarget,
) -> Callable[[Any, tuple[Any, ...], dict[str, Any], str], tuple[int, int]]:
    """(transient, persistent) bytes an op allocates inside its kernel on `target`, for `MemoryTracker`."""
    handles_with_workspace: set[str] = set()

    def model(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], phase: str) -> tuple[int, int]:
        if not (target.is_cuda and target.kernel_workspaces):
            return 0, 0
        name = func.__name__.split(".")[0]
        persistent = 0
        if name in _GEMM_OPS:
            # One cuBLAS handle per thread: the autograd engine runs CUDA backward on its own device thread,
            # so backward gets a second handle and a second workspace (CublasHandlePool.cpp, PoolWindow).
            thread = "backward" if phase == "backward" else "main"
            if thread not in handles_with_workspace:
                handles_with_workspace.add(thread)
                persistent = target.cublas_workspace_bytes
        if name == "_scaled_dot_product_flash_attention_backward":
            return flash_backward_workspace_bytes(args[1], args[2]), persistent
        return 0, persistent

    return model
