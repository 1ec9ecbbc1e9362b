"""The allocations and frees of a traced step, in order: what the allocator model replays.

An event is ``(kind, handle, bytes)``: ``malloc`` and ``free`` of a storage (``handle`` names it),
``workspace`` for memory a kernel holds only while it runs (allocated and freed inside one op),
and ``mark`` where a training step starts.
"""

from __future__ import annotations

from typing import Any

from volseg.memory.layers import ClosureMemTracker
from volseg.memory.workspace import Workspace

Event = tuple[str, int, int]


class RecordingMemTracker(ClosureMemTracker):
    """ClosureMemTracker that also records every allocation and free, in order; storages on the
    ``meta`` device (activations offloaded to the host) are left out. ``workspace`` gives the
    bytes a kernel holds while it runs (``None``: not modelled)."""

    def __init__(self, workspace: Workspace | None = None) -> None:
        super().__init__()
        self.events: list[Event] = []
        self.workspace = workspace

    def mark(self) -> None:
        """Note where a training step starts."""
        self.events.append(("mark", 0, 0))

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:  # noqa: ANN001
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        if winfo.device.type == "meta":
            return
        name = u_type.name
        if name == "ADD":
            self.events.append(("malloc", id(winfo), winfo.mem_consumed))
        elif name == "DEL":
            self.events.append(("free", id(winfo), 0))
        elif name == "SIZE":
            self.events.append(("free", id(winfo), 0))
            self.events.append(("malloc", id(winfo), winfo.mem_consumed))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self.workspace is not None:
            nbytes = self.workspace(func, args, out)
            if nbytes:
                self.events.append(("workspace", 0, nbytes))
        return out


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
