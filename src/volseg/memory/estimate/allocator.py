"""A model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``): a
ledger's allocations and frees replayed to the peak of reserved memory.

Requests are rounded up to 512 bytes and served best fit from a small (≤ 1 MiB) or a large pool;
a freed block merges with its free neighbours and stays cached; with ``expandable_segments``
each pool is one segment that grows by mapping pages. Under a capacity, a request that does not
fit first releases the free cached memory, as the real allocator does before out-of-memory. Not
modelled: ``roundup_power2_divisions``, ``garbage_collection_threshold``, other streams.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from volseg.utils.units import MIB

KIB = 2**10

MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of this
SMALL_SIZE = 1 * MIB  # kSmallSize: largest request served from the small pool
SMALL_SEGMENT = 2 * MIB  # kSmallBuffer: segment size of the small pool
LARGE_SEGMENT = 20 * MIB  # kLargeBuffer: segment for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE = 2 * MIB  # kRoundLarge: larger requests get segments rounded up to this
# an expandable segment maps pages of kSmallBuffer or kLargeBuffer (ExpandableSegment's
# segment_size_) in an address space the model leaves unbounded (the capacity bounds the pages)
_ADDRESS_SPACE = 2**62


def round_size(nbytes: int) -> int:
    """Bytes the allocator hands out for a request of ``nbytes``."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(rounded: int) -> int:
    """Bytes of the new segment (one cudaMalloc) for a rounded request no cached block fits."""
    if rounded <= SMALL_SIZE:
        return SMALL_SEGMENT
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


@dataclass(frozen=True)
class AllocatorSettings:
    """The allocator settings the model follows (torch's defaults: ``AllocatorSettings()``);
    ``max_split_size``: bytes, ``None`` = unlimited."""

    expandable_segments: bool = False
    max_split_size: int | None = None

    @classmethod
    def from_conf(cls, conf: str | None) -> AllocatorSettings:
        """The settings of a ``PYTORCH_CUDA_ALLOC_CONF`` value (``key:value,...``); keys the
        model does not follow are skipped, and so is a value torch would reject."""
        expandable = re.search(r"(?:^|,)\s*expandable_segments\s*:\s*(\w+)", conf or "")
        split = re.search(r"(?:^|,)\s*max_split_size_mb\s*:\s*(\d+)", conf or "")
        return cls(
            expandable_segments=bool(expandable and expandable.group(1) == "True"),
            max_split_size=int(split.group(1)) * MIB if split else None,
        )


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    mapped: bool = True
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)

    def split(self, size: int) -> _Block:
        """Cut the first ``size`` bytes off: this block keeps them, the rest is returned."""
        rest = _Block(
            self.segment,
            self.offset + size,
            self.size - size,
            self.small,
            mapped=self.mapped,
            prev=self,
            next=self.next,
        )
        if self.next is not None:
            self.next.prev = rest
        self.next = rest
        self.size = size
        return rest

    def absorb(self, other: _Block) -> None:
        """Take in the neighbour ``other`` (before or after this block)."""
        if other is self.prev:
            self.offset = other.offset
            self.prev = other.prev
            if other.prev is not None:
                other.prev.next = self
        else:
            self.next = other.next
            if other.next is not None:
                other.next.prev = self
        self.size += other.size


class OutOfMemory(Exception):
    """A request the modelled allocator cannot serve within its capacity."""


