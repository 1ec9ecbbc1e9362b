"""Adapters for MONAI's 3D segmentation networks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch import nn

from volseg.models.networks.contract import CheckpointSpec, NetworkAdapter, Planned, stride_product
from volseg.utils.config import plain
from volseg.utils.errors import UserInputError


class DynUNetAdapter(NetworkAdapter):
    """MONAI's DynUNet: divisible by the per-axis product of its ``strides``; deep supervision."""

    family = "MONAI DynUNet"

    def divisibility(self, net_cfg: Any, patch: Sequence[int] | None) -> list[int]:
        return stride_product(net_cfg.strides)

    def deep_supervision(self, net_cfg: Any) -> bool:
        return bool(net_cfg.get("deep_supervision", False))


class SegResNetAdapter(NetworkAdapter):
    """MONAI's SegResNet: ``len(blocks_down) - 1`` stride-2 downsamplings."""

    family = "MONAI SegResNet"
    #: no ``selective``: its residual blocks add the skip in place onto a convolution's output
    #: (``x += identity``), which torch's selective checkpointing refuses (a kept output mutated)
    checkpointing_choices = ("none", "all")

    def divisibility(self, net_cfg: Any, patch: Sequence[int] | None) -> list[int]:
        levels = len(plain(net_cfg.get("blocks_down", [1, 2, 2, 4])))
        return [2 ** (levels - 1)] * 3


class BasicUNetAdapter(NetworkAdapter):
    """MONAI's BasicUNet: four 2x max-poolings (its decoder pads other sizes)."""

    family = "MONAI BasicUNet"

    def divisibility(self, net_cfg: Any, patch: Sequence[int] | None) -> list[int]:
        return [16, 16, 16]


class SwinUNETRAdapter(NetworkAdapter):
    """MONAI's SwinUNETR: sides divide by ``patch_size * 16``; ``all``: its use_checkpoint."""

    family = "MONAI SwinUNETR"
    checkpointing_list = "nothing (SwinUNETR's own flag checkpoints every Swin block)"

    def divisibility(self, net_cfg: Any, patch: Sequence[int] | None) -> list[int]:
        return [int(net_cfg.get("patch_size", 2)) * 16] * 3

    def plan(self, net_cfg: Any, patch: Sequence[int]) -> list[Planned]:
        """The deepest level must keep more than one voxel (instance norm)."""
        divisor = self.divisibility(net_cfg, patch)
        deepest = [int(p) // d for p, d in zip(patch, divisor, strict=True)]
        if math.prod(deepest) <= 1:
            raise UserInputError(
                f"data.patch_size={list(patch)}: SwinUNETR's deepest level would hold "
                f"{deepest} voxels (the patch / {divisor[0]}); its instance norm needs more than "
                f"one in training: use a patch with a side of {2 * divisor[0]} or more"
            )
        return []

    def check_checkpointing(self, net: nn.Module, spec: CheckpointSpec) -> None:
        if spec is not None and spec not in self.checkpointing_choices:
            raise self._bad_checkpointing(net, spec)

    def apply_checkpointing(self, net: nn.Module, spec: CheckpointSpec) -> None:
        """``all``: MONAI's own flag; ``selective``: every block, as for any network."""
        if spec == "all":
            for module in net.modules():
                if hasattr(module, "use_checkpoint"):
                    module.use_checkpoint = True
        elif spec == "selective":
            super().apply_checkpointing(net, spec)


class UNETRAdapter(NetworkAdapter):
    """MONAI's UNETR: built for one input size, ``img_size``: the training patch."""

    family = "MONAI UNETR"
    #: MONAI's UNETR embeds 16^3 patches, whatever its settings
    PATCH = 16

    def divisibility(self, net_cfg: Any, patch: Sequence[int] | None) -> list[int]:
        return [self.PATCH] * 3

    def sized_for(self, net_cfg: Any, patch: Sequence[int]) -> dict[str, Any]:
        return {"img_size": [int(p) for p in patch]}

    def plan(self, net_cfg: Any, patch: Sequence[int]) -> list[Planned]:
        """``img_size``: the training patch where ``auto``; a configured one must be the patch."""
        configured = plain(net_cfg.get("img_size", "auto"))
        wanted = [int(p) for p in patch]
        if configured in (None, "auto"):
            why = "UNETR is built for one input size: the training patch"
            return [Planned("model.net.img_size", wanted, "planned", why)]
        given = [configured] * 3 if isinstance(configured, int) else list(configured)
        if given != wanted:
            raise UserInputError(
                f"model.net.img_size={configured}: UNETR takes only this size, but "
                f"data.patch_size={wanted}; set model.net.img_size=auto to build it for the patch"
            )
        return [Planned("model.net.img_size", wanted, "configured")]
