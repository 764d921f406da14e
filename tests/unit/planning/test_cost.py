from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rentwise.planning.cost import DataVolumes, billed_hours, run_cost
from rentwise.planning.offers import Offer


def offer(**overrides: object) -> Offer:
    values: dict[str, object] = dict(
        id="t",
        provider="P",
        region="r",
        gpu="A100 80GB SXM4",
        gpu_count=1,
        currency="USD",
        source="test",
        on_demand_per_hour=2.0,
        spot_per_hour=0.8,
        weekly_per_hour=1.5,
    )
    values.update(overrides)
    return Offer(**values)  # type: ignore[arg-type]


def test_billing_units_round_up() -> None:
    assert billed_hours(1.01, "on_demand", 3600) == pytest.approx(2.0)
    assert billed_hours(1.01, "on_demand", 1) == pytest.approx(1.01, abs=1e-3)
    assert billed_hours(1.01, "on_demand", None) == pytest.approx(2.0)  # unknown unit: whole hours
    assert billed_hours(10, "weekly", None) == pytest.approx(168)
    assert billed_hours(169, "weekly", None) == pytest.approx(336)
    assert billed_hours(0, "on_demand", 1) == 0


def test_hand_checked_cost_split() -> None:
    o = offer(billing_unit_s=1, storage_per_gb_day=0.01, egress_per_gb=0.09, snapshot_per_gb_month=0.05)
    volumes = DataVolumes(stored_bytes=100e9, egress_bytes=20e9, snapshot_bytes=16e9, snapshot_months=2)
    cost = run_cost(o, "on_demand", 12.0, volumes)
    assert cost.compute == pytest.approx(24.0)  # 12 h × $2
    assert cost.storage == pytest.approx(100 * 0.01 * 0.5)  # 100 GB × 0.01/day × half a day
    assert cost.egress == pytest.approx(20 * 0.09)
    assert cost.snapshot == pytest.approx(16 * 0.05 * 2)
    assert cost.total == pytest.approx(24 + 0.5 + 1.8 + 1.6)
    assert cost.unknown == ()


def test_unknown_prices_are_named_not_guessed() -> None:
    cost = run_cost(offer(), "spot", 3.0, DataVolumes(stored_bytes=1e9, egress_bytes=1e9))
    assert cost.storage == cost.egress == 0
    assert cost.unknown == ("storage", "egress")


@given(
    hours=st.floats(0.01, 1000),
    more=st.floats(0, 100),
    price=st.floats(0.01, 100),
    more_price=st.floats(0, 10),
)
def test_cost_monotonic_in_hours_and_price(
    hours: float, more: float, price: float, more_price: float
) -> None:
    volumes = DataVolumes(stored_bytes=5e9, egress_bytes=1e9)
    base = run_cost(
        offer(on_demand_per_hour=price, billing_unit_s=1, storage_per_gb_day=0.1), "on_demand", hours, volumes
    )
    longer = run_cost(
        offer(on_demand_per_hour=price, billing_unit_s=1, storage_per_gb_day=0.1),
        "on_demand",
        hours + more,
        volumes,
    )
    dearer = run_cost(
        offer(on_demand_per_hour=price + more_price, billing_unit_s=1, storage_per_gb_day=0.1),
        "on_demand",
        hours,
        volumes,
    )
    assert longer.total >= base.total - 1e-9
    assert dearer.total >= base.total - 1e-9
