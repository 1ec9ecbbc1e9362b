"""A model of PyTorch's CUDA caching allocator: from a sequence of allocations and frees to the
peak of reserved memory.

What is modelled (``c10/cuda/CUDACachingAllocator.cpp``, default settings): request sizes are
rounded up to 512 bytes; requests of at most 1 MiB come from a small pool whose segments are
2 MiB, larger ones from a large pool whose new segments are 20 MiB for requests under 10 MiB and
the request rounded up to 2 MiB otherwise; a request takes the smallest cached block that fits
(best fit), the rest of the block is split off when it is at least 512 bytes (small pool) or more
than 1 MiB (large pool); a freed block merges with free neighbours of its segment and stays
cached. Without a capacity segments are never released, as when memory is plentiful: reserved
memory is the sum of the segments ever created. With a capacity (the GPU's memory less the CUDA
context), a new segment that would not fit first makes the allocator release every wholly free
cached segment and retry, as the real one does before it raises out-of-memory.

Not modelled: ``expandable_segments``, ``max_split_size_mb`` and ``roundup_power2_divisions``
settings, streams other than the default one, and memory that
libraries allocate outside PyTorch's allocator (cuDNN/cuBLAS handles live in the CUDA context).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from volseg.utils.units import MIB

KIB = 2**10

MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of this
SMALL_SIZE = 1 * MIB  # kSmallSize: largest request served from the small pool
SMALL_SEGMENT = 2 * MIB  # kSmallBuffer: segment size of the small pool
LARGE_SEGMENT = 20 * MIB  # kLargeBuffer: segment for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE = 2 * MIB  # kRoundLarge: larger requests get segments rounded up to this


def round_size(nbytes: int) -> int:
    """Bytes the allocator hands out for a request of ``nbytes``."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(rounded: int) -> int:
    """Bytes of the new segment (one cudaMalloc) for a rounded request no cached block fits."""
    if rounded <= SMALL_SIZE:
        return SMALL_SEGMENT
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


class OutOfMemory(Exception):
    """A request the modelled allocator cannot serve within its capacity."""


class CachingAllocatorModel:
    """Replays ``malloc``/``free`` calls; ``peak_reserved`` and ``peak_allocated`` in bytes.

    ``capacity``: bytes the allocator may reserve (``None``: unlimited); :class:`OutOfMemory` is
    raised when a request does not fit even after releasing the free cached segments.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        # free blocks of each pool, sorted by (size, segment, offset) for best fit
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._by_key: dict[tuple[int, int, int], _Block] = {}
        self._live: dict[int, _Block] = {}
        self._segments = 0
        self.reserved = 0
        self.allocated = 0
        self.peak_reserved = 0
        self.peak_allocated = 0

    def _insert_free(self, block: _Block) -> None:
        block.free = True
        bisect.insort(self._free[block.small], block.key())
        self._by_key[block.key()] = block

    def _remove_free(self, block: _Block) -> None:
        key = block.key()
        pool = self._free[block.small]
        del pool[bisect.bisect_left(pool, key)]
        del self._by_key[key]

    def malloc(self, handle: int, nbytes: int) -> None:
        """Allocate ``nbytes`` for the caller's ``handle`` (e.g. a storage id)."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):
            block = self._by_key[pool[i]]
            self._remove_free(block)
        else:
            block = self._new_segment(segment_size(size), small)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = _Block(
                block.segment, block.offset + size, remaining, small, prev=block, next=block.next
            )
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert_free(rest)
        block.free = False
        self._live[handle] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def _new_segment(self, nbytes: int, small: bool) -> _Block:
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            self._release_cached()
            if self.reserved + nbytes > self.capacity:
                raise OutOfMemory(
                    f"{nbytes} bytes more with {self.reserved} reserved is over {self.capacity}"
                )
        block = _Block(self._segments, 0, nbytes, small)
        self._segments += 1
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _release_cached(self) -> None:
        """Give every wholly free segment back (``cudaFree``), as before an out-of-memory."""
        for small in (True, False):
            for key in list(self._free[small]):
                block = self._by_key[key]
                if block.prev is None and block.next is None:
                    self._remove_free(block)
                    self.reserved -= block.size

    def free(self, handle: int) -> None:
        """Return the block of ``handle`` to the cache, merged with free neighbours."""
        block = self._live.pop(handle)
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
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


def replay(
    events: list[tuple[str, int, int]], capacity: int | None = None
) -> CachingAllocatorModel:
    """Run ``("malloc", handle, nbytes)`` / ``("free", handle, 0)`` events through the model
    (other events, such as step marks, are skipped)."""
    allocator = CachingAllocatorModel(capacity)
    for op, handle, nbytes in events:
        if op == "malloc":
            allocator.malloc(handle, nbytes)
        elif op == "free":
            allocator.free(handle)
    return allocator
