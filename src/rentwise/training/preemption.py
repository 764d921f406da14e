"""Stopping on a signal, and how often to checkpoint when interruptions are expected.

A signal handler only sets a flag (it runs between two bytecodes of the training loop, so doing more there is
unsafe); the loop checks the flag at its next safe point, all ranks agree, save, and exit with code 75.

The `auto` checkpoint interval is Daly's higher-order estimate of the optimum compute time between
checkpoints (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 22(3), 2006, eq. 37), which refines Young's first-order sqrt(2·δ·M) (J. W. Young, CACM 17(9), 1974):
    τ = sqrt(2δM)·[1 + (1/3)·sqrt(δ/(2M)) + δ/(18M)] − δ   for δ < 2M,   τ = M otherwise,
where δ is the measured time to write one checkpoint and M the mean time between interruptions.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Iterable
from types import FrameType

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopFlag:
    """Set by SIGTERM/SIGINT/SIGUSR1; remembers the first signal and when it arrived (monotonic clock).

    Later signals (a second SIGTERM while the checkpoint is being written) are counted and otherwise ignored,
    so they cannot interrupt the save half-way.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self.count = 0
        self._previous: dict[signal.Signals, object] = {}

    @property
    def is_set(self) -> bool:
        return self.signal_name is not None

    def set(self, name: str) -> None:
        """Record a stop request (the handler, and tests, call this)."""
        self.count += 1
        if self.signal_name is None:
            self.signal_name = name
            self.received_at = time.monotonic()

    def install(self, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        """Route `signals` to this flag (main thread only, as Python requires)."""
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put back the handlers that were there before `install()`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def seconds_since_signal(self) -> float | None:
        return None if self.received_at is None else time.monotonic() - self.received_at

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.set(signal.Signals(signum).name)


def daly_interval_s(save_s: float, mtbi_s: float) -> float:
    """Compute time between checkpoints that minimises expected lost plus saving time (Daly 2006, eq. 37)."""
    if save_s <= 0 or mtbi_s <= 0:
        raise ValueError("save time and mean time between interruptions must be positive")
    if save_s >= 2 * mtbi_s:
        return mtbi_s
    ratio = save_s / (2 * mtbi_s)
    return math.sqrt(2 * save_s * mtbi_s) * (1 + math.sqrt(ratio) / 3 + save_s / (18 * mtbi_s)) - save_s
