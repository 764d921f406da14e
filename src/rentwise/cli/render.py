"""Shared output helpers: results to stdout (a rich table or `--json`), everything else to stderr."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Sequence
from typing import Any

import click


def to_jsonable(value: Any) -> Any:
    """Turn dataclasses, enums, tuples and dicts into plain JSON values (recursively)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def emit_json(value: Any) -> None:
    """Print `value` as indented JSON on stdout."""
    click.echo(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False))


def stdout_console() -> Any:
    """A rich Console on stdout (imported lazily: rich costs ~30 ms)."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def stderr_console() -> Any:
    """A rich Console on stderr for progress and warnings."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def warn(message: str) -> None:
    """A one-line warning on stderr."""
    click.echo(f"warning: {message}", err=True)


json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")


def plain_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: Sequence[bool] | None = None,
    indent: int = 0,
) -> str:
    """A plain-text table with aligned columns: rich costs ~60 ms to import and render, which the < 100 ms
    answer of `rentwise memory` cannot afford."""
    right = right or [False] * len(headers)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
        return " " * indent + "  ".join(parts).rstrip()

    rule = " " * indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def catalog_table(title: str, caption: str) -> Any:
    """The rich table style of the catalog listings (`gpus`, `models`): left-aligned title and caption."""
    from rich import box
    from rich.table import Table

    return Table(
        title=title,
        caption=caption,
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
