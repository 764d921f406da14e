"""`rentwise tco`: rent vs buy for a GPU machine (planning/tco.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rentwise.cli.plan import currency_from, offers_options
from rentwise.cli.render import emit_json, json_option, to_jsonable
from rentwise.errors import ConfigError, NotFoundError, did_you_mean
from rentwise.planning.offers import HOURS_PER_MONTH, load_offers
from rentwise.planning.tco import Ownership, TcoResult, rent_vs_buy


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--card-price", type=float, required=True, help="Price of one card (in --currency).")
@click.option("--cards", type=int, default=1, show_default=True)
@click.option("--machine-price", type=float, default=0.0, show_default=True, help="Rest of the machine.")
@click.option("--years", type=float, default=3.0, show_default=True, help="Depreciation period.")
@click.option(
    "--resale", type=float, default=0.0, show_default=True, help="Share recovered at the end (0-1)."
)
@click.option("--watts", type=float, default=0.0, show_default=True, help="Machine draw under load, W.")
@click.option("--idle-watts", type=float, default=0.0, show_default=True)
@click.option("--tariff", type=float, default=0.0, show_default=True, help="Electricity price per kWh.")
@click.option(
    "--pue", type=float, default=1.0, show_default=True, help="Cooling overhead (facility/IT power)."
)
@click.option(
    "--upkeep", type=float, default=0.0, show_default=True, help="Fixed monthly hosting/maintenance."
)
@click.option(
    "--busy-hours", type=float, default=200.0, show_default=True, help="Expected busy hours a month."
)
@click.option("--rent-price", type=float, help="Rental price per machine-hour to compare with.")
@click.option("--offer", "offer_id", help="Or an offer id from `rentwise prices` (its on-demand price).")
@offers_options
@json_option
def command(as_json: bool, **options: Any) -> int:
    """Compare buying GPUs with renting them: monthly cost and break-even busy hours.

    Example: rentwise tco --card-price 2000 --watts 600 --tariff 0.15 --offer runpod-us-1x-rtx4090-secure
    """
    currency = currency_from(options.pop("currency"), options.pop("fx"))
    rent, label = _rent_price(options, currency)
    own = Ownership(
        card_price=options["card_price"], cards=options["cards"], rest_of_machine=options["machine_price"],
        years=options["years"], resale_share=options["resale"], busy_watts=options["watts"],
        idle_watts=options["idle_watts"], tariff_per_kwh=options["tariff"], pue=options["pue"],
        upkeep_per_month=options["upkeep"],
    )  # fmt: skip
    result = rent_vs_buy(own, rent, options["busy_hours"])
    if as_json:
        emit_json(
            {**to_jsonable(result), "cheaper": result.cheaper, "rent": label, "currency": currency.code}
        )
    else:
        _render(result, label, currency.code)
    return 0


def _rent_price(options: dict[str, Any], currency: Any) -> tuple[float, str]:
    if options["rent_price"] is not None and options["offer_id"]:
        raise ConfigError("give --rent-price or --offer, not both", hint="drop one of them")
    if options["rent_price"] is not None:
        return options["rent_price"], "the given rental price"
    if not options["offer_id"]:
        raise ConfigError(
            "nothing to compare with", hint="pass --rent-price PRICE or --offer ID (`rentwise prices`)"
        )
    offers = {o.id: o for o in load_offers([Path(p) for p in options["offer_files"]], currency)}
    offer = offers.get(options["offer_id"])
    if offer is None:
        raise NotFoundError(
            f"no offer with id '{options['offer_id']}'{did_you_mean(options['offer_id'], offers)}",
            hint="run `rentwise prices` to list offer ids",
        )
    if offer.on_demand_per_hour is None:
        raise ConfigError(
            f"offer '{offer.id}' has no on-demand price", hint="pick another offer or --rent-price"
        )
    return currency.convert(offer.on_demand_per_hour, offer.currency), f"{offer.label} on-demand ({offer.id})"


def _render(r: TcoResult, label: str, cur: str) -> None:
    click.echo(f"Renting: {r.rent_per_hour:,.3f} {cur}/h, {label}.")
    click.echo(f"Owning: {r.fixed_per_month:,.2f} {cur}/month fixed (depreciation + upkeep), "
               f"{r.power_per_busy_hour:,.3f} {cur}/busy hour of power incl. PUE.")  # fmt: skip
    click.echo(f"At {r.busy_hours:g} busy hours a month: own {r.own_per_month:,.2f} {cur}, "
               f"rent {r.rent_per_month:,.2f} {cur} -> {r.cheaper} is cheaper.")  # fmt: skip
    if r.break_even_hours is None:
        click.echo(f"Break-even: none within a month's {HOURS_PER_MONTH} hours; renting stays cheaper.")
    else:
        click.echo(f"Break-even: {r.break_even_hours:,.0f} busy hours a month "
                   f"({r.break_even_hours / HOURS_PER_MONTH:.0%} utilisation); above it, buying is "
                   "cheaper.")  # fmt: skip
    click.echo("Leaves out: interest on capital, staff time, failures and downtime, future price changes, "
               "and the rental's storage/egress.")  # fmt: skip
