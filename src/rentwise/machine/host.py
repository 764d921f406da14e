"""Host readings through psutil (the `gpu` extra): CPU, RAM, disk throughput and a process tree."""

from __future__ import annotations

import time
from typing import Any

from rentwise.errors import require_extra
from rentwise.machine.readings import HostReading


class HostSampler:
    """Reads the host; disk throughput is the byte-counter difference since the previous call."""

    def __init__(self) -> None:
        require_extra("psutil", "gpu")
        import psutil

        self._psutil: Any = psutil
        psutil.cpu_percent(interval=None)  # the first call only primes the counter (psutil docs)
        self._last_disk = psutil.disk_io_counters()
        self._last_time = time.monotonic()

    def read(self) -> HostReading:
        psutil = self._psutil
        memory = psutil.virtual_memory()
        disk = psutil.disk_io_counters()
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-6)
        read_rate = write_rate = 0.0
        if disk is not None and self._last_disk is not None:
            read_rate = (disk.read_bytes - self._last_disk.read_bytes) / elapsed
            write_rate = (disk.write_bytes - self._last_disk.write_bytes) / elapsed
        self._last_disk, self._last_time = disk, now
        return HostReading(
            cpu_pct=float(psutil.cpu_percent(interval=None)),
            ram_used_bytes=int(memory.total - memory.available),
            ram_total_bytes=int(memory.total),
            disk_read_bytes_per_s=max(read_rate, 0.0),
            disk_write_bytes_per_s=max(write_rate, 0.0),
        )


def process_tree(pid: int) -> tuple[int, ...]:
    """`pid` and all its descendants that are still alive (empty when `pid` is gone)."""
    import psutil

    try:
        parent = psutil.Process(pid)
        return (pid, *(child.pid for child in parent.children(recursive=True)))
    except psutil.Error:
        return ()
