"""rentwise: will it fit, what should I rent, and run it without losing work."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
