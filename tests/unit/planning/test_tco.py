from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rentwise.errors import ConfigError
from rentwise.planning.offers import HOURS_PER_MONTH
from rentwise.planning.tco import Ownership, rent_vs_buy


def test_hand_checked_break_even() -> None:
    own = Ownership(card_price=30_000, years=3, busy_watts=1000, tariff_per_kwh=0.2, pue=1.5)
    # fixed = 30000 / 36 = 833.33 per month; power = 1000 W × 1.5 / 1000 × 0.2 = 0.30 per busy hour.
    result = rent_vs_buy(own, rent_per_hour=2.0, busy_hours=300)
    assert result.fixed_per_month == pytest.approx(30_000 / 36)
    assert result.power_per_busy_hour == pytest.approx(0.30)
    assert result.break_even_hours == pytest.approx((30_000 / 36) / (2.0 - 0.30))
    assert result.own_per_month == pytest.approx(30_000 / 36 + 300 * 0.30)
    assert result.cheaper == "rent"


def test_no_break_even_when_renting_beats_power() -> None:
    own = Ownership(card_price=1000, busy_watts=1000, tariff_per_kwh=1.0)
    assert rent_vs_buy(own, rent_per_hour=0.5, busy_hours=100).break_even_hours is None


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="PUE"):
        Ownership(card_price=1, pue=0.9)
    with pytest.raises(ConfigError, match="busy hours"):
        rent_vs_buy(Ownership(card_price=1), 1.0, HOURS_PER_MONTH + 1)


@given(hours=st.floats(0, HOURS_PER_MONTH), price=st.floats(0.1, 20))
def test_buying_wins_exactly_above_break_even(hours: float, price: float) -> None:
    own = Ownership(
        card_price=5000, rest_of_machine=2000, busy_watts=700, idle_watts=100, tariff_per_kwh=0.15
    )
    result = rent_vs_buy(own, price, hours)
    if result.break_even_hours is None:
        assert result.own_per_month >= result.rent_per_month - 1e-6
    elif hours > result.break_even_hours + 1e-6:
        assert result.own_per_month <= result.rent_per_month + 1e-6
    elif hours < result.break_even_hours - 1e-6:
        assert result.own_per_month >= result.rent_per_month - 1e-6
