"""Activation checkpointing and offload: same gradients and statistics, less activation memory."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from monai.losses import DiceCELoss
from torch.distributed._tools.mem_tracker import MemTracker

import volseg.models.checkpointing as checkpointing
from tests.conftest import compose_config, tiny_train_overrides
from volseg.models.segmentation_module import SegmentationModule
from volseg.models.unet import UNet3D, pooling_factors
from volseg.tasks.train import train

LOSS = DiceCELoss(to_onehot_y=True, softmax=True)


def _batch(shape=(2, 1, 16, 32, 32)):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator)
    y = torch.randint(0, 5, (shape[0], 1, *shape[2:]), generator=generator).float()
    return x, y


def _step(net: torch.nn.Module, x, y) -> torch.nn.Module:
    torch.manual_seed(1)  # same dropout masks in every variant
    LOSS(net(x), y).backward()
    return net


def _with(base: UNet3D, spec) -> UNet3D:
    net = copy.deepcopy(base)
    net.set_activation_checkpointing(spec)
    return net


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["encoder", "decoder", "all", [0], [1, 2]])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_gradients_and_batchnorm_statistics_match_no_checkpointing(spec, dropout):
    torch.manual_seed(0)
    base = UNet3D(1, 5, [8, 16, 32], norm="batch", dropout=dropout)
    x, y = _batch()
    reference = _step(copy.deepcopy(base), x, y)
    checkpointed = _step(_with(base, spec), x, y)
    for (name, p), q in zip(reference.named_parameters(), checkpointed.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name
    for (name, a), b in zip(reference.named_buffers(), checkpointed.buffers(), strict=True):
        assert torch.equal(a, b), name  # running_mean/var and num_batches_tracked


@pytest.mark.parametrize("upsampling", ["trilinear", "transposed"])
def test_anisotropic_pooling_gradients_match_no_checkpointing(upsampling):
    """A thin patch with pooling=auto (z kept at 6: [[1,2,2],[1,2,2]]) recomputes exactly."""
    torch.manual_seed(0)
    pooling = pooling_factors([8, 16, 32], "auto", [6, 32, 32])  # what the run plan passes
    base = UNet3D(1, 5, [8, 16, 32], upsampling=upsampling, pooling=pooling, patch_size=[6, 32, 32])
    assert base.pooling == [[1, 2, 2], [1, 2, 2]]
    x, y = _batch((2, 1, 6, 32, 32))
    reference = _step(copy.deepcopy(base), x, y)
    checkpointed = _step(_with(base, "all"), x, y)
    for (name, p), q in zip(reference.named_parameters(), checkpointed.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name
    for (name, a), b in zip(reference.named_buffers(), checkpointed.buffers(), strict=True):
        assert torch.equal(a, b), name


def test_without_the_freeze_recomputation_would_update_batchnorm_twice(monkeypatch):
    """The statistics test above can fail: recomputation really does run BatchNorm again."""
    monkeypatch.setattr(
        checkpointing, "frozen_norm_statistics", lambda modules: contextlib.nullcontext()
    )
    torch.manual_seed(0)
    base = UNet3D(1, 5, [8, 16, 32], norm="batch")
    x, y = _batch()
    reference = _step(copy.deepcopy(base), x, y)
    checkpointed = _step(_with(base, "all"), x, y)
    assert reference.inc[1].num_batches_tracked.item() == 1
    assert checkpointed.inc[1].num_batches_tracked.item() == 2
    assert not torch.equal(reference.inc[1].running_mean, checkpointed.inc[1].running_mean)


def _kept_activations_mib(net: torch.nn.Module, x, y) -> float:
    """Activation bytes alive after forward + loss: what is kept for backward."""
    tracker = MemTracker()
    tracker.track_external(net, x, y)
    with tracker:
        loss = LOSS(net(x), y)
        now = tracker.get_tracker_snapshot("current")
        loss.backward()
    return sum(per_device["Activation"] for per_device in now.values()) / 2**20


@pytest.mark.slow
def test_checkpointing_all_cuts_kept_activations_by_more_than_60_percent():
    torch.manual_seed(0)
    base = UNet3D(1, 5, [16, 32, 64, 128], norm="batch", activation="relu")
    x, y = _batch((2, 1, 32, 64, 64))
    none = _kept_activations_mib(copy.deepcopy(base), x, y)
    everything = _kept_activations_mib(_with(base, "all"), x, y)
    assert everything < 0.4 * none, (everything, none)
    decoder = _kept_activations_mib(_with(base, "decoder"), x, y)
    assert everything < decoder < none


def test_checkpointing_is_off_in_eval_and_without_grad():
    net = _with(UNet3D(1, 5, [4, 8]), "all").eval()
    x, _ = _batch((1, 1, 8, 16, 16))
    with torch.no_grad():
        assert net(x).shape == (1, 5, 8, 16, 16)


def test_offload_gives_the_same_gradients():
    torch.manual_seed(0)
    net = UNet3D(1, 5, [8, 16])
    x, y = _batch()

    def module(offload: bool) -> SegmentationModule:
        return SegmentationModule(
            copy.deepcopy(net),
            LOSS,
            torch.optim.SGD,
            offload_activations=offload,
            nonfinite_check_every_n_steps=1,
        )

    reference, offloaded = _step(module(False), x, y), _step(module(True), x, y)
    for p, q in zip(reference.parameters(), offloaded.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_levers_are_config_values_that_train(small_dataset, tmp_path):
    overrides = [
        *tiny_train_overrides(small_dataset),
        "model.activation_checkpointing={encoder: selective, decoder: full}",
        "model.offload_activations=true",
        "trainer.max_epochs=1",
    ]
    cfg = compose_config("train", tmp_path, overrides)
    metrics = train(cfg)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))


def test_checkpointed_loss_gives_the_same_loss_and_gradients():
    torch.manual_seed(0)
    net = UNet3D(1, 5, [8, 16])
    x, y = _batch()
    results = []
    for flag in (False, True):
        module = SegmentationModule(
            copy.deepcopy(net),
            LOSS,
            torch.optim.SGD,
            checkpoint_loss=flag,
            nonfinite_check_every_n_steps=1,
        )
        loss = module.compute_loss(module(x), y)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in module.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b)
    pairs = zip(grads_a, grads_b, strict=True)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in pairs)


SELECTIVE_SPECS = ["selective", {"encoder": "selective", "decoder": "full"}]


@pytest.mark.parametrize("spec", SELECTIVE_SPECS)
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_selective_gradients_and_batchnorm_statistics_match_no_checkpointing(spec, dropout):
    torch.manual_seed(0)
    base = UNet3D(1, 5, [4, 8, 16], norm="batch", dropout=dropout)
    x, y = _batch((2, 1, 8, 16, 16))
    reference = _step(copy.deepcopy(base), x, y)
    checkpointed = _step(_with(base, spec), x, y)
    for (name, p), q in zip(reference.named_parameters(), checkpointed.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name
    for (name, a), b in zip(reference.named_buffers(), checkpointed.buffers(), strict=True):
        assert torch.equal(a, b), name


class _CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the convolutions and batch norms that run (forward, backward, recomputation)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = {"convolution": 0, "norm": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func.overloadpacket.__name__
        if name == "convolution":
            self.counts["convolution"] += 1
        elif "batch_norm" in name and "backward" not in name:
            self.counts["norm"] += 1
        return func(*args, **(kwargs or {}))


def _op_counts(net: torch.nn.Module, x, y) -> dict[str, int]:
    with _CountOps() as counter:
        _step(net, x, y)
    return counter.counts


@pytest.mark.parametrize(("in_channels", "recomputed_convolutions"), [(3, 0), (1, 1)])
def test_selective_recomputes_norms_but_no_convolution(in_channels, recomputed_convolutions):
    """``selective`` runs each convolution once (kept) but a cheap one (the input convolution
    of one channel: 27 products per output value), and recomputes each block's first norm and
    the last block's second norm (before the head); the other second norms feed the next
    block, which keeps their output anyway. ``all`` recomputes convolutions too."""
    torch.manual_seed(0)
    base = UNet3D(in_channels, 5, [4, 8], norm="batch")
    x, y = _batch((1, in_channels, 8, 16, 16))
    none = _op_counts(copy.deepcopy(base), x, y)
    selective = _op_counts(_with(base, "selective"), x, y)
    everything = _op_counts(_with(base, "all"), x, y)
    assert selective["convolution"] == none["convolution"] + recomputed_convolutions
    assert none["norm"] == 6  # inc, down, up: two each
    assert selective["norm"] == none["norm"] + 3 + 1
    assert everything["convolution"] > none["convolution"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_selective_trains_under_autocast_with_the_gradients_of_no_checkpointing(dtype):
    torch.manual_seed(0)
    base = UNet3D(1, 5, [4, 8], norm="batch")
    x, y = _batch((1, 1, 8, 16, 16))

    def grads(net: torch.nn.Module) -> list[torch.Tensor]:
        with torch.autocast("cpu", dtype=dtype):
            logits = net(x)
        LOSS(logits.float(), y).backward()
        return [p.grad for p in net.parameters()]

    reference, selective = grads(copy.deepcopy(base)), grads(_with(base, "selective"))
    for a, b in zip(reference, selective, strict=True):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)


@pytest.mark.slow
def test_selective_keeps_at_most_60_percent_of_the_activations_of_none():
    torch.manual_seed(0)
    base = UNet3D(1, 5, [16, 32, 64, 128], norm="batch", activation="relu")
    x, y = _batch((2, 1, 32, 64, 64))
    none = _kept_activations_mib(copy.deepcopy(base), x, y)
    selective = _kept_activations_mib(_with(base, "selective"), x, y)
    everything = _kept_activations_mib(_with(base, "all"), x, y)
    assert everything < selective < 0.6 * none, (everything, selective, none)  # 93, 141, 257
