"""The memory levers of a training step, each one config value: :class:`MemoryLevers` validates and
applies them in one stated order; :data:`LEVERS` lists them all in the order to try them."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from volseg.models import offload
from volseg.models.checkpointing import CHECKPOINTING_CHOICES, CheckpointSpec
from volseg.models.networks import adapter_for
from volseg.utils.config import plain

#: when :meth:`MemoryLevers.apply` runs: at construction, at ``setup``, at every stage's start
When = Literal["build", "setup", "start"]


@dataclass(frozen=True)
class Lever:
    """One thing a user can set to cut memory, and when it acts (train or inference)."""

    name: str
    setting: str
    does: str
    during: Literal["train", "inference"] = "train"


#: the named settings that recompute convolutions (``selective`` has its own row)
FULL_CHOICES = tuple(c for c in CHECKPOINTING_CHOICES if c not in ("none", "selective"))

#: every memory lever, training's first, each group in the order to try them
LEVERS = (
    Lever(
        "mixed precision",
        "trainer.precision=bf16-mixed",
        "half-size activations (16-mixed before Ampere; the default, auto, picks it on a GPU)",
    ),
    Lever(
        "selective activation checkpointing",
        "model.activation_checkpointing=selective",
        "keep convolution outputs, recompute norms and activations in backward (torch's selective "
        "checkpointing): no convolution runs twice but a cheap input one; any network; "
        '`"{encoder: selective, decoder: full}"` mixes it on UNet3D '
        "([price](networks.md#selective-activation-checkpointing))",
    ),
    Lever(
        "micro-batching",
        "data.batch_size=1 trainer.accumulate_grad_batches=2",
        "same effective batch, half the activations; BatchNorm then normalizes with one "
        "sample's statistics, so use model=unet_small_gn / unet_large_gn (GroupNorm) or "
        "model.net.norm=instance",
    ),
    Lever(
        "a smaller patch",
        "data.patch_size=[D,H,W]",
        "activations scale with the patch's voxel count",
    ),
    Lever(
        "activation checkpointing",
        f"model.activation_checkpointing={'|'.join(FULL_CHOICES)}|[0,1]",
        "recompute those blocks' activations in backward (non-reentrant "
        "torch.utils.checkpoint) instead of keeping them; UNet3D's choices and level indices, "
        "any other network's all|[submodule names] (docs/networks.md)",
    ),
    Lever(
        "loss checkpointing",
        "model.checkpoint_loss=true",
        "recompute the loss's intermediates in backward; the loss is the forward's last call and "
        "backward's first, so they are rebuilt while every activation is held, and its input is "
        "kept besides: fewer activations kept, the same peak (`checkpointing: all + loss` beside "
        "`all`, [levers](benchmarks.md#memory-levers))",
    ),
    Lever(
        "activation offload",
        "model.offload_activations=true",
        "keep saved tensors in host memory during forward (pinned on CUDA; strides kept); a GPU "
        "lever, it saves nothing on a CPU",
    ),
    Lever(
        "encoder/decoder split",
        'model.placement="{encoder: cuda:0, decoder: cuda:1}"',
        "the encoder on one device, the decoder on another (any other network: its submodules "
        "by name); tensors cross with differentiable .to, so backward and the optimizer span both",
    ),
    Lever(
        "fewer windows at once",
        "model.inferer.sw_batch_size=1",
        "fewer sliding windows' activations at once",
        "inference",
    ),
    Lever(
        "host stitching",
        "model.inferer.device=cpu",
        "stitch the volume in host memory, windows stay on the GPU (predict.py: stitch=auto "
        "picks it per volume)",
        "inference",
    ),
    Lever(
        "smaller windows",
        "model.inferer.roi_size=[D,H,W]",
        "smaller windows (default: the training patch)",
        "inference",
    ),
)


def lever_lines(during: str) -> list[str]:
    """The levers acting ``during`` ``train`` or ``inference`` as numbered lines (OOM report)."""
    chosen = [lever for lever in LEVERS if lever.during == during]
    return [f"  {i}. {lever.name}: {lever.setting}" for i, lever in enumerate(chosen, start=1)]


#: ``model.offload_activations`` value that offloads only the input-resolution maps
FULL_RESOLUTION = "full_resolution"
#: cuDNN's environment variable capping its convolutions' workspace (MiB)
CUDNN_WORKSPACE_CAP_ENV = "CUDNN_CONV_WSCAP_DBG"


def _error(message: str) -> ValueError:
    """An error about a lever of the ``model`` config, naming its key (``model.<lever>``)."""
    return ValueError(f"model.{message}")


def _checkpointing(value: Any) -> CheckpointSpec:
    """The setting's form; whether the network takes it is its adapter's to say."""
    value = plain(value)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        return value  # {part: full|selective}: the adapter checks parts and modes
    if isinstance(value, list) and value and all(isinstance(i, int | str) for i in value):
        return value
    raise _error(
        f"activation_checkpointing must be a name ({', '.join(CHECKPOINTING_CHOICES)}, ...), "
        f"a list of level indices or submodule names, or a mapping of them to full/selective; "
        f"got {value!r}"
    )


@dataclass(frozen=True)
class MemoryLevers:
    """The ``model.*`` memory levers of the ``SegmentationModule``, each as
    ``configs/model/base.yaml`` describes it (``cudnn_workspace_mib`` in MiB); checkpointing and
    placement as the network's adapter offers them (:func:`volseg.models.networks.adapter_for`)."""

    activation_checkpointing: CheckpointSpec = None
    offload_activations: bool | str = False
    checkpoint_loss: bool = False
    channels_last: bool = False
    placement: Mapping[str, str] | None = None
    compile: bool = False
    cudnn_workspace_mib: float | None = None

    def __post_init__(self) -> None:
        # frozen: validated values are set through object.__setattr__
        set_ = object.__setattr__
        set_(self, "activation_checkpointing", _checkpointing(self.activation_checkpointing))
        for key in ("checkpoint_loss", "channels_last", "compile"):
            if not isinstance(getattr(self, key), bool):
                raise _error(f"{key} must be true or false; got {getattr(self, key)!r}")
        value = self.offload_activations
        if not (isinstance(value, bool) or value == FULL_RESOLUTION):
            raise _error(
                f"offload_activations must be true, false or {FULL_RESOLUTION}; got {value!r}"
            )
        cap = self.cudnn_workspace_mib
        bad_cap = isinstance(cap, bool) or not isinstance(cap, int | float) or cap < 0
        if cap is not None and bad_cap:
            raise _error(f"cudnn_workspace_mib must be null or MiB, 0 or more; got {cap!r}")
        placement = plain(self.placement) if self.placement else None
        if placement is not None and (
            not isinstance(placement, dict)
            or not all(isinstance(v, str) for v in placement.values())
        ):
            raise _error(f"placement must be {{encoder: DEVICE, decoder: DEVICE}}; got {placement}")
        set_(self, "placement", placement)

    def apply(self, net: nn.Module, when: When, stage: str | None = None) -> nn.Module:
        """Apply the levers due ``when`` to ``net``; returns the network to use. The order, and
        why: checkpointing and ``channels_last`` at ``build``, before ``compile`` at ``setup`` (fit
        only), so that compile traces the network as it will run (as torchtitan compiles after AC
        wrapping); ``placement`` last, at every stage's ``start``: Lightning moves the whole
        module to one device after ``setup`` and before ``on_*_start``, undoing an earlier split."""
        if when == "build":
            adapter = adapter_for(net)
            checkpointing = self.activation_checkpointing not in (None, "none")
            try:  # a lever set that the network cannot take (its adapter says): naming the key
                if checkpointing:
                    adapter.check_checkpointing(net, self.activation_checkpointing)
                if self.placement:
                    adapter.check_placement(net, self.placement)
            except ValueError as err:
                raise _error(str(err)) from None
            if checkpointing:
                adapter.apply_checkpointing(net, self.activation_checkpointing)
            if self.channels_last:
                net = net.to(memory_format=torch.channels_last_3d)
        elif when == "setup":
            # in place: state_dict keys stay the plain network's (checkpoints load either way)
            if self.compile and stage == "fit":
                net.compile()
            if self.cudnn_workspace_mib is not None:
                # read by cuDNN when it picks an algorithm; set before the first convolution
                os.environ[CUDNN_WORKSPACE_CAP_ENV] = str(int(self.cudnn_workspace_mib))
        elif self.placement is not None:
            adapter_for(net).place(net, self.placement)
        return net

    def forward(self, net: nn.Module, x: torch.Tensor, training: bool) -> torch.Tensor:
        """``net(x)`` with the memory format and, in training, host offload."""
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        if self.offload_activations and training and torch.is_grad_enabled():
            full = self.offload_activations == FULL_RESOLUTION
            min_voxels = x.shape[2:].numel() if full else 0
            with offload.OffloadToHost(pin_memory=x.is_cuda, min_voxels=min_voxels):
                return net(x)
        return net(x)

    def loss(self, fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
        """``fn(*args)``, recomputed in backward (not kept) with ``checkpoint_loss``."""
        if not (self.checkpoint_loss and torch.is_grad_enabled()):
            return fn(*args)
        return checkpoint(fn, *args, use_reentrant=False)
