"""The caching-allocator model follows c10/cuda/CUDACachingAllocator.cpp's rules (see allocator.py)."""

from __future__ import annotations

import pytest

from rentwise.trace.allocator import CachingAllocatorModel, allocation_size, round_size, simulate
from rentwise.trace.tracker import AllocEvent

MIB = 1024**2


@pytest.mark.parametrize(("request_bytes", "rounded"), [(1, 512), (512, 512), (513, 1024), (4096, 4096)])
def test_requests_round_up_to_512_bytes(request_bytes: int, rounded: int) -> None:
    assert round_size(request_bytes) == rounded


@pytest.mark.parametrize(
    ("size", "segment"),
    [(512, 2 * MIB), (MIB, 2 * MIB), (MIB + 512, 20 * MIB), (10 * MIB - 512, 20 * MIB), (10 * MIB, 10 * MIB),
     (11 * MIB, 12 * MIB)],
)  # fmt: skip
def test_segment_sizes(size: int, segment: int) -> None:
    assert allocation_size(size) == segment


def test_small_requests_share_one_2mib_segment() -> None:
    model = CachingAllocatorModel()
    for _ in range(4):
        model.malloc(1000)
    assert (model.allocated, model.reserved, model.cuda_mallocs) == (4 * 1024, 2 * MIB, 1)


def test_large_block_is_not_split_when_remainder_is_at_most_1mib() -> None:
    model = CachingAllocatorModel()
    model.malloc(19 * MIB + 512)  # 20 MiB segment, remainder 0.5 MiB stays in the block
    assert model.allocated == 20 * MIB


def test_large_block_is_split_when_remainder_exceeds_1mib() -> None:
    model = CachingAllocatorModel()
    model.malloc(2 * MIB)
    model.malloc(2 * MIB)  # served from the first 20 MiB segment's remainder
    assert (model.allocated, model.reserved) == (4 * MIB, 20 * MIB)


def test_freed_blocks_are_cached_and_merged() -> None:
    model = CachingAllocatorModel()
    first, second = model.malloc(4 * MIB), model.malloc(4 * MIB)
    model.free(first)
    model.free(second)
    model.malloc(18 * MIB)  # fits only because the two blocks merged back with the free remainder
    assert (model.reserved, model.cuda_mallocs) == (20 * MIB, 1)


def test_best_fit_picks_the_smallest_sufficient_block() -> None:
    model = CachingAllocatorModel()
    big, small = model.malloc(40 * MIB), model.malloc(12 * MIB)
    model.free(big)
    model.free(small)
    model.malloc(12 * MIB)
    model.malloc(40 * MIB)
    assert model.reserved == 52 * MIB


def test_release_cached_segments_on_would_be_oom() -> None:
    model = CachingAllocatorModel(memory_limit_bytes=64 * MIB)
    model.free(model.malloc(40 * MIB))
    model.malloc(50 * MIB)  # does not fit in the 40 MiB cached segment; that segment is released first
    stats = model.stats()
    assert (stats.released_segments, stats.out_of_memory, model.reserved) == (1, False, 50 * MIB)


def test_simulate_replays_events_by_key() -> None:
    events = [
        AllocEvent(0, 3 * MIB, "forward"),
        AllocEvent(1, 100, "forward"),
        AllocEvent(0, -3 * MIB, "forward"),
    ]
    stats = simulate(events)
    assert stats.max_allocated_bytes == 3 * MIB + 512
    assert stats.max_reserved_bytes == 22 * MIB
