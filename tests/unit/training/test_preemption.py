"""Signal flag and the Young/Daly checkpoint interval."""

from __future__ import annotations

import math
import os
import signal

import pytest

from rentwise.training.preemption import SavePolicy, StopFlag, daly_interval_s


def test_first_signal_wins_and_later_ones_are_counted() -> None:
    flag = StopFlag()
    flag.install([signal.SIGUSR1])
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        flag.restore()
    assert flag.is_set and flag.signal_name == "SIGUSR1" and flag.count == 2
    assert flag.seconds_since_signal() is not None
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_daly_is_close_to_young_when_saves_are_cheap() -> None:
    save_s, mtbi_s = 10.0, 6 * 3600.0
    young = math.sqrt(2 * save_s * mtbi_s)
    assert daly_interval_s(save_s, mtbi_s) == pytest.approx(young, rel=0.02)
    # Daly (2006) eq. 37 by hand: sqrt(2δM)(1 + sqrt(δ/2M)/3 + δ/18M) − δ
    expected = young * (1 + math.sqrt(save_s / (2 * mtbi_s)) / 3 + save_s / (18 * mtbi_s)) - save_s
    assert daly_interval_s(save_s, mtbi_s) == pytest.approx(expected)


def test_daly_caps_at_mtbi_for_expensive_saves() -> None:
    assert daly_interval_s(100.0, 40.0) == 40.0
    with pytest.raises(ValueError):
        daly_interval_s(0.0, 10.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_time_policy_saves_every_interval() -> None:
    clock = FakeClock()
    policy = SavePolicy(every_s=60.0, clock=clock)
    clock.now += 59
    assert not policy.due_by_time()
    clock.now += 1
    assert policy.due_by_time()
    policy.record_save(2.0)
    assert not policy.due_by_time()


def test_auto_policy_saves_once_to_measure_then_uses_daly() -> None:
    clock = FakeClock()
    policy = SavePolicy(mtbi_s=3 * 3600.0, clock=clock)
    assert policy.due_by_time()  # no save measured yet
    policy.record_save(5.0)
    expected = daly_interval_s(5.0, 3 * 3600.0)
    assert policy.interval_s() == pytest.approx(expected)  # about 5.6 minutes
    clock.now += expected - 1
    assert not policy.due_by_time()
    clock.now += 1
    assert policy.due_by_time()


def test_step_policy() -> None:
    policy = SavePolicy(every_steps=50)
    assert [s for s in range(1, 160) if policy.due_by_steps(s)] == [50, 100, 150]
    assert not SavePolicy().due_by_steps(50) and SavePolicy().interval_s() is None
