"""Adapter of volseg's :class:`~volseg.models.unet.UNet3D`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from volseg.models.checkpointing import CHECKPOINTING_CHOICES, checkpoint_levels
from volseg.models.networks.contract import CheckpointSpec, NetworkAdapter, Planned
from volseg.models.unet import (
    AUTO_MIN_POOLED,
    Pooling,
    check_patch_poolable,
    halvings,
    pooling_factors,
    total_pooling,
    widths_for_depth,
)
from volseg.utils.config import plain
from volseg.utils.errors import at_config_key

#: the config keys of check_patch_poolable's values
PATCH_CONFIG_KEYS = {
    "patch_size": "data.patch_size",
    "widths": "model.net.widths",
    "pooling": "model.net.pooling",
}


def auto_depth(pooling: Pooling, patch_size: Sequence[int]) -> int:
    """Levels for ``depth=auto``: pool until no axis can be pooled again (``pooling=auto``: the axis
    pooled most decides; ``null``: the thinnest)."""
    counts = halvings(patch_size)
    return max(2, 1 + (max(counts) if pooling == "auto" else min(counts)))


class UNet3DAdapter(NetworkAdapter):
    """UNet3D: ``model.net.depth``/``widths``/``pooling`` planned for the patch; divisible by the
    per-axis product of its poolings; checkpointing by its own blocks
    (:func:`~volseg.models.checkpointing.checkpoint_levels`); placement ``{encoder, decoder}``."""

    family = "volseg UNet3D"
    checkpointing_choices = CHECKPOINTING_CHOICES
    checkpointing_list = "level indices (0 = full resolution)"
    checkpointing_mapping = "encoder/decoder"

    def plan(self, net_cfg: Any, patch: Sequence[int]) -> list[Planned]:
        """``auto`` depth and pooling planned, explicit values checked against the patch."""
        patch = [int(p) for p in patch]
        widths = [int(w) for w in net_cfg.widths]
        pooling: Any = plain(net_cfg.get("pooling"))
        depth = net_cfg.get("depth")
        out: list[Planned] = []
        if depth == "auto":
            levels = auto_depth(pooling, patch)
            widths = widths_for_depth(widths, levels)
            why = f"pooled until no axis of the patch {patch} can be halved again"
            out.append(Planned("model.net.depth", levels, "planned", why))
            out.append(Planned("model.net.widths", widths, "planned", "cut or extended"))
        else:
            if depth is not None:
                widths = widths_for_depth(widths, int(depth))
            out.append(Planned("model.net.depth", len(widths), "configured"))
            out.append(Planned("model.net.widths", widths, "configured"))
        try:
            factors = pooling_factors(widths, pooling, patch)
            check_patch_poolable(widths, pooling, patch, names=PATCH_CONFIG_KEYS)
        except ValueError as err:
            raise at_config_key(str(err), "model.net") from None
        bottleneck = [p // f for p, f in zip(patch, total_pooling(factors), strict=True)]
        why = f"bottleneck {bottleneck}"
        if pooling == "auto":
            why = f"an axis pooled while it keeps >= {AUTO_MIN_POOLED} voxels; {why}"
        source = "planned" if pooling == "auto" else "configured"
        return [*out, Planned("model.net.pooling", factors, source, why)]

    def divisibility(self, net_cfg: Any, patch: Sequence[int] | None) -> list[int]:
        """The per-axis product of the poolings; before the patch is planned, ``auto`` pools as
        ``null`` (2 at every level)."""
        pooling = plain(net_cfg.get("pooling"))
        if patch is None and pooling == "auto":
            pooling = None
        try:
            factors = pooling_factors(net_cfg.get("widths") or [0], pooling, patch)
        except ValueError as err:
            raise at_config_key(str(err), "model.net") from None
        return total_pooling(factors)

    def check_checkpointing(self, net: nn.Module, spec: CheckpointSpec) -> None:
        if spec is None or spec in self.checkpointing_choices:
            return
        levels = isinstance(spec, Sequence) and not isinstance(spec, str) and spec
        if not isinstance(spec, Mapping) and not (
            levels and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in spec)
        ):
            raise self._bad_checkpointing(net, spec)
        checkpoint_levels(spec, net.depth)  # parts, modes, levels beyond the depth: ValueError

    def apply_checkpointing(self, net: nn.Module, spec: CheckpointSpec) -> None:
        net.set_activation_checkpointing(spec)

    def check_placement(self, net: nn.Module, placement: Mapping[str, str]) -> None:
        if set(placement) != {"encoder", "decoder"}:
            raise ValueError(
                f"placement: UNet3D is split as {{encoder: DEVICE, decoder: DEVICE}}; "
                f"got {dict(placement)}"
            )

    def place(self, net: nn.Module, placement: Mapping[str, str]) -> None:
        net.place(placement["encoder"], placement["decoder"])
