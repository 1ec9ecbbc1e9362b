"""The ledger of a traced step, recorded by
:class:`volseg.memory.estimate.torch_private.RecordingMemTracker`: every figure is a view of it.

An event is ``(kind, handle, value)``: ``malloc`` and ``free`` of a storage (``handle`` names it,
``value`` its bytes), ``workspace`` for memory a kernel holds only while it runs, ``category``
(``value`` an index into :data:`CATEGORIES`) where a storage is counted in a category from then
on, ``op`` where an op ends, ``mark`` where a training step starts, ``reset`` where a forward
starts (a micro-batch's or a window batch's), ``enter`` and ``leave`` where a module's forward
starts and ends (``handle``: ``id(module)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
    its own event only; ``rounding`` maps a request to the bytes it takes."""
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


def _last(events: list[Event], kind: str = "mark") -> int:
    """Index of the last event of ``kind``; -1 where there is none."""
    return next((i for i in range(len(events) - 1, -1, -1) if events[i][0] == kind), -1)


def held_peak(events: list[Event], after_last_mark: bool = False, rounding: Any = None) -> int:
    """Most bytes held at once, workspaces included; with ``after_last_mark``, the rise above
    what was held at the last ``mark``. ``rounding`` maps a request to the bytes it takes."""
    held = held_series(events, rounding)
    start = _last(events) if after_last_mark else -1
    base = held[start] if start >= 0 else 0
    return max([base, *held[start + 1 :]]) - base


def held_at_last_mark(events: list[Event]) -> int:
    """Bytes held where the last ``mark`` event (a step's start) stands."""
    start = _last(events)
    return held_series(events)[start] if start >= 0 else 0


def _running(events: list[Event]) -> Iterator[tuple[str, int, int, list[int]]]:
    """After each event: its kind and handle, the storages' bytes held (workspaces aside) and
    those bytes by category (:data:`CATEGORIES`; a list updated in place)."""
    live: dict[int, list[int]] = {}  # handle -> [bytes, category or -1]
    totals = [0] * len(CATEGORIES)
    held = 0
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
        yield kind, handle, held, totals


def category_peak(events: list[Event]) -> dict[str, int]:
    """Bytes by category (:data:`CATEGORIES`) at the end of the op where the storages held
    (workspaces aside) were most."""
    peak, at_peak = 0, [0] * len(CATEGORIES)
    for kind, _, held, totals in _running(events):
        if kind == "op" and held > peak:
            peak, at_peak = held, list(totals)
    return dict(zip(CATEGORIES, at_peak, strict=True))


def module_activations(events: list[Event], names: Mapping[int, str]) -> dict[str, int]:
    """Each block's (:func:`blocks`) own activations in the last forward of ``events``: those
    held when its forward left minus when it entered, in bytes, largest first. ``names``:
    ``{id(module): dotted name}`` of the root's submodules."""
    activations = CATEGORIES.index("activations")
    start = _last(events, "reset")
    entered: dict[int, int] = {}
    left: dict[int, int] = {}
    for i, (kind, handle, _, totals) in enumerate(_running(events)):
        if i > start and kind == "enter":
            entered.setdefault(handle, totals[activations])
        elif i > start and kind == "leave":
            left.setdefault(handle, totals[activations])
    inside = blocks({names[h] for h in entered if h in names})
    own = {
        name: max(left.get(handle, 0) - entered[handle], 0)
        for handle, name in names.items()
        if name in inside
    }
    return dict(sorted(own.items(), key=lambda kv: kv[1], reverse=True))


def blocks(called: set[str]) -> set[str]:
    """The blocks among the dotted names of called modules (the root's left out): those inside
    exactly one other called module, e.g. ``net.inc``, ``net.ups.0``, ``loss.dice``."""
    found = set()
    for name in called:
        parts = name.split(".")
        if sum(".".join(parts[:i]) in called for i in range(1, len(parts))) == 1:
            found.add(name)
    return found
