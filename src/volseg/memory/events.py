"""The allocations and frees of a traced step, in order: what the allocator model replays
(:mod:`volseg.memory.allocator`) and :func:`held_peak` sums; recorded by
:class:`volseg.memory.trackers.RecordingMemTracker`.

An event is ``(kind, handle, bytes)``: ``malloc`` and ``free`` of a storage (``handle`` names it),
``workspace`` for memory a kernel holds only while it runs (allocated and freed inside one op),
and ``mark`` where a training step starts.
"""

from __future__ import annotations

from typing import Any

Event = tuple[str, int, int]


def held_peak(events: list[Event], after_last_mark: bool = False, rounding: Any = None) -> int:
    """Most bytes held at once, workspaces included; with ``after_last_mark``, the rise above
    what was held at the last ``mark``. ``rounding`` maps a request to the bytes it takes."""
    held, live, start, peak = 0, {}, 0, 0
    for kind, handle, nbytes in events:
        size = rounding(nbytes) if rounding is not None and nbytes else nbytes
        if kind == "mark" and after_last_mark:
            start = peak = held
        elif kind == "malloc":
            live[handle] = size
            held += size
            peak = max(peak, held)
        elif kind == "workspace":
            peak = max(peak, held + size)
        elif kind == "free":
            held -= live.pop(handle)
    return peak - start


def held_at_last_mark(events: list[Event]) -> int:
    """Bytes held where the last ``mark`` event stands (e.g. where the last traced step starts:
    parameters, buffers, gradients and optimizer state)."""
    held, live, at_mark = 0, {}, 0
    for kind, handle, nbytes in events:
        if kind == "mark":
            at_mark = held
        elif kind == "malloc":
            live[handle] = nbytes
            held += nbytes
        elif kind == "free":
            held -= live.pop(handle)
    return at_mark
