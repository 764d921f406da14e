"""Model shapes from Hugging Face config.json files (no weights) and the bundled model catalog."""

from __future__ import annotations

from rentwise.models.catalog import CatalogEntry, list_models, load_shape
from rentwise.models.shape import LinearLayer, ModelShape, shape_from_config

__all__ = ["CatalogEntry", "LinearLayer", "ModelShape", "list_models", "load_shape", "shape_from_config"]
