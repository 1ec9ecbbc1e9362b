"""The CUDA caching-allocator model: rounding, pools, splitting, reuse, merging, release."""

from __future__ import annotations

import pytest

from volseg.memory.estimate.allocator import (
    KIB,
    LARGE_SEGMENT,
    MIB,
    SMALL_SEGMENT,
    AllocatorSettings,
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


# -- expandable segments: pages of 2 MiB (small pool) and 20 MiB (large pool), one growing segment
# per pool; the page counts below are worked out by hand from that rule

EXPANDABLE = AllocatorSettings(expandable_segments=True)


def test_expandable_segments_map_whole_pages_as_allocations_grow():
    """Ten 7 MiB requests (large pool): 70 MiB in one segment that grows page by page.
    By hand: 1st maps page 1 (20 MiB, 13 free after it), 2nd fits (6 free), 3rd maps page 2
    (6 + 20 = 26, 19 free after it), 4th, 5th fit (5 free), 6th maps page 3 (25, 18 free),
    7th, 8th fit (4 free), 9th maps page 4 (24, 17 free), 10th fits: 4 pages = 80 MiB.
    Default segments: 20 MiB each holding two 7 MiB blocks (6 MiB left), 5 segments = 100 MiB."""
    events = [("malloc", i, 7 * MIB) for i in range(10)]
    assert replay(events, settings=EXPANDABLE).peak_reserved == 4 * LARGE_SEGMENT
    assert replay(events).peak_reserved == 5 * LARGE_SEGMENT


def test_expandable_small_pool_pages_are_2_mib():
    """Five 800 KiB requests (small pool), 4,000 KiB: 2 pages of 2,048 KiB hold them in one
    segment; default 2 MiB segments hold two each (448 KiB left): 3 segments."""
    events = [("malloc", i, 800 * KIB) for i in range(5)]
    assert replay(events, settings=EXPANDABLE).peak_reserved == 2 * SMALL_SEGMENT
    assert replay(events).peak_reserved == 3 * SMALL_SEGMENT


def test_expandable_free_blocks_merge_across_what_were_separate_segments():
    """12 + 12 MiB map 2 pages (40 MiB); freed, they merge into one 40 MiB block that serves
    20 MiB (default: two 12 MiB segments that cannot, 44 MiB)."""
    events = [("malloc", 1, 12 * MIB), ("malloc", 2, 12 * MIB), ("free", 1, 0), ("free", 2, 0)]
    events.append(("malloc", 3, 20 * MIB))
    assert replay(events, settings=EXPANDABLE).peak_reserved == 2 * LARGE_SEGMENT
    assert replay(events).peak_reserved == 44 * MIB
    # in a growing segment a block splits whenever 512 bytes or more are left (default large
    # pool: more than 1 MiB): 19.5 MiB of a 20 MiB page is 19.5 MiB allocated
    nearly_a_page = [("malloc", 1, 19 * MIB + 512 * KIB)]
    assert replay(nearly_a_page, settings=EXPANDABLE).allocated == 19 * MIB + 512 * KIB
    assert replay(nearly_a_page).allocated == 20 * MIB
    # pages are 20 MiB: within 30 MiB the second 12 MiB needs a second page, which does not fit
    with pytest.raises(OutOfMemory):
        replay(events[:2], capacity=30 * MIB, settings=EXPANDABLE)


def test_expandable_release_unmaps_only_whole_free_pages():
    """A 30 MiB block at [0, 30) and 5 MiB at [30, 35) map 2 pages. With A freed, releasing
    unmaps page [0, 20) (wholly free), keeps [20, 30) and [35, 40) mapped: 20 MiB. A 15 MiB
    request then maps [0, 20) again and merges it with [20, 30)."""
    allocator = CachingAllocatorModel(settings=EXPANDABLE)
    allocator.malloc(1, 30 * MIB)
    allocator.malloc(2, 5 * MIB)
    allocator.free(1)
    allocator.release_cached()
    assert allocator.reserved == LARGE_SEGMENT
    allocator.malloc(3, 15 * MIB)
    assert allocator.reserved == 2 * LARGE_SEGMENT
    allocator.free(3)
    allocator.free(2)
    allocator.release_cached()
    assert allocator.reserved == 0


def test_max_split_size_keeps_oversize_blocks_whole():
    ms = AllocatorSettings(max_split_size=20 * MIB)
    big_then_small = [("malloc", 1, 30 * MIB), ("free", 1, 0), ("malloc", 2, 5 * MIB)]
    assert replay(big_then_small).peak_reserved == 30 * MIB  # 5 MiB split off the 30 MiB block
    # a request under max_split_size takes no block of at least it: a new 20 MiB segment
    assert replay(big_then_small, settings=ms).peak_reserved == 50 * MIB
    # a request of at least max_split_size is not split: it holds the whole 40 MiB block
    reuse = [("malloc", 1, 40 * MIB), ("free", 1, 0), ("malloc", 2, 24 * MIB)]
    assert replay(reuse).allocated == 24 * MIB
    assert replay(reuse, settings=ms).allocated == 40 * MIB
    # ... but not a block 20 MiB or more larger than itself: a new 24 MiB segment
    far = [("malloc", 1, 50 * MIB), ("free", 1, 0), ("malloc", 2, 24 * MIB)]
    assert replay(far, settings=ms).peak_reserved == 74 * MIB


def test_max_split_size_releases_oversize_blocks_first_under_a_capacity():
    """Cached 50 and 22 MiB; 30 MiB may not take the 50 (20 MiB or more larger) and 72 + 30
    is over 80 MiB: the smallest oversize block of at least 30 MiB goes (the 50), the 22 stays."""
    events = [("malloc", 1, 50 * MIB), ("malloc", 2, 22 * MIB), ("free", 1, 0), ("free", 2, 0)]
    events.append(("malloc", 3, 30 * MIB))
    ms = AllocatorSettings(max_split_size=20 * MIB)
    assert replay(events, capacity=80 * MIB, settings=ms).reserved == 52 * MIB


def test_settings_from_an_alloc_conf_string():
    conf = "max_split_size_mb:512,roundup_power2_divisions:[256:1,>:4],expandable_segments:True"
    assert AllocatorSettings.from_conf(conf) == AllocatorSettings(True, 512 * MIB)
    assert AllocatorSettings.from_conf("expandable_segments:False") == AllocatorSettings()
    assert AllocatorSettings.from_conf(None) == AllocatorSettings()
