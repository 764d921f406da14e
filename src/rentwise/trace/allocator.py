"""A model of PyTorch's CUDA caching allocator: replay traced allocations/frees to predict reserved memory.

Rules from c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x, default settings: no `max_split_size_mb`, no
`expandable_segments`, no `roundup_power2_divisions`, no garbage-collection threshold, one stream):

1. `round_size`: every request is rounded up to a multiple of kMinBlockSize = 512 bytes (minimum 512).
2. Requests of at most kSmallSize = 1 MiB come from the small pool, larger ones from the large pool.
3. `get_free_block`: best fit, the smallest cached free block of the pool that is large enough (ties by
   address).
4. `get_allocation_size`: with no cached block, a new segment is cudaMalloc'ed: kSmallBuffer = 2 MiB for
   small requests, kLargeBuffer = 20 MiB for requests under kMinLargeAlloc = 10 MiB, otherwise the request
   rounded up to kRoundLarge = 2 MiB.
5. `should_split`: the block is split when the remainder is >= 512 bytes (small pool) or > 1 MiB (large
   pool); otherwise the whole block is handed out and counted as allocated.
6. `free_block`: a freed block merges with free neighbours of the same segment and is cached, never returned
   to CUDA; only when cudaMalloc fails are free whole segments released (`release_cached_blocks`) and the
   allocation retried.

`memory_allocated` counts block sizes (so rounding and unsplit remainders count); `memory_reserved` counts
segment sizes.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from rentwise.trace.tracker import AllocEvent

MIN_BLOCK_SIZE = 512
SMALL_SIZE = 1024**2
SMALL_BUFFER = 2 * 1024**2
LARGE_BUFFER = 20 * 1024**2
MIN_LARGE_ALLOC = 10 * 1024**2
ROUND_LARGE = 2 * 1024**2


def round_size(nbytes: int) -> int:
    """Rule 1: round up to a multiple of 512 bytes."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * (-(-nbytes // MIN_BLOCK_SIZE))


def allocation_size(size: int) -> int:
    """Rule 4: the segment size cudaMalloc'ed for a (rounded) request that no cached block can serve."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * (-(-size // ROUND_LARGE))


class _Block:
    __slots__ = ("address", "is_free", "is_small", "next", "prev", "segment", "size")

    def __init__(self, address: int, size: int, segment: int, is_small: bool) -> None:
        self.address, self.size, self.segment, self.is_small = address, size, segment, is_small
        self.is_free = True
        self.prev: _Block | None = None
        self.next: _Block | None = None


@dataclass(frozen=True)
class AllocatorStats:
    """What torch.cuda.max_memory_allocated / max_memory_reserved would report for the replayed run."""

    max_allocated_bytes: int
    max_reserved_bytes: int
    segments: int
    cuda_mallocs: int
    released_segments: int
    out_of_memory: bool


class CachingAllocatorModel:
    """Replays malloc/free calls through the rules above and keeps PyTorch's counters."""

    def __init__(self, memory_limit_bytes: int | None = None) -> None:
        self._limit = memory_limit_bytes
        self._free: dict[bool, list[tuple[int, int, _Block]]] = {True: [], False: []}  # is_small -> sorted
        self._segment_sizes: dict[int, int] = {}
        self._next_address = 0
        self.allocated = self.reserved = self.max_allocated = self.max_reserved = 0
        self.cuda_mallocs = self.released = 0
        self.out_of_memory = False

    def malloc(self, nbytes: int) -> _Block:
        size = round_size(nbytes)
        is_small = size <= SMALL_SIZE  # rule 2
        block = self._take_free_block(size, is_small) or self._new_segment(size, is_small)
        remaining = block.size - size
        if remaining >= MIN_BLOCK_SIZE if is_small else remaining > SMALL_SIZE:  # rule 5
            rest = _Block(block.address + size, remaining, block.segment, is_small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert_free(rest)
        block.is_free = False
        self.allocated += block.size
        self.max_allocated = max(self.max_allocated, self.allocated)
        return block

    def free(self, block: _Block) -> None:
        """Rule 6: cache the block, merged with free neighbours in its segment."""
        self.allocated -= block.size
        block.is_free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.is_free:
                self._remove_free(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._insert_free(block)

    def stats(self) -> AllocatorStats:
        return AllocatorStats(
            max_allocated_bytes=self.max_allocated,
            max_reserved_bytes=self.max_reserved,
            segments=len(self._segment_sizes),
            cuda_mallocs=self.cuda_mallocs,
            released_segments=self.released,
            out_of_memory=self.out_of_memory,
        )

    # --- pools --------------------------------------------------------------------------------------------
    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free[block.is_small], (block.size, block.address, block))

    def _remove_free(self, block: _Block) -> None:
        pool = self._free[block.is_small]
        index = bisect.bisect_left(pool, (block.size, block.address))
        del pool[index]

    def _take_free_block(self, size: int, is_small: bool) -> _Block | None:
        """Rule 3: best fit."""
        pool = self._free[is_small]
        index = bisect.bisect_left(pool, (size, -1))
        if index == len(pool):
            return None
        block = pool.pop(index)[2]
        return block

    def _new_segment(self, size: int, is_small: bool) -> _Block:
        segment_size = allocation_size(size)
        if self._limit is not None and self.reserved + segment_size > self._limit:
            self._release_cached_segments()
            if self.reserved + segment_size > self._limit:
                self.out_of_memory = True  # a real run raises OutOfMemoryError here; we keep counting
        segment = self._next_address
        self._next_address += segment_size
        self._segment_sizes[segment] = segment_size
        self.reserved += segment_size
        self.max_reserved = max(self.max_reserved, self.reserved)
        self.cuda_mallocs += 1
        return _Block(segment, segment_size, segment, is_small)

    def _release_cached_segments(self) -> None:
        """release_cached_blocks: cudaFree every cached block that is a whole segment."""
        for is_small, pool in self._free.items():
            keep = []
            for entry in pool:
                block = entry[2]
                if block.prev is None and block.next is None:
                    self.reserved -= self._segment_sizes.pop(block.segment)
                    self.released += 1
                else:
                    keep.append(entry)
            self._free[is_small] = keep


def simulate(events: Iterable[AllocEvent], memory_limit_bytes: int | None = None) -> AllocatorStats:
    """Replay traced storage allocations and frees (in order) through the caching-allocator model."""
    model = CachingAllocatorModel(memory_limit_bytes)
    blocks: dict[int, _Block] = {}
    for event in events:
        if event.nbytes > 0:
            blocks[event.key] = model.malloc(event.nbytes)
        else:
            block = blocks.pop(event.key, None)
            if block is not None:
                model.free(block)
    return model.stats()
