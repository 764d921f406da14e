"""Rent vs buy: the monthly cost of owning GPUs against renting them, and the break-even busy hours.

Owning, per month, with `h` busy hours:
    fixed    = (card price × cards + rest of the machine) × (1 − resale share) / (years × 12)   straight-line
    power    = (busy W × h + idle W × (730.5 − h)) × PUE / 1000 × tariff per kWh
    own(h)   = fixed + power(h) (+ optional fixed monthly upkeep: hosting, maintenance)
Renting: rent(h) = price per machine-hour × h (only busy hours are rented).
Break-even h* solves own(h) = rent(h):  h* = (fixed + idle power) / (price − (busy − idle) power per hour);
above h* busy hours a month, buying is cheaper. There is none when renting is cheaper than the power alone.
Leaves out: interest on the capital, staff time, failures and their downtime, price changes over the
years, and the rental's storage/egress (priced per run by `rentwise plan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rentwise.errors import ConfigError
from rentwise.planning.offers import HOURS_PER_MONTH


@dataclass(frozen=True)
class Ownership:
    """What buying costs. Money in one currency; power in watts for the whole machine."""

    card_price: float
    cards: int = 1
    rest_of_machine: float = 0.0
    years: float = 3.0
    """Depreciation period (straight line)."""
    resale_share: float = 0.0
    """Share of the purchase price recovered at the end."""
    busy_watts: float = 0.0
    """Whole-machine draw under training load (cards' TDP + host)."""
    idle_watts: float = 0.0
    tariff_per_kwh: float = 0.0
    pue: float = 1.0
    """Power usage effectiveness: facility power / IT power (cooling); 1.0 = no cooling overhead."""
    upkeep_per_month: float = 0.0

    def __post_init__(self) -> None:
        problems = []
        for name in ("card_price", "rest_of_machine", "busy_watts", "idle_watts", "tariff_per_kwh",
                     "upkeep_per_month"):  # fmt: skip
            if getattr(self, name) < 0:
                problems.append(f"{name.replace('_', '-')} must not be negative, got {getattr(self, name)}")
        if self.cards < 1:
            problems.append(f"cards must be at least 1, got {self.cards}")
        if self.years <= 0:
            problems.append(f"years must be positive, got {self.years}")
        if not 0 <= self.resale_share < 1:
            problems.append(f"resale share must be in [0, 1), got {self.resale_share}")
        if self.pue < 1:
            problems.append(f"PUE is facility/IT power and cannot be below 1, got {self.pue}")
        if problems:
            raise ConfigError("; ".join(problems), hint="run `rentwise tco --help` for the inputs")

    @property
    def capital(self) -> float:
        return self.card_price * self.cards + self.rest_of_machine

    @property
    def fixed_per_month(self) -> float:
        return self.capital * (1 - self.resale_share) / (self.years * 12) + self.upkeep_per_month

    def power_per_hour(self, busy: bool) -> float:
        watts = self.busy_watts if busy else self.idle_watts
        return watts * self.pue / 1000 * self.tariff_per_kwh

    def per_month(self, busy_hours: float) -> float:
        idle_hours = max(HOURS_PER_MONTH - busy_hours, 0.0)
        return (
            self.fixed_per_month
            + busy_hours * self.power_per_hour(True)
            + idle_hours * self.power_per_hour(False)
        )


@dataclass(frozen=True)
class TcoResult:
    """Owning vs renting at the user's expected utilisation, and the break-even point."""

    rent_per_hour: float
    busy_hours: float
    own_per_month: float
    rent_per_month: float
    own_per_busy_hour: float
    break_even_hours: float | None
    """Busy hours per month above which buying is cheaper; None = never (within a month's hours too)."""
    fixed_per_month: float
    power_per_busy_hour: float

    @property
    def cheaper(self) -> str:
        return "buy" if self.own_per_month < self.rent_per_month else "rent"


def rent_vs_buy(own: Ownership, rent_per_hour: float, busy_hours: float) -> TcoResult:
    """Compare owning with renting at `rent_per_hour` for `busy_hours` a month."""
    if rent_per_hour <= 0:
        raise ConfigError(
            f"rental price must be positive, got {rent_per_hour}", hint="pass --rent-price or --offer"
        )
    if not 0 <= busy_hours <= HOURS_PER_MONTH:
        raise ConfigError(
            f"busy hours per month must be between 0 and {HOURS_PER_MONTH}, got {busy_hours}",
            hint="a month has 730.5 hours",
        )
    margin = rent_per_hour - (own.power_per_hour(True) - own.power_per_hour(False))
    base = own.fixed_per_month + HOURS_PER_MONTH * own.power_per_hour(False)
    break_even = base / margin if margin > 0 else math.inf
    own_month = own.per_month(busy_hours)
    return TcoResult(
        rent_per_hour=rent_per_hour,
        busy_hours=busy_hours,
        own_per_month=own_month,
        rent_per_month=rent_per_hour * busy_hours,
        own_per_busy_hour=own_month / busy_hours if busy_hours else math.inf,
        break_even_hours=break_even if break_even <= HOURS_PER_MONTH else None,
        fixed_per_month=own.fixed_per_month,
        power_per_busy_hour=own.power_per_hour(True),
    )
