"""torch's private APIs, in one module: ``MemTracker`` adapted (optimizer state under Lightning's
closure; the ledger, :mod:`volseg.memory.estimate.events`), fake tensors and autocast's hooks.
``tests/memory/estimate/test_torch_private.py`` names what breaks where torch moves any of it."""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.autograd.graph import _engine_run_backward as engine_run_backward
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import flop_registry

from volseg.memory.estimate.events import CATEGORIES, Event
from volseg.memory.estimate.workspace import Workspace
from volseg.speed.step_time import StepWork

__all__ = [
    "ClosureMemTracker",
    "FakeTensorMode",
    "RecordingMemTracker",
    "engine_run_backward",
    "module_snapshots",
    "tree_map",
    "unset_fake_temporarily",
]

#: MemTracker's reference types as :data:`volseg.memory.estimate.events.CATEGORIES` indices
_CATEGORY = {
    reftype.value: CATEGORIES.index(name)
    for reftype, name in (
        (_MemRefType.PARAM, "params"),
        (_MemRefType.BUFFER, "buffers"),
        (_MemRefType.GRAD, "grads"),
        (_MemRefType.ACT, "activations"),
        (_MemRefType.TEMP, "temporaries"),
        (_MemRefType.OPT, "optimizer_state"),
        (_MemRefType.OTH, "other"),
    )
}


class ClosureMemTracker(MemTracker):
    """MemTracker for optimizers stepped with a closure (Lightning's): forward and backward run
    inside ``step()``, so only what follows :meth:`optimizer_update_begins` (Lightning's
    ``on_before_optimizer_step``) counts as optimizer state."""

    def _register_global_optimizer_hook(self) -> None:
        def _post_hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self._track_optimizer_states(_MemRefType.OPT, optimizer)
            self._in_opt = False

        self._optimizer_hook_handles = (register_optimizer_step_post_hook(_post_hook),)

    def optimizer_update_begins(self) -> None:
        self._in_opt = True


class RecordingMemTracker(ClosureMemTracker):
    """ClosureMemTracker that records the ledger (``events``; ``meta`` storages left out), with
    each op's ``workspace`` (:data:`volseg.memory.estimate.workspace.Workspace`)."""

    def __init__(self, workspace: Workspace | None = None, peaks: bool = True) -> None:
        super().__init__()
        # MemTracker's own peak snapshots, after every op; the ledger has every figure without
        self.peaks = peaks
        self.events: list[Event] = []
        self.workspace = workspace
        self._workspaces = 0  # workspace buffers taken so far: their handles are -1, -2, ...
        # FLOPs while ``count_flops``, by FlopCounterMode's formulas on the traced ops (the mode
        # itself would decompose ops it has no formula for, changing what the trace allocates)
        self.count_flops = False
        self.flops = 0
        self.work: StepWork | None = None  # the counted step's ops, for its time

    def mark(self) -> None:
        """Note where a training step starts."""
        self.events.append(("mark", 0, 0))

    def reset_mod_stats(self) -> None:
        super().reset_mod_stats()
        self.events.append(("reset", 0, 0))

    def _update_peak_stats(self, peak_state: _ModState) -> None:
        if self.peaks:
            super()._update_peak_stats(peak_state)

    def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
        # MemTracker's PRE_FW state: a module's forward, not a recomputation in backward
        forward = module not in self.memory_tracking or not self._mod_tracker.is_bw
        super()._pre_fw_hook(module, inputs)
        if forward:
            self.events.append(("enter", id(module), 0))

    def _post_fw_hook(self, module: torch.nn.Module, inputs: Any, outputs: Any) -> None:
        super()._post_fw_hook(module, inputs, outputs)
        if not self._mod_tracker.is_bw:
            self.events.append(("leave", id(module), 0))

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:  # noqa: ANN001
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        if winfo.device.type == "meta":
            return
        name, handle = u_type.name, id(winfo)
        if name == "DEL":
            self.events.append(("free", handle, 0))
            return
        if name == "SIZE":
            self.events.append(("free", handle, 0))
        if name in ("ADD", "SIZE"):
            self.events.append(("malloc", handle, winfo.mem_consumed))
        self.events.append(("category", handle, _CATEGORY[winfo.reftype.value]))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = super().__torch_dispatch__(func, types, args, kwargs)
        # where MemTracker compares its peak: the category view (events.category_peak) too
        self.events.append(("op", 0, 0))
        if self.count_flops:
            formula = flop_registry.get(func.overloadpacket)
            flops = 0 if formula is None else int(formula(*args, **(kwargs or {}), out_val=out))
            self.flops += flops
            if self.work is not None:
                self.work.add(func, args, kwargs, out)
        if self.workspace is not None:
            nbytes = self.workspace(func, args, out)
            if isinstance(nbytes, tuple):
                # each freed before the next is taken; an inner tuple: buffers held together
                for sizes in nbytes:
                    handles = []
                    for size in sizes if isinstance(sizes, tuple) else (sizes,):
                        self._workspaces += 1
                        handles.append(-self._workspaces)
                        self.events.append(("malloc", handles[-1], size))
                    self.events.extend(("free", handle, 0) for handle in handles)
            elif nbytes:
                self.events.append(("workspace", 0, nbytes))
        return out


#: a module's snapshot per state: ``{state: {device: {category: bytes}}}``; states as MemTracker
#: names them (``Pre-Forward``, ``Post-Forward``, ``Peak-Forward``, ``Pre-Backward``, ...)
Snapshots = dict[str, dict[torch.device, dict[str, int]]]


def module_snapshots(tracker: MemTracker, module: torch.nn.Module) -> Snapshots | None:
    """The first snapshot of each state ``tracker`` took of ``module`` since its statistics were
    last reset; ``None`` where it did not see the module's forward."""
    stats = tracker.memory_tracking.get(module)
    if stats is None or not stats.snapshots.get(_ModState.PRE_FW):
        return None
    return {state.value: snaps[0] for state, snaps in stats.snapshots.items() if snaps}