class CachingAllocatorModel:
    """Replays ``malloc``/``free`` calls; ``peak_reserved`` and ``peak_allocated`` in bytes.
    ``capacity``: bytes the allocator may reserve (``None``: unlimited)."""

    def __init__(
        self, capacity: int | None = None, settings: AllocatorSettings | None = None
    ) -> None:
        self.capacity = capacity
        self.settings = settings or AllocatorSettings()
        # free (mapped) blocks of each pool, sorted by (size, segment, offset) for best fit
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._by_key: dict[tuple[int, int, int], _Block] = {}
        self._live: dict[int, _Block] = {}
        # expandable segments: the unmapped blocks of each pool's one segment
        self._unmapped: dict[bool, list[_Block]] = {True: [], False: []}
        self._segments = 0
        self.reserved = 0
        self.allocated = 0
        self.peak_reserved = 0
        self.peak_allocated = 0
        # allocated where a replayed phase began (replay's phase_start)
        self.phase_resident = 0

    def _insert_free(self, block: _Block) -> None:
        block.free = True
        bisect.insort(self._free[block.small], block.key())
        self._by_key[block.key()] = block

    def _insert_merged(self, block: _Block) -> None:
        """Free ``block`` merged with its free mapped neighbours."""
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free and neighbour.mapped:
                self._remove_free(neighbour)
                block.absorb(neighbour)
        self._insert_free(block)

    def _remove_free(self, block: _Block) -> None:
        key = block.key()
        pool = self._free[block.small]
        del pool[bisect.bisect_left(pool, key)]
        del self._by_key[key]

    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def malloc(self, handle: int, nbytes: int) -> None:
        """Allocate ``nbytes`` for the caller's ``handle`` (e.g. a storage id)."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._cached_block(size, small)
        if block is None:
            block = self._with_release(size, small)
        remaining = block.size - size
        max_split = self.settings.max_split_size
        if small or self.settings.expandable_segments:
            split = remaining >= MIN_BLOCK
        else:
            split = (max_split is None or size < max_split) and remaining > SMALL_SIZE
        if split:
            self._insert_free(block.split(size))
        block.free = False
        self._live[handle] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def _cached_block(self, size: int, small: bool) -> _Block | None:
        """The best-fitting free block (``get_free_block``), taken out of the pool."""
        pool = self._free[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i == len(pool):
            return None
        if self.settings.expandable_segments:
            # a block followed by unmapped room counts as the size it can grow to: a larger
            # block that cannot grow is taken before it
            while i + 1 < len(pool) and self._reach(pool[i + 1]) < self._reach(pool[i]):
                i += 1
        found = pool[i][0]
        max_split = self.settings.max_split_size
        if max_split is not None:
            if size < max_split and found >= max_split:
                return None  # no oversize block for a smaller request
            if size >= max_split and found >= size + LARGE_SEGMENT:
                return None  # an oversize block only for a request within 20 MiB of it
        block = self._by_key[pool[i]]
        self._remove_free(block)
        return block

    def _reach(self, key: tuple[int, int, int]) -> int:
        block = self._by_key[key]
        after = block.next
        return block.size + (after.size if after is not None and not after.mapped else 0)

    def _with_release(self, size: int, small: bool) -> _Block:
        """New memory for a request no cached block serves, releasing the free cached memory
        (oversize blocks first) under a capacity."""
        block = self._new_memory(size, small)
        if block is None and self._release_oversize(size):
            block = self._new_memory(size, small)
        if block is None:
            self.release_cached()
            block = self._new_memory(size, small)
        if block is None:
            raise OutOfMemory(
                f"a request of {size} bytes with {self.reserved} reserved does not fit "
                f"{self.capacity}"
            )
        return block

    def _new_memory(self, size: int, small: bool) -> _Block | None:
        """A block of at least ``size`` bytes from the driver, or ``None`` over the capacity."""
        if self.settings.expandable_segments:
            return self._expand(size, small)
        nbytes = segment_size(size)
        if not self._fits(nbytes):
            return None
        block = _Block(self._segments, 0, nbytes, small)
        self._segments += 1
        self._reserve(nbytes)
        return block

    def _expand(self, size: int, small: bool) -> _Block | None:
        """``try_allocate_expandable_block``: the lowest address of the pool's segment where a
        free block and the unmapped room after it (or unmapped room alone) hold ``size`` bytes;
        the pages it lacks are mapped and merged into one free block."""
        unmapped = self._unmapped[small]
        if not unmapped:  # the pool's segment: all address space, nothing mapped yet
            whole = _Block(self._segments, 0, _ADDRESS_SPACE, small, mapped=False)
            self._segments += 1
            unmapped.append(whole)
        candidate = None
        for block in unmapped:  # in address order
            start = block.prev if block.prev is not None and block.prev.free else block
            room, b = 0, start
            while room < size and b is not None and b.free:
                room += b.size
                b = b.next
            if room >= size:
                candidate = start
                break
        assert candidate is not None  # the last unmapped block reaches to the address space's end
        if not candidate.mapped:
            candidate = self._map(candidate, size)
        while candidate is not None and candidate.size < size:
            # a free block, then unmapped room: map what it lacks (it merges into the block)
            candidate = self._map(candidate.next, size - candidate.size)
        if candidate is None:
            return None  # what was mapped stays, as cached memory
        self._remove_free(candidate)
        return candidate

    def _map(self, block: _Block, nbytes: int) -> _Block | None:
        """``map_block``: map the pages covering the first ``nbytes`` of the unmapped ``block``;
        returns it merged with free neighbours, or ``None`` over the capacity."""
        page = SMALL_SEGMENT if block.small else LARGE_SEGMENT
        mapped = min(block.size, -(-nbytes // page) * page)
        if not self._fits(mapped):
            return None
        unmapped = self._unmapped[block.small]
        i = unmapped.index(block)
        if mapped < block.size:
            unmapped[i] = block.split(mapped)
        else:
            del unmapped[i]
        block.mapped = True
        self._insert_merged(block)
        self._reserve(mapped)
        return block

    def free(self, handle: int) -> None:
        """Return the block of ``handle`` to the cache, merged with free neighbours."""
        block = self._live.pop(handle)
        self.allocated -= block.size
        self._insert_merged(block)

    def release_cached(self) -> None:
        """``empty_cache``: free every wholly free segment, or unmap every page wholly inside a
        free block (expandable segments)."""
        for small in (True, False):
            for key in list(self._free[small]):
                block = self._by_key[key]
                if self.settings.expandable_segments:
                    self._unmap(block)
                elif block.prev is None and block.next is None:
                    self._remove_free(block)
                    self.reserved -= block.size

    def _release_oversize(self, size: int) -> bool:
        """``release_available_cached_blocks`` (with ``max_split_size``); whether it released
        enough."""
        max_split = self.settings.max_split_size
        if max_split is None or self.settings.expandable_segments:
            return False
        pool = self._free[False]
        wanted = max(size, max_split)
        i = bisect.bisect_left(pool, (wanted, -1, -1))
        if i < len(pool):
            chosen = [pool[i]]
        else:
            chosen, total = [], 0
            for key in reversed(pool):
                if total >= wanted or key[0] < max_split:
                    break
                chosen.append(key)
                total += key[0]
        released = 0
        for key in chosen:
            block = self._by_key[key]
            if block.prev is None and block.next is None:  # a whole segment
                self._remove_free(block)
                self.reserved -= block.size
                released += block.size
        return released >= wanted

    def _unmap(self, block: _Block) -> None:
        """Unmap the pages wholly inside the free ``block`` (``unmap_block``)."""
        page = SMALL_SEGMENT if block.small else LARGE_SEGMENT
        begin = -(-block.offset // page) * page
        end = (block.offset + block.size) // page * page
        if begin >= end:
            return
        self._remove_free(block)
        if begin > block.offset:  # the free bytes before the first whole page stay mapped
            head, block = block, block.split(begin - block.offset)
            self._insert_free(head)
        if end < block.offset + block.size:  # and those after the last
            self._insert_free(block.split(end - block.offset))
        block.mapped = False
        self.reserved -= block.size
        unmapped = self._unmapped[block.small]
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.mapped:
                unmapped.remove(neighbour)
                block.absorb(neighbour)
        bisect.insort(unmapped, block, key=lambda b: b.offset)


def replay(
    events: list[tuple[str, int, int]],
    capacity: int | None = None,
    settings: AllocatorSettings | None = None,
    phase_start: int | None = None,
) -> CachingAllocatorModel:
    """Run a ledger's ``malloc`` and ``free`` events through the model. With ``phase_start``, the
    peak allocated is the phase's from that event on, ``phase_resident`` what it began with."""
    allocator = CachingAllocatorModel(capacity, settings)
    for i, (op, handle, nbytes) in enumerate(events):
        if i == phase_start:
            allocator.phase_resident = allocator.peak_allocated = allocator.allocated
        if op == "malloc":
            allocator.malloc(handle, nbytes)
        elif op == "free":
            allocator.free(handle)
    return allocator
