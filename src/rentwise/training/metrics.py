"""What a run reports: a JSONL metrics log, a cost meter, and a progress bar on stderr.

The log is appended across restarts; a `{"event": "resume", "step": N}` line marks where a restarted run
picked up, so lines with step > N written before it belong to work that was lost and redone.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any


class MetricsLog:
    """Append one JSON object per line and flush it, so a kill loses at most the line being written."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._handle = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 (closed in close())

    def write(self, record: dict[str, Any]) -> None:
        if self._handle is None:
            return
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


@dataclass(frozen=True)
class CostMeter:
    """Cost of the training time so far at a flat hourly price (excludes storage, egress and idle time)."""

    price_per_hour: float | None
    currency: str = "USD"

    def cost(self, elapsed_s: float) -> float | None:
        return None if self.price_per_hour is None else self.price_per_hour * elapsed_s / 3600.0


class ProgressView:
    """A rich progress bar: step, loss, tokens/s and ETA. Disabled on other ranks and when asked."""

    def __init__(self, total_steps: int, start_step: int, *, enabled: bool) -> None:
        self._progress: Any = None
        self._task: Any = None
        self._last_refresh = 0.0
        self._latest: dict[str, Any] = {}
        if not enabled:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        from rentwise.cli.render import stderr_console

        self._progress = Progress(
            TextColumn("step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tokens_per_s]} tok/s"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=stderr_console(),
        )
        self._task = self._progress.add_task(
            "train", total=total_steps, completed=start_step, loss="-", tokens_per_s="-"
        )

    def __enter__(self) -> ProgressView:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._refresh()  # the last step may have been throttled
            self._progress.stop()

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if self._progress is None:
            return
        self._latest = {"completed": step, "loss": f"{loss:.4f}", "tokens_per_s": f"{tokens_per_s:,.0f}"}
        if time.monotonic() - self._last_refresh >= 0.1:  # rich redraws at 10 Hz; skip needless updates
            self._refresh()

    def _refresh(self) -> None:
        self._last_refresh = time.monotonic()
        if self._latest:
            self._progress.update(self._task, **self._latest)
