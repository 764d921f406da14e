"""The storage tracker counts each storage once, when created, and uncounts it when freed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rentwise.trace.tracker import MemoryTracker  # noqa: E402


def test_counts_allocations_and_frees_exactly() -> None:
    tracker = MemoryTracker()
    tracker.phase = "forward"
    with tracker:
        a = torch.ones(1000)  # 4000 bytes
        b = a * 2  # 4000 more: peak 8000
        view = b[10:]  # a view: same storage, not counted again
        del a
        c = torch.ones(500)  # 2000 bytes while a is gone: live 6000
        del b, view, c
    peak = tracker.peak()
    assert peak.peak_bytes == 8000
    assert peak.final_bytes == 0
    assert [e.nbytes for e in tracker.events()] == [4000, 4000, -4000, 2000, -4000, -2000]


def test_retag_and_host_storages_are_left_out() -> None:
    tracker = MemoryTracker()
    tracker.phase = "optimizer_step"
    with tracker:
        state = torch.zeros(256)
        step = torch.zeros(())
        tracker.retag(state, "optimizer")
        tracker.retag(step, "host")
    peak = tracker.peak()
    assert peak.by_category == {"optimizer": 1024}
    assert peak.peak_bytes == 1024


def test_categorise_overrides_the_default_attribution() -> None:
    tracker = MemoryTracker()
    tracker.phase = "forward"
    with tracker:
        with tracker.categorise("kv_cache", "cache"):
            kept = torch.empty(64)
        peak = tracker.peak()
    assert peak.by_category == {"kv_cache": 256}
    assert peak.by_module == {"cache": 256}
    del kept
