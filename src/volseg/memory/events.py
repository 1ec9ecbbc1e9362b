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


def held_series(events: list[Event], rounding: Any = None) -> list[int]:
    """Bytes held after each event (``held[i]``: after ``events[i]``), a workspace counted during
    its own event only; ``rounding`` maps a request to the bytes it takes. The one running sum
    of the ledger: every host-side figure (peaks, growth, what a phase starts from) reads it."""
    held, live, out = 0, {}, []
    for kind, handle, nbytes in events:
        size = rounding(nbytes) if rounding is not None and nbytes else nbytes
        if kind == "malloc":
            live[handle] = size
            held += size
            out.append(held)
        elif kind == "free":
            held -= live.pop(handle)
            out.append(held)
        elif kind == "workspace":
            out.append(held + size)
        else:
            out.append(held)
    return out


def _last_mark(events: list[Event]) -> int:
    """Index of the last ``mark`` event; -1 where there is none."""
    return next((i for i in range(len(events) - 1, -1, -1) if events[i][0] == "mark"), -1)


def held_peak(events: list[Event], after_last_mark: bool = False, rounding: Any = None) -> int:
    """Most bytes held at once, workspaces included; with ``after_last_mark``, the rise above
    what was held at the last ``mark``. ``rounding`` maps a request to the bytes it takes."""
    held = held_series(events, rounding)
    start = _last_mark(events) if after_last_mark else -1
    base = held[start] if start >= 0 else 0
    return max([base, *held[start + 1 :]]) - base


def held_at_last_mark(events: list[Event]) -> int:
    """Bytes held where the last ``mark`` event stands (e.g. where the last traced step starts:
    parameters, buffers, gradients and optimizer state)."""
    start = _last_mark(events)
    return held_series(events)[start] if start >= 0 else 0
