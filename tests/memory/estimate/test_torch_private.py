"""torch's private APIs, as volseg.memory.estimate.torch_private holds them: where torch moves or
renames a piece, the test of that piece says what of volseg's estimate breaks."""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.distributed._tools import mem_tracker

from volseg.memory.estimate.torch_private import RecordingMemTracker, module_snapshots


def test_the_private_names_the_trackers_subclass_are_where_torch_had_them():
    # _MemRefType.OPT: optimizer state under Lightning's closure (ClosureMemTracker)
    assert mem_tracker._MemRefType.OPT.value == "Optstate", "optimizer_state category"
    # _ModState.PRE_FW and the states' names: the per-module table (layers.py)
    assert mem_tracker._ModState.PRE_FW.value == "Pre-Forward", "per-module table"
    assert {s.value for s in mem_tracker._ModState} >= {
        "Pre-Forward",
        "Post-Forward",
        "Peak-Forward",
        "Pre-Backward",
        "Post-Backward",
        "Peak-Backward",
    }, "per-module table's phases"
    # the hooks the subclasses override or call
    params = list(inspect.signature(mem_tracker.MemTracker._update_snap).parameters)
    events = "the allocation events (RecordingMemTracker._update_snap) the allocator model replays"
    assert params == ["self", "u_type", "winfo", "old_mem_consumed", "old_reftype"], events
    assert {u.name for u in mem_tracker._UpdateType} >= {"ADD", "DEL", "SIZE"}, events
    for name in ("_register_global_optimizer_hook", "_track_optimizer_states", "reset_mod_stats"):
        assert hasattr(mem_tracker.MemTracker, name), f"MemTracker.{name}: the closure's optimizer"
    # the peak bookkeeping ClosureMemTracker replaces with a lookup by name (the trace's speed)
    peaks = "ClosureMemTracker._update_peak_stats, the per-category peak and per-module peaks"
    assert list(inspect.signature(mem_tracker.MemTracker._update_peak_stats).parameters) == [
        "self",
        "peak_state",
    ], peaks
    assert list(inspect.signature(mem_tracker.MemTracker._pre_fw_hook).parameters) == [
        "self",
        "module",
        "inputs",
    ], peaks
    assert mem_tracker._TOTAL_KEY == "Total", peaks
    tracker = mem_tracker.MemTracker()
    for name in ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_mod_tracker"):
        assert hasattr(tracker, name), f"MemTracker().{name}: {peaks}"
    assert hasattr(tracker._mod_tracker, "parents"), peaks
    assert {"mod_fqn", "snapshots", "local_peak"} <= set(vars(mem_tracker._ModMemStats("m"))), peaks


def test_fake_tensors_and_the_autocast_hooks_are_where_torch_had_them():
    """Fake tensors carry every traced shape; the autocast model replays ``backward``."""
    from torch._subclasses import fake_tensor

    from volseg.memory.estimate import torch_private

    step = "every estimate: the traced step's tensors (FakeTensorMode)"
    assert torch_private.FakeTensorMode is fake_tensor.FakeTensorMode, step
    with torch_private.FakeTensorMode():
        x = torch.empty(2, 3)
        assert isinstance(x, fake_tensor.FakeTensor) and x.shape == (2, 3), step
        with torch_private.unset_fake_temporarily():
            real = "inference's window bookkeeping on real tensors (unset_fake_temporarily)"
            assert not isinstance(torch.empty(1), fake_tensor.FakeTensor), real
    backward = "CUDA's autocast model around backward (torch.autograd.graph._engine_run_backward)"
    params = list(inspect.signature(torch_private.engine_run_backward).parameters)
    assert params[:2] == ["t_outputs", "args"], backward
    cast = "CUDA's autocast model's casts (torch.utils._pytree.tree_map)"
    assert torch_private.tree_map(lambda v: v * 2, (1, [2])) == (2, [4]), cast


def test_a_traced_step_gives_events_snapshots_and_flops():
    net = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv3d(4, 2, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    tracker = RecordingMemTracker()
    tracker.track_external(net, optimizer)
    x = torch.randn(1, 1, 4, 8, 8)
    with tracker:
        tracker.count_flops = True
        net(x).sum().backward()
        tracker.count_flops = False
        optimizer.step()
    kinds = {kind for kind, _, _ in tracker.events}
    assert {"malloc", "free"} <= kinds  # the allocation events
    snaps = module_snapshots(tracker, net[0])
    assert snaps is not None and {"Pre-Forward", "Post-Forward"} <= set(snaps)
    voxels = 4 * 8 * 8
    # forward 2 * MACs of each convolution, backward twice that (the input's gradient of the
    # first one is not needed: x does not require grad)
    first, second = 2 * voxels * 4 * 27, 2 * voxels * 2 * 4
    assert tracker.flops == first + second + first + 2 * second


def test_the_recording_hooks_leave_memtrackers_own_bookkeeping():
    """RecordingMemTracker's hooks (the ledger's events) leave what MemTracker keeps as torch
    keeps it: the step's peak by category and each module's snapshots, which the monitor's
    per-module table reads (a nested network, forward and backward)."""

    def traced(tracker_class):
        torch.manual_seed(0)
        inner = nn.Sequential(nn.Conv3d(2, 4, 3, padding=1), nn.ReLU())
        net = nn.Sequential(nn.Conv3d(1, 2, 3, padding=1), inner, nn.Conv3d(4, 2, 1))
        tracker = tracker_class()
        tracker.track_external(net)
        with tracker:
            net(torch.randn(1, 1, 4, 8, 8)).sum().backward()
        modules = [module_snapshots(tracker, m) for m in net.modules()]
        return tracker.get_tracker_snapshot("peak"), modules

    ours, torchs = traced(RecordingMemTracker), traced(mem_tracker.MemTracker)
    assert ours == torchs
    assert any("Peak-Backward" in m for m in ours[1] if m)  # peaks were taken in both passes
