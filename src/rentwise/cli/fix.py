"""`rentwise fix MODEL --gpu CARD`: the OOM doctor (planning/fix.py) on the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rentwise.cli.job_options import job_from_options, job_options
from rentwise.cli.plan import currency_from, offers_options
from rentwise.cli.render import emit_json, json_option, plain_table, to_jsonable
from rentwise.errors import ConfigError, NotFoundError
from rentwise.hardware.catalog import GpuSpec, find_gpu, load_gpus
from rentwise.planning.fix import Diagnosis, card_from_size, diagnose
from rentwise.planning.offers import load_offers
from rentwise.units import parse_size


def resolve_card(text: str) -> GpuSpec:
    """A catalog GPU by name, else a bare size such as '24GB' or '24' (GiB)."""
    try:
        return find_gpu(text)
    except NotFoundError as missing:
        stripped = text.strip().lower()
        if stripped and (stripped[0].isdigit() or stripped[0] == "."):
            # Card sizes are nameplate sizes, and a card's "24GB" is 24 GiB (gpus.toml: NVIDIA's "80GB"
            # parts show 81920 MiB), so GB is read as GiB here.
            size_bytes = parse_size(stripped.replace("gib", "").replace("gb", "").strip() or "0")
            if size_bytes <= 0:
                raise ConfigError(
                    f"card size '{text}' must be more than 0",
                    hint="give a catalog name (--gpu 'RTX 4090') or a size (--gpu 24GB)",
                ) from None
            return card_from_size(size_bytes)
        raise missing


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model")
@click.option("--gpu", "card", required=True, help="Your card: a catalog name (RTX 4090) or a size (24GB).")
@job_options
@offers_options
@click.option("--top", type=int, default=12, show_default=True, help="Remedies to show.")
@json_option
def command(model: str, card: str, top: int, as_json: bool, **options: Any) -> int:
    """Explain why MODEL's job runs out of memory on your GPU and rank the fixes, best first.

    Example: rentwise fix llama-3.1-8b --gpu "RTX 4090" --method full --batch 4
    """
    from rentwise.models.catalog import load_shape

    currency = currency_from(options.pop("currency"), options.pop("fx"))
    offers = load_offers([Path(p) for p in options.pop("offer_files")], currency)
    job = job_from_options(options)
    if not job.is_training:
        raise ConfigError("fix is for training jobs", hint="use --method full, lora or qlora")
    gpu = resolve_card(card)
    shape = load_shape(model)
    diagnosis = diagnose(shape, job, gpu, load_gpus(), offers, currency)
    if as_json:
        emit_json({**to_jsonable(diagnosis), "over_bytes": diagnosis.over_bytes})
    else:
        _render(diagnosis, top)
    return 0 if any(r.fits for r in diagnosis.remedies) or diagnosis.over_bytes <= 0 else 1


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def _render(d: Diagnosis, top: int) -> None:
    total = d.breakdown.total_bytes
    if d.over_bytes > 0:
        click.echo(f"{d.model} needs {_gib(total)} GiB on {d.gpu}, which has {_gib(d.capacity_bytes)} GiB: "
                   f"{_gib(d.over_bytes)} GiB over (peak in {d.breakdown.peak_phase}).")  # fmt: skip
    else:
        click.echo(f"{d.model} needs {_gib(total)} GiB on {d.gpu} ({_gib(d.capacity_bytes)} GiB): it fits, "
                   f"{_gib(-d.over_bytes)} GiB to spare. Changes that save more memory:")  # fmt: skip
    biggest = ", ".join(f"{label} {_gib(size)} GiB" for label, size in d.largest[:4])
    click.echo(f"Largest parts: {biggest}.")
    if d.overflowing:
        parts = " + ".join(d.overflowing)
        verb = "alone exceeds" if len(d.overflowing) == 1 else "already exceed"
        click.echo(f"What overflows: {parts} {verb} the card's {_gib(d.capacity_bytes)} GiB.")
    click.echo("")
    rows = [
        [str(i), "yes" if r.fits else "no", r.change, f"{_gib(r.peak_bytes)}/{_gib(r.capacity_bytes)}",
         "-" if r.relative_time is None else f"{r.relative_time:.2f}×",
         "-" if r.cost_per_mtok is None else f"{r.cost_per_mtok:,.3f}"]
        for i, r in enumerate(d.remedies[:top], start=1)
    ]  # fmt: skip
    headers = ["#", "fits", "change", "GiB peak/cap", "time/token", f"{d.currency}/Mtok"]
    click.echo(plain_table(headers, rows, right=[True, False, False, True, True, True]))
    click.echo("\ntime/token: relative to your job on your card (planning/time.py model); "
               f"{d.currency}/Mtok: cheapest on-demand offer of that card in the catalog; '-' = none or "
               "unknown (a card given only by size has no compute figures).")  # fmt: skip
