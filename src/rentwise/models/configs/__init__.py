"""Bundled Hugging Face config.json files (package data, read by rentwise.models.catalog)."""
