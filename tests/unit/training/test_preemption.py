"""Signal flag and the Young/Daly checkpoint interval."""

from __future__ import annotations

import math
import os
import signal

import pytest

from rentwise.training.preemption import StopFlag, daly_interval_s


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
