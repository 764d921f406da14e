"""`rentwise models [FILTER]`: the bundled model shapes (from their config.json) as a table or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rentwise.cli.render import catalog_table, emit_json, json_option, stdout_console
from rentwise.errors import NotFoundError, did_you_mean
from rentwise.models.catalog import CatalogEntry, list_models, load_shape
from rentwise.units import format_count


@click.command(
    epilog="Parameter counts are exact: they equal sum(p.numel()) of the transformers model built from the "
    "bundled config.json (tied embeddings counted once). 'active' is the parameters used per token by a "
    "mixture-of-experts model. Pass any other model to other commands as a path to its config.json."
)
@click.argument("filter_text", metavar="[FILTER]", required=False, default="")
@json_option
def command(filter_text: str, as_json: bool) -> None:
    """List the bundled models; FILTER matches the name, Hugging Face id or family.

    A FILTER that is a config.json (or a folder holding one) shows that model instead.
    """
    is_local = bool(filter_text) and Path(filter_text).exists()
    entries = [local_entry(filter_text)] if is_local else list_models(filter_text)
    if not entries:
        every = list_models()
        known = sorted({entry.name for entry in every} | {entry.family for entry in every})
        raise NotFoundError(
            f"no bundled model matches '{filter_text}'{did_you_mean(filter_text, known)}",
            hint="run `rentwise models` to list bundled models",
        )
    if as_json:
        emit_json([model_record(entry) for entry in entries])
        return
    console = stdout_console()
    table = model_table(entries, "Model shape from config.json" if is_local else "Bundled models")
    if not console.is_terminal:  # piped: one line per model rather than rich's 80-column default
        unbounded = console.options.update(max_width=10_000)
        console.width = max(console.width, console.measure(table, options=unbounded).maximum)
    console.print(table)


def local_entry(path: str) -> CatalogEntry:
    """A user's config.json (or its folder) shown as a catalog row."""
    shape = load_shape(path)
    return CatalogEntry(path, shape.hf_id, shape.model_type, shape.source, "", None, "", shape)


def model_record(entry: CatalogEntry) -> dict[str, Any]:
    """A bundled model as JSON: catalog facts plus the derived sizes."""
    shape = entry.shape
    return {
        "name": entry.name,
        "hf_id": entry.hf_id,
        "family": entry.family,
        "model_type": shape.model_type,
        "num_params": shape.num_params,
        "num_active_params": shape.num_active_params,
        "published_params": entry.published_params,
        "num_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "tie_embeddings": shape.tie_embeddings,
        "num_experts": shape.num_experts,
        "experts_per_token": shape.experts_per_token,
        "max_position_embeddings": shape.max_position_embeddings,
        "source": entry.source,
        "as_of": entry.as_of,
        "notes": entry.notes,
    }


def model_table(entries: list[CatalogEntry], title: str = "Bundled models") -> Any:
    """A rich table of bundled models, one row each."""
    table = catalog_table(
        f"{title} (exact parameter counts from config.json)",
        "active: parameters per token (MoE only). heads: query/key-value heads. tied: the LM head "
        "shares the input embedding.",
    )
    # Names and ids fold instead of being cut: a truncated id cannot be pasted into another command.
    table.add_column("model", overflow="fold")
    table.add_column("Hugging Face id", overflow="fold")
    table.add_column("arch")
    for header in ("params", "active", "layers", "hidden"):
        table.add_column(header, justify="right")
    table.add_column("heads")
    table.add_column("vocab", justify="right")
    table.add_column("tied")
    for entry in entries:
        shape = entry.shape
        table.add_row(
            entry.name,
            entry.hf_id,
            shape.model_type,
            format_count(shape.num_params),
            format_count(shape.num_active_params) if shape.is_moe else "-",
            str(shape.num_layers),
            str(shape.hidden_size),
            f"{shape.num_heads}/{shape.num_kv_heads}",
            str(shape.vocab_size),
            "yes" if shape.tie_embeddings else "no",
        )
    return table
