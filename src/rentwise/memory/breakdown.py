"""`MemoryBreakdown`: the one type every memory answer uses (analytic estimate, trace, measurement).

The components add up to the total by construction. Three totals exist because GPUs report three numbers:
`allocated_bytes` (torch.cuda.max_memory_allocated: live tensors + cuBLAS workspace), `reserved_bytes`
(max_memory_reserved: + caching-allocator slack) and `total_bytes` (nvidia-smi "used": + CUDA context).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

Phase = Literal["forward", "backward", "optimizer_step", "prefill", "decode"]
Source = Literal["analytic", "trace", "measured"]

# Display labels, in the order the CLI prints them. Keys are MemoryBreakdown field names.
COMPONENT_LABELS: dict[str, str] = {
    "weights_bytes": "weights",
    "quant_constants_bytes": "quantisation constants",
    "adapter_bytes": "LoRA adapter (+grads, states)",
    "gradients_bytes": "gradients",
    "optimizer_bytes": "optimizer states",
    "activations_bytes": "activations",
    "logits_bytes": "logits + loss",
    "kv_cache_bytes": "KV cache",
    "temporaries_bytes": "temporaries",
    "workspace_bytes": "cuBLAS workspace",
    "allocator_slack_bytes": "allocator slack",
    "cuda_context_bytes": "CUDA context",
}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak GPU memory per device, split by what holds it, at the phase where the peak occurs."""

    weights_bytes: int
    """Model parameters as stored on the device (base weights for LoRA/QLoRA; this rank's shard)."""
    gradients_bytes: int
    """Gradients of trainable parameters live at the peak (full fine-tune; adapters count under adapter)."""
    optimizer_bytes: int
    """Optimizer states (Adam moments, momentum, factored second moments, 8-bit states)."""
    activations_bytes: int
    """Tensors saved for backward (training) or live intermediates (inference), excluding logits."""
    logits_bytes: int
    """The logits tensor, its fp32 upcast in the loss and the loss's saved tensors / gradient."""
    kv_cache_bytes: int
    """Key/value cache (inference)."""
    adapter_bytes: int
    """LoRA adapter weights with their gradients and optimizer states."""
    quant_constants_bytes: int
    """QLoRA absmax and double-quantisation constants."""
    temporaries_bytes: int
    """Short-lived buffers at the peak: optimizer temporaries, all-gather buffers, dequantised weights."""
    workspace_bytes: int
    """cuBLAS/cuBLASLt workspace, allocated through the caching allocator."""
    allocator_slack_bytes: int
    """Reserved but unallocated memory in the caching allocator (rounding, cached free blocks)."""
    cuda_context_bytes: int
    """CUDA context and kernel images: in nvidia-smi's figure, outside PyTorch's counters."""
    peak_phase: Phase
    source: Source = "analytic"
    phase_peaks: tuple[tuple[str, int], ...] = ()
    """Allocated bytes at the end of each phase considered, e.g. (("forward", n), ("backward", m))."""
    leaves_out: tuple[str, ...] = ()
    """What this figure does not include, in plain words."""

    @property
    def allocated_bytes(self) -> int:
        """What torch.cuda.max_memory_allocated() would report."""
        return sum(int(getattr(self, name)) for name in COMPONENT_LABELS) - (
            self.allocator_slack_bytes + self.cuda_context_bytes
        )

    @property
    def reserved_bytes(self) -> int:
        """What torch.cuda.max_memory_reserved() would report."""
        return self.allocated_bytes + self.allocator_slack_bytes

    @property
    def total_bytes(self) -> int:
        """What nvidia-smi would show as used by this process: reserved + CUDA context."""
        return self.reserved_bytes + self.cuda_context_bytes

    def components(self) -> list[tuple[str, str, int]]:
        """(field name, label, bytes) for every component, in display order."""
        return [(name, label, int(getattr(self, name))) for name, label in COMPONENT_LABELS.items()]


def breakdown_fields() -> tuple[str, ...]:
    """Names of the byte-count fields of `MemoryBreakdown` (for tests and serialisers)."""
    return tuple(f.name for f in fields(MemoryBreakdown) if f.name.endswith("_bytes"))
