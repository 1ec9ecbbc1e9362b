"""The U-Net's topology for a patch: depth and per-level pooling kernels, planned as nnU-Net
plans its networks (pool an axis while it keeps a few voxels), so the network is built with
explicit values (:class:`volseg.models.unet.UNet3D` plans nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

from volseg.models.unet import (
    AUTO_MIN_POOLED,
    Pooling,
    check_patch_poolable,
    pooling_factors,
    total_pooling,
    widths_for_depth,
)
from volseg.plan.run_plan import Decision
from volseg.utils.config import plain
from volseg.utils.errors import at_config_key

#: the config keys of check_patch_poolable's values
PATCH_CONFIG_KEYS = {
    "patch_size": "data.patch_size",
    "widths": "model.net.widths",
    "pooling": "model.net.pooling",
}


def auto_depth(pooling: Pooling, patch_size: Sequence[int]) -> int:
    """Levels for ``depth=auto``: pool until no axis of ``patch_size`` can be pooled
    again (with ``pooling=auto`` an axis is pooled while it keeps >= ``AUTO_MIN_POOLED`` voxels;
    with ``null`` all axes are pooled together, so the thinnest decides), so the bottleneck sees
    a few voxels and the receptive field spans the patch, as nnU-Net plans its networks."""
    counts = []
    for extent in (int(p) for p in patch_size):
        n = 0
        while extent >= 2 * AUTO_MIN_POOLED:
            extent //= 2
            n += 1
        counts.append(n)
    return max(2, 1 + (max(counts) if pooling == "auto" else min(counts)))


def plan_network(net: DictConfig, patch: Sequence[int]) -> dict[str, Decision]:
    """``model.net.widths``, ``depth`` and ``pooling`` for the training patch ``patch``
    ([D, H, W] voxels): ``depth=auto`` and ``pooling=auto`` planned, explicit values checked
    against the patch (one error naming the keys when an axis would pool to nothing)."""
    patch = [int(p) for p in patch]
    widths = [int(w) for w in net.widths]
    pooling: Any = plain(net.get("pooling"))
    depth = net.get("depth")
    out: dict[str, Decision] = {}
    if depth == "auto":
        levels = auto_depth(pooling, patch)
        widths = widths_for_depth(widths, levels)
        out["model.net.depth"] = Decision(
            levels, "planned", f"pooled until no axis of the patch {patch} can be halved again"
        )
        out["model.net.widths"] = Decision(widths, "planned", "model.net.widths cut or extended")
    else:
        if depth is not None:
            widths = widths_for_depth(widths, int(depth))
        out["model.net.depth"] = Decision(len(widths), "configured")
        out["model.net.widths"] = Decision(widths, "configured")
    try:
        factors = pooling_factors(widths, pooling, patch)
        check_patch_poolable(widths, pooling, patch, names=PATCH_CONFIG_KEYS)
    except ValueError as err:
        raise at_config_key(str(err), "model.net") from None
    bottleneck = [p // f for p, f in zip(patch, total_pooling(factors), strict=True)]
    if pooling == "auto":
        why = f"an axis pooled while it keeps >= {AUTO_MIN_POOLED} voxels; bottleneck {bottleneck}"
        out["model.net.pooling"] = Decision(factors, "planned", why)
    else:
        out["model.net.pooling"] = Decision(factors, "configured", f"bottleneck {bottleneck}")
    return out
