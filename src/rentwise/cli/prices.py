"""`rentwise prices`: the offer catalog (bundled + your files), filtered, in your currency."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from rentwise.cli.plan import currency_from, offers_options
from rentwise.cli.render import emit_json, json_option, plain_table, to_jsonable
from rentwise.planning.offers import (
    BILLINGS,
    Offer,
    OfferFilter,
    filter_offers,
    load_offers,
    with_currency,
)


def _money(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.3f}" if value >= 0.1 else f"{value:.5f}"  # storage and egress are fractions of a cent


def _cheapest(offer: Offer) -> float:
    """The offer's lowest hourly price over its billing modes (a price of 0 counts)."""
    return min((p for b in BILLINGS if (p := offer.price_per_hour(b)) is not None), default=math.inf)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--gpu", default="", help="GPU name contains this (e.g. 4090, H100).")
@click.option("--provider", default="", help="Provider name contains this.")
@click.option("--region", default="", help="Region contains this.")
@click.option(
    "--billing", default="", type=click.Choice(("", *BILLINGS)), help="Only offers with this billing."
)
@click.option("--min-gpus", type=int, default=1, show_default=True)
@click.option("--max-gpus", type=int)
@click.option("--max-price", type=float, help="Cheapest hourly price at most this (in --currency).")
@click.option("--per-gpu", is_flag=True, help="Show prices per GPU-hour instead of per machine-hour.")
@offers_options
@json_option
def command(as_json: bool, per_gpu: bool, **options: Any) -> int:
    """List rental offers with hourly prices per billing mode, storage/egress prices and sources.

    Example: rentwise prices --gpu 4090 --currency CNY
    """
    currency = currency_from(options.pop("currency"), options.pop("fx"))
    offers = load_offers([Path(p) for p in options.pop("offer_files")], currency)
    wanted = OfferFilter(
        gpu=options["gpu"],
        provider=options["provider"],
        region=options["region"],
        billing=options["billing"],
        min_gpus=options["min_gpus"],
        max_gpus=options["max_gpus"],
        max_price_per_hour=options["max_price"],
    )
    shown = [with_currency(o, currency) for o in filter_offers(offers, wanted, currency)]
    shown.sort(key=lambda o: _cheapest(o) / o.gpu_count)
    if as_json:
        emit_json(to_jsonable(shown))
        return 0 if shown else 1
    if not shown:
        click.echo("No offer matches these filters.")
        return 1
    div = (lambda o: o.gpu_count) if per_gpu else (lambda o: 1)
    rows = [
        [o.id, o.provider, o.region, f"{o.gpu_count}x{o.gpu}",
         *(_money(None if o.price_per_hour(b) is None else o.price_per_hour(b) / div(o)) for b in BILLINGS),  # type: ignore[operator]
         _money(o.storage_per_gb_day), _money(o.egress_per_gb), o.as_of or "-"]
        for o in shown
    ]  # fmt: skip
    unit = "GPU-hour" if per_gpu else "machine-hour"
    headers = ["id", "provider", "region", "GPUs", "on-demand", "spot", "weekly", "monthly", "GB-day",
               "egress/GB", "as of"]  # fmt: skip
    click.echo(plain_table(headers, rows, right=[False] * 4 + [True] * 6 + [False]))
    click.echo(f"\n{len(shown)} offers; prices in {currency.code} per {unit}; '-' = not offered or not "
               "stated. Sources: `rentwise prices --json`.")  # fmt: skip
    return 0
