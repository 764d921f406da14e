"""rentwise: will it fit, what should I rent, and run it without losing work.

The public API is loaded lazily (PEP 562 `__getattr__`), so `import rentwise` stays cheap for the CLI and
never imports torch:

    from rentwise import MemoryJob, estimate_memory, load_shape
    estimate_memory(load_shape("qwen2.5-7b"), MemoryJob(method="lora", precision="bf16")).total_bytes
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "ConfigError": "rentwise.errors",
    "GpuSpec": "rentwise.hardware.catalog",
    "JobSpec": "rentwise.planning.job",
    "Offer": "rentwise.planning.offers",
    "MemoryBreakdown": "rentwise.memory.breakdown",
    "MemoryJob": "rentwise.memory.job",
    "ModelShape": "rentwise.models.shape",
    "RentwiseError": "rentwise.errors",
    "diagnose": "rentwise.planning.fix",
    "estimate_memory": "rentwise.memory.estimate",
    "find_gpu": "rentwise.hardware.catalog",
    "fit_on_gpus": "rentwise.memory.fit",
    "load_gpus": "rentwise.hardware.catalog",
    "load_offers": "rentwise.planning.offers",
    "load_shape": "rentwise.models.catalog",
    "plan": "rentwise.planning.planner",
    "shape_from_config": "rentwise.models.shape",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rentwise' has no attribute {name!r}")
