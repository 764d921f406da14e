"""`TraceResult`: what one traced step found (torch-free, so the CLI can render it without the extra)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rentwise.memory.breakdown import MemoryBreakdown


@dataclass(frozen=True)
class TimelineEvent:
    """One storage allocation (bytes > 0) or free (bytes < 0), in program order."""

    key: int
    nbytes: int
    phase: str
    category: str
    module: str


@dataclass(frozen=True)
class TraceResult:
    """The traced peak of one step on one device, where it happened, and what held it."""

    breakdown: MemoryBreakdown
    """Allocated components at the peak (source="trace"); slack and CUDA context from the target model."""
    peak_phase: str
    peak_module: str
    """The module that was running when the peak allocation happened ("" = outside any module)."""
    top_modules: tuple[tuple[str, int], ...]
    """Modules holding the most bytes at the peak (parameters count under the module that owns them)."""
    attention_kernels: tuple[tuple[str, int], ...]
    """sdpa kernel chosen -> number of calls (flash/efficient/math as on the target, or cpu)."""
    allocator_max_allocated_bytes: int | None
    """max_memory_allocated from the allocator model (512-byte rounding, unsplit blocks); None if not run."""
    allocator_max_reserved_bytes: int | None
    allocator_segments: int | None
    target: str
    elapsed_s: float
    notes: tuple[str, ...] = ()
    timeline: tuple[TimelineEvent, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (breakdown flattened with its three totals)."""
        data = asdict(self)
        data["breakdown"]["allocated_bytes"] = self.breakdown.allocated_bytes
        data["breakdown"]["reserved_bytes"] = self.breakdown.reserved_bytes
        data["breakdown"]["total_bytes"] = self.breakdown.total_bytes
        return data
