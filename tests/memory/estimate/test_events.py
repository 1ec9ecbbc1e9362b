"""The ledger: sums read off a traced step's events."""

from __future__ import annotations

import torch
from torch import nn

from volseg.memory.estimate.events import (
    CATEGORIES,
    category_peak,
    held_peak,
    held_series,
    module_activations,
)
from volseg.memory.estimate.torch_private import RecordingMemTracker, module_snapshots
from volseg.memory.monitor.layers import CATEGORIES as TRACKER_NAMES

PHASES = ("Post-Forward", "Pre-Forward")
PARAMS, ACTIVATIONS, GRADS = (CATEGORIES.index(c) for c in ("params", "activations", "grads"))


def test_the_category_view_is_taken_at_the_end_of_the_op_that_held_most():
    events = [
        ("malloc", 1, 100),
        ("category", 1, PARAMS),
        ("op", 0, 0),
        ("malloc", 2, 50),
        ("category", 2, ACTIVATIONS),
        ("workspace", 0, 1000),  # a kernel's scratch: not a storage, in no category
        ("op", 0, 0),
        ("category", 2, GRADS),  # counted as a gradient from here on
        ("malloc", 3, 10),
        ("free", 3, 0),  # freed within the op: never at an op's end
        ("op", 0, 0),
        ("free", 2, 0),
        ("op", 0, 0),
    ]
    peak = category_peak(events)
    assert (peak["params"], peak["activations"], peak["grads"]) == (100, 50, 0)
    assert held_peak(events) == 1150  # the running sum counts the scratch during its event
    assert held_series(events)[5] == 1150 and held_series(events)[-1] == 100


def test_the_category_view_is_memtrackers_peak():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv3d(4, 2, 1))
    optimizer = torch.optim.Adam(net.parameters())
    tracker = RecordingMemTracker()
    tracker.track_external(net, optimizer)
    with tracker:
        for _ in range(2):
            tracker.reset_mod_stats()  # MemTracker follows one forward per module
            net(torch.randn(2, 1, 4, 8, 8)).sum().backward()
            optimizer.step()
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    expected = {name: snapshot[key] for key, name in TRACKER_NAMES.items()}
    assert category_peak(tracker.events) == expected
    assert expected["optimizer_state"] > 0 and expected["activations"] > 0


def test_the_module_view_is_memtrackers_own_activations():
    """Each block's own activations read off the ledger are what MemTracker's snapshots say: its
    activations after its forward less those before, in the last forward."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.ReLU()), nn.Conv3d(4, 2, 1))
    root = nn.Sequential(net)
    tracker = RecordingMemTracker()
    tracker.track_external(root)
    with tracker:
        for _ in range(2):
            tracker.reset_mod_stats()
            root(torch.randn(1, 1, 4, 8, 8)).sum().backward()
    names = {id(m): name for name, m in root.named_modules() if name}
    table = module_activations(tracker.events, names)
    expected = {}
    for name in ("0.0", "0.1"):  # the blocks: inside exactly one other called module
        snaps = module_snapshots(tracker, root.get_submodule(name))
        post, pre = (sum(d["Activation"] for d in snaps[s].values()) for s in PHASES)
        expected[name] = post - pre
    assert table == expected
    assert table["0.0"] > table["0.1"] > 0  # the convolution and ReLU keep more than the 1x1
