"""The bundled model catalog and `load_shape`: a model name, HF id or config.json path -> `ModelShape`.

Bundled configs live in `models/configs/<short-name>.json`: the model's published Hugging Face config.json
(size-defining fields only, no weights) plus a `_rentwise` block with `hf_id`, `family`, `source`, `as_of`,
`aliases` (instruct/chat ids with the same shape) and, where known exactly, `published_params`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rentwise.errors import ConfigError, NotFoundError, did_you_mean
from rentwise.models.shape import ModelShape, shape_from_config

# Package data next to this file (setuptools installs it as plain files; importlib.resources costs ~9 ms).
_CONFIG_DIR = Path(__file__).parent / "configs"
_UNKNOWN_HINT = "run `rentwise models` to list bundled models, or pass a path to a config.json"


@dataclass(frozen=True)
class CatalogEntry:
    """One bundled model: its short name, where its config came from, and its shape."""

    name: str
    hf_id: str
    family: str
    source: str
    as_of: str
    published_params: int | None
    notes: str
    shape: ModelShape
    aliases: tuple[str, ...] = ()


def _parse_json(text: str, origin: str) -> dict[str, Any]:
    """Parse config.json text; a `ConfigError` names the file and the JSON error position."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"{origin} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}",
            hint="fix the file, or pass a bundled name from `rentwise models`",
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"{origin} must hold a JSON object, got {type(config).__name__}",
            hint="pass a Hugging Face config.json",
        )
    return config


@functools.lru_cache(maxsize=1)
def _bundled() -> dict[str, CatalogEntry]:
    """All bundled entries by lower-case short name (parsed once per process)."""
    entries: dict[str, CatalogEntry] = {}
    for item in sorted(_CONFIG_DIR.glob("*.json")):
        name = item.stem
        config = _parse_json(item.read_text(encoding="utf-8"), f"bundled config {item.name!r}")
        meta = config.get("_rentwise", {})
        hf_id = str(meta.get("hf_id", ""))
        shape = shape_from_config(config, name=name, source=str(meta.get("source", "")), hf_id=hf_id)
        entries[name.lower()] = CatalogEntry(
            name=name,
            hf_id=hf_id,
            family=str(meta.get("family", shape.model_type)),
            source=str(meta.get("source", "")),
            as_of=str(meta.get("as_of", "")),
            published_params=meta.get("published_params"),
            notes=str(meta.get("notes", "")),
            shape=shape,
            aliases=tuple(str(alias) for alias in meta.get("aliases", ())),
        )
    return entries


@functools.lru_cache(maxsize=1)
def _by_other_name() -> dict[str, CatalogEntry]:
    """Entries by lower-case HF id and alias."""
    return {
        other.lower(): entry
        for entry in _bundled().values()
        for other in (entry.hf_id, *entry.aliases)
        if other
    }


def list_models(name_filter: str = "") -> list[CatalogEntry]:
    """Bundled models whose name, HF id or family contains `name_filter`, by family then size."""
    needle = name_filter.lower()
    entries = [
        entry
        for entry in _bundled().values()
        if needle in entry.name.lower() or needle in entry.hf_id.lower() or needle in entry.family.lower()
    ]
    return sorted(entries, key=lambda e: (e.family, e.shape.num_params, e.name))


def load_shape(spec: str) -> ModelShape:
    """Resolve `spec` to a `ModelShape`.

    Tried in order: a bundled short name, HF id or alias (case-insensitive); a path to a config.json;
    a folder holding config.json; a hub id `org/name` fetched with `huggingface_hub` (optional extra `hub`).

    Raises:
        NotFoundError: nothing matches `spec` (with the closest bundled names), or the hub fetch failed.
        ConfigError: the config.json is malformed or lacks a required field.
    """
    key = spec.strip().lower()
    entry = _bundled().get(key) or _by_other_name().get(key)
    if entry is not None:
        return entry.shape
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise NotFoundError(f"folder '{spec}' has no config.json", hint=_UNKNOWN_HINT)
    if path.is_file():
        return _load_config_file(path)
    if spec.endswith(".json") or spec.startswith(("/", "./", "../", "~")):
        raise NotFoundError(f"no file at '{spec}'", hint=_UNKNOWN_HINT)
    if _looks_like_hub_id(spec):
        return _load_from_hub(spec.strip())
    known = [e.name for e in _bundled().values()]
    raise NotFoundError(
        f"no model named '{spec}' in the catalog{did_you_mean(spec, known)}", hint=_UNKNOWN_HINT
    )


def _load_config_file(path: Path, hf_id: str = "") -> ModelShape:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read '{path}': {error}", hint="pass a readable config.json") from None
    config = _parse_json(text, f"'{path}'")
    return shape_from_config(config, name=hf_id or str(path), source=str(path), hf_id=hf_id)


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.strip().split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


def _load_from_hub(repo_id: str) -> ModelShape:
    """Fetch `config.json` of `repo_id` with huggingface_hub (which caches it); failures are NotFoundError."""
    hint = (
        "download the model's config.json and pass its path, or pip install 'rentwise[hub]' "
        "(and check the id and your network or HF_TOKEN)"
    )
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise NotFoundError(
            f"'{repo_id}' is not a bundled model and huggingface_hub is not installed to fetch it", hint=hint
        ) from None
    try:
        local = hf_hub_download(repo_id, "config.json")
    except Exception as error:  # network, auth, missing repo: all mean "cannot get this config"
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise NotFoundError(f"cannot fetch config.json of '{repo_id}' from the Hugging Face Hub: {reason}",
                            hint=hint) from None  # fmt: skip
    return _load_config_file(Path(local), hf_id=repo_id)
