from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rentwise.planning.preemption import expected_wall_s, preemption_cost
from rentwise.training.preemption import daly_interval_s

MIN = 60.0
HOUR = 3600.0


@pytest.mark.parametrize(("mtbi_s", "published_min"), [(24 * HOUR, 117), (6 * HOUR, 57), (15 * MIN, 9.1)])
def test_daly_optimum_reproduces_published_values(mtbi_s: float, published_min: float) -> None:
    # Daly 2006: δ = 5 min, R = 10 min (R does not enter the optimum).
    tau_min = daly_interval_s(5 * MIN, mtbi_s) / MIN
    assert tau_min == pytest.approx(published_min, abs=0.5 if published_min > 10 else 0.05)


def test_daly_optimum_minimises_expected_wall_time() -> None:
    delta, m, r, work = 5 * MIN, 6 * HOUR, 10 * MIN, 100 * HOUR
    best = daly_interval_s(delta, m)
    at_best = expected_wall_s(work, best, delta, r, m)
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert expected_wall_s(work, best * factor, delta, r, m) > at_best


def test_no_interruptions_costs_only_checkpoints() -> None:
    cost = preemption_cost(10 * HOUR, checkpoint_s=60, mtbi_s=math.inf, interval_s=HOUR)
    assert cost.wall_s == pytest.approx(10 * HOUR + 10 * 60)
    assert cost.expected_interruptions == 0
    assert cost.lost_s == pytest.approx(0, abs=1e-6)


def test_hand_checked_expected_wall_time() -> None:
    # M = 24 h, τ = 1 h, δ = 0, R = 0: T_w = M (e^{τ/M} − 1) T_s / τ = 24 (e^{1/24} − 1) · 10 h.
    wall = expected_wall_s(10 * HOUR, HOUR, 0.0, 0.0, 24 * HOUR)
    assert wall / HOUR == pytest.approx(24 * (math.exp(1 / 24) - 1) * 10, rel=1e-12)
    # ≈ T_s (1 + τ/(2M)): lost work is about half an interval per interruption.
    assert wall / HOUR == pytest.approx(10 * (1 + 1 / 48), rel=1e-3)


@given(
    work_h=st.floats(0.1, 500),
    mtbi_h=st.floats(0.5, 1000),
    delta_s=st.floats(1, 1800),
    restart_s=st.floats(0, 3600),
)
def test_wall_time_never_below_compute_and_interruptions_consistent(
    work_h: float, mtbi_h: float, delta_s: float, restart_s: float
) -> None:
    cost = preemption_cost(work_h * HOUR, delta_s, mtbi_h * HOUR, restart_s)
    assert cost.wall_s >= cost.compute_s
    assert cost.expected_interruptions == pytest.approx(cost.wall_s / (mtbi_h * HOUR))
    assert cost.lost_s >= 0
