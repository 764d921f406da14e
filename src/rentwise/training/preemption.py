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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
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


@dataclass
class SavePolicy:
    """When to checkpoint by time: every `every_s` seconds, or (`mtbi_s` set) Daly's interval from the last
    measured save time. Step-based saving (`every_steps`) is checked by the loop; it needs no clock."""

    every_steps: int | None = None
    every_s: float | None = None
    mtbi_s: float | None = None
    clock: Callable[[], float] = time.monotonic
    last_save_at: float = field(default=0.0)
    last_save_s: float | None = None

    def __post_init__(self) -> None:
        self.last_save_at = self.clock()

    def interval_s(self) -> float | None:
        """Seconds of training between saves, or None when no time-based policy is set."""
        if self.mtbi_s is not None and self.last_save_s is not None:
            return daly_interval_s(max(self.last_save_s, 1e-3), self.mtbi_s)
        return self.every_s

    def due_by_time(self) -> bool:
        if self.mtbi_s is not None and self.last_save_s is None:
            return True  # `auto` needs one measured save before it can compute an interval
        interval = self.interval_s()
        return interval is not None and self.clock() - self.last_save_at >= interval

    def due_by_steps(self, step: int) -> bool:
        return self.every_steps is not None and step % self.every_steps == 0

    def record_save(self, seconds: float) -> None:
        self.last_save_s = seconds
        self.last_save_at = self.clock()
