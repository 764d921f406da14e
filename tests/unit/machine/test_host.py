"""Host readings through psutil (real, on this machine)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("psutil")

from rentwise.machine.host import HostSampler, process_tree


def test_host_sampler_reads_this_machine() -> None:
    sampler = HostSampler()
    first, second = sampler.read(), sampler.read()
    for reading in (first, second):
        assert 0 <= reading.cpu_pct <= 100
        assert 0 < reading.ram_used_bytes <= reading.ram_total_bytes
        assert reading.disk_read_bytes_per_s >= 0 and reading.disk_write_bytes_per_s >= 0


def test_process_tree() -> None:
    assert process_tree(os.getpid())[0] == os.getpid()
    assert process_tree(2**22 + 12345) == ()  # above Linux's pid_max: never a live process
