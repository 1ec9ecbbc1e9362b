"""The allocations and frees of a traced step, in order: what the allocator model replays
(:mod:`volseg.memory.estimate.allocator`) and :func:`held_peak` sums; recorded by
:class:`volseg.memory.estimate.torch_private.RecordingMemTracker`.

An event is ``(kind, handle, bytes)``: ``malloc`` and ``free`` of a storage (``handle`` names it),
``workspace`` for memory a kernel holds only while it runs (allocated and freed inside one op),
``mark`` where a training step starts, ``category`` (the third field an index into
:data:`CATEGORIES`) where a storage is counted in a category from then on, and ``op`` where an op
ends. Every figure of a step or a window is a view of these events: the peaks and growth
(:func:`held_series`), the CUDA allocator's (:mod:`volseg.memory.estimate.allocator`), the step's
bytes by
category (:func:`category_peak`).
"""

from __future__ import annotations

from typing import Any

Event = tuple[str, int, int]

#: what a storage is counted as (torch's MemTracker decides, as it meets it)
CATEGORIES = (
    "params",
    "buffers",
    "grads",
    "activations",
    "temporaries",
    "optimizer_state",
    "other",
)


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


def category_peak(events: list[Event]) -> dict[str, int]:
    """Bytes by category (:data:`CATEGORIES`) at the end of the op where the storages held
    (workspaces aside) were most: what the step holds at its peak, by what it is."""
    live: dict[int, list[int]] = {}  # handle -> [bytes, category or -1]
    totals = [0] * len(CATEGORIES)
    held, peak, at_peak = 0, 0, list(totals)
    for kind, handle, value in events:
        if kind == "malloc":
            live[handle] = [value, -1]
            held += value
        elif kind == "category":
            entry = live[handle]
            if entry[1] >= 0:
                totals[entry[1]] -= entry[0]
            entry[1] = value
            totals[value] += entry[0]
        elif kind == "free":
            size, category = live.pop(handle)
            held -= size
            if category >= 0:
                totals[category] -= size
        elif kind == "op" and held > peak:
            peak, at_peak = held, list(totals)
    return dict(zip(CATEGORIES, at_peak, strict=True))
