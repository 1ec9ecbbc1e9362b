"""The CUDA caching-allocator model: rounding, pools, splitting, reuse, merging, release."""

from __future__ import annotations

import pytest

from volseg.memory.allocator import (
    LARGE_SEGMENT,
    MIB,
    SMALL_SEGMENT,
    CachingAllocatorModel,
    OutOfMemory,
    replay,
    round_size,
    segment_size,
)


def test_requests_round_to_512_bytes_and_segments_by_pool():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(1 * MIB) == SMALL_SEGMENT  # small pool: up to 1 MiB
    assert segment_size(1 * MIB + 512) == LARGE_SEGMENT  # large pool, under 10 MiB
    assert segment_size(11 * MIB + 1) == 12 * MIB  # rounded up to 2 MiB


def test_small_requests_share_one_segment():
    allocator = CachingAllocatorModel()
    for handle in range(4):
        allocator.malloc(handle, 1000)  # 1024 bytes each
    assert allocator.reserved == SMALL_SEGMENT
    assert allocator.allocated == 4 * 1024


def test_freed_block_is_reused_not_reserved_again():
    allocator = CachingAllocatorModel()
    allocator.malloc(1, 30 * MIB)
    allocator.free(1)
    allocator.malloc(2, 30 * MIB)
    assert allocator.reserved == 30 * MIB
    assert allocator.peak_allocated == 30 * MIB


def test_fragmentation_needs_a_new_segment():
    """Two freed 12 MiB blocks in separate segments cannot serve a 20 MiB request."""
    allocator = CachingAllocatorModel()
    allocator.malloc(1, 12 * MIB)
    allocator.malloc(2, 12 * MIB)
    allocator.free(1)
    allocator.free(2)
    allocator.malloc(3, 20 * MIB)
    assert allocator.reserved == 44 * MIB
    assert allocator.allocated == 20 * MIB


def test_split_blocks_merge_when_freed():
    allocator = CachingAllocatorModel()
    allocator.malloc(1, 2 * MIB)  # a 20 MiB segment, split: 2 MiB used, 18 MiB cached
    allocator.malloc(2, 2 * MIB)  # from the cached rest
    assert allocator.reserved == LARGE_SEGMENT
    allocator.free(1)
    allocator.free(2)
    allocator.malloc(3, 19 * MIB)  # needs the merged 20 MiB block
    assert allocator.reserved == LARGE_SEGMENT


def test_capacity_releases_cached_segments_then_fails():
    events = [("malloc", 1, 12 * MIB), ("malloc", 2, 12 * MIB), ("free", 1, 0), ("free", 2, 0)]
    events.append(("malloc", 3, 20 * MIB))
    assert replay(events).peak_reserved == 44 * MIB
    # within 30 MiB the two cached 12 MiB segments are released before the 20 MiB one
    assert replay(events, capacity=30 * MIB).reserved == 20 * MIB
    with pytest.raises(OutOfMemory):
        replay([*events, ("malloc", 4, 20 * MIB)], capacity=30 * MIB)
