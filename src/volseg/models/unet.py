"""A configurable 3D U-Net on ``(B, C, D, H, W)`` tensors.

Any spatial size works: the upsampled decoder map is zero-padded to its skip's size before the
concatenation. Each level pools every axis by 2 or 1 (``pooling``), so a thin stack can keep z
unpooled at the deep levels."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from volseg.models.checkpointing import (
    CheckpointSpec,
    checkpoint_levels,
    checkpoint_segment,
    selective_chain,
)
from volseg.models.conv import Conv3d
from volseg.utils.config import plain

log = logging.getLogger(__name__)

Norm = Literal["batch", "instance", "group"]
Upsampling = Literal["trilinear", "transposed"]
Activation = Literal["relu", "leaky_relu"]
# null: [2, 2, 2] at every level; "auto": from the patch; or one [z, y, x] kernel per level
Pooling = str | Sequence[Sequence[int]] | None

# pooling=auto pools an axis only while it keeps at least this many voxels after the pooling
AUTO_MIN_POOLED = 4
LEAKY_SLOPE = 0.01


def halvings(patch_size: Sequence[int]) -> list[int]:
    """Per axis, how often ``pooling=auto`` halves it: while it keeps ``AUTO_MIN_POOLED`` voxels."""
    return [max(0, (int(p) // AUTO_MIN_POOLED).bit_length() - 1) for p in patch_size]


def pooling_factors(
    widths: Sequence[int], pooling: Pooling = None, patch_size: Sequence[int] | None = None
) -> list[list[int]]:
    """Per-level pooling factors ``[[fz, fy, fx], ...]``, full resolution first, for ``pooling``:
    ``None``: 2 everywhere; ``"auto"``: an axis of ``patch_size`` ([D, H, W] voxels) pooled while
    it keeps ``AUTO_MIN_POOLED`` voxels; a list: as given (else ``ValueError``)."""
    levels = len(widths) - 1
    if pooling is None:
        return [[2, 2, 2] for _ in range(levels)]
    if pooling == "auto":
        if patch_size is None or len(patch_size) != 3 or min(int(p) for p in patch_size) < 1:
            raise ValueError(f"pooling=auto needs patch_size=[D, H, W]; got {patch_size}")
        return [[2 if n > level else 1 for n in halvings(patch_size)] for level in range(levels)]
    kernels = plain(pooling)
    valid = isinstance(kernels, list) and all(
        isinstance(k, list) and len(k) == 3 and all(f in (1, 2) for f in k) for k in kernels
    )
    if not valid or len(kernels) != levels:
        raise ValueError(
            f"pooling needs len(widths) - 1 = {levels} kernels [z, y, x] of 1s and 2s "
            f"(e.g. [[1,2,2],...]), null or auto; got {plain(pooling)}"
        )
    return [[int(f) for f in k] for k in kernels]


#: the widest level ``depth`` adds (nnU-Net's cap for 3D)
MAX_WIDTH = 320


def widths_for_depth(widths: Sequence[int], depth: int) -> list[int]:
    """``widths`` cut or extended (doubling the last, at most ``MAX_WIDTH``) to ``depth`` levels."""
    out = [int(w) for w in widths][:depth]
    while len(out) < depth:
        out.append(min(2 * out[-1], max(MAX_WIDTH, out[-1])))
    return out


def total_pooling(factors: Sequence[Sequence[int]]) -> list[int]:
    """Per-axis product of the pooling factors: ``[D, H, W]`` divisors of the bottleneck."""
    return [math.prod(level[axis] for level in factors) for axis in range(3)]


#: how :func:`check_patch_poolable` names its values: the network's own parameters
OWN_NAMES = {"patch_size": "patch_size", "widths": "widths", "pooling": "pooling"}


def check_patch_poolable(
    widths: Sequence[int],
    pooling: Pooling,
    patch_size: Sequence[int],
    names: Mapping[str, str] = OWN_NAMES,
) -> None:
    """``ValueError`` naming the values (by ``names``) and the fix when a patch axis is thinner
    than the network pools it."""
    factors = pooling_factors(widths, pooling, patch_size)
    need = total_pooling(factors)
    patch = [int(p) for p in patch_size]
    thin = [f"{axis}={p} < {n}" for axis, p, n in zip("DHW", patch, need, strict=True) if p < n]
    if thin:
        raise ValueError(
            f"{names['patch_size']}={patch} is too thin for the network: {', '.join(thin)} "
            f"({names['widths']}={plain(widths)} pools {len(factors)} times, "
            f"{names['pooling']}={plain(pooling) if pooling is not None else 'null'} -> "
            f"[D, H, W] divided by {need}). Use a larger patch, fewer levels, or "
            f"{names['pooling']}=auto (pools an axis only while it keeps >= {AUTO_MIN_POOLED} "
            "voxels)"
        )


def make_norm(kind: Norm, channels: int, num_groups: int = 8) -> nn.Module:
    """A 3D normalization layer over ``channels`` feature maps."""
    if kind == "batch":
        return nn.BatchNorm3d(channels)
    if kind == "instance":
        return nn.InstanceNorm3d(channels, affine=True)
    if kind == "group":
        return nn.GroupNorm(min(num_groups, channels), channels)
    raise ValueError(f"norm must be one of batch, instance, group; got {kind!r}")


def make_activation(kind: Activation) -> nn.Module:
    """The nonlinearity after every norm (in place: its input is not needed for backward)."""
    if kind == "relu":
        return nn.ReLU(inplace=True)
    if kind == "leaky_relu":
        # nnU-Net's slope: units that a ReLU would switch off for good keep a gradient
        return nn.LeakyReLU(LEAKY_SLOPE, inplace=True)
    raise ValueError(f"activation must be 'relu' or 'leaky_relu'; got {kind!r}")


def checkpointing_now(block: nn.Module) -> bool:
    """Whether ``block`` (flagged ``checkpointed``) checkpoints this call: training with grad."""
    return bool(block.checkpointed) and block.training and torch.is_grad_enabled()


class DoubleConv(nn.Sequential):
    """[Conv3d(k=3, pad=1) -> norm -> activation] x 2, optional dropout after the first.

    ``checkpointed`` ``full``: each conv unit its own checkpoint segment while training;
    ``selective``: a :func:`~volseg.models.checkpointing.selective_chain`."""

    checkpointed: bool | str = False

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        norm: Norm = "batch",
        num_groups: int = 8,
        bias: bool = True,
        dropout: float = 0.0,
        activation: Activation = "relu",
    ) -> None:
        layers: list[nn.Module] = [
            Conv3d(in_channels, out_channels, kernel_size=3, padding=1, bias=bias),
            make_norm(norm, out_channels, num_groups),
            make_activation(activation),
        ]
        if dropout > 0:
            layers.append(nn.Dropout3d(dropout))
        layers += [
            Conv3d(out_channels, out_channels, kernel_size=3, padding=1, bias=bias),
            make_norm(norm, out_channels, num_groups),
            make_activation(activation),
        ]
        super().__init__(*layers)

    def units(self) -> tuple[nn.Sequential, nn.Sequential]:
        """The two conv -> norm -> activation (-> dropout) units, as views on the same layers."""
        layers = list(self)
        return nn.Sequential(*layers[:-3]), nn.Sequential(*layers[-3:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not checkpointing_now(self):
            return super().forward(x)
        if self.checkpointed == "selective":
            return selective_chain(list(self), x)
        first, second = self.units()
        x = checkpoint_segment(first, [first], x)
        return checkpoint_segment(second, [second], x)


class Down(nn.Sequential):
    """MaxPool3d(factors) -> DoubleConv: divides D, H, W by ``factors`` (each 1 or 2)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        factors: Sequence[int] = (2, 2, 2),
        **conv_kwargs,
    ) -> None:
        super().__init__(
            nn.MaxPool3d(tuple(factors)), DoubleConv(in_channels, out_channels, **conv_kwargs)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool, conv = self
        if checkpointing_now(conv) and conv.checkpointed == "selective":
            # the pooling joins the first segment: its output and indices are not kept
            return selective_chain(list(conv), x, before=pool, before_modules=[pool])
        return super().forward(x)


class Up(nn.Module):
    """Upsample by ``factors`` -> pad to the skip's size -> concat [skip, up] -> DoubleConv:
    ``x`` ``(B, in_channels, d, h, w)`` and ``skip`` ``(B, skip_channels, D, H, W)``, ``fz * d <=
    D < fz * (d + 1)`` etc., to ``(B, out_channels, D, H, W)``."""

    def __init__(
        self,
        in_channels: int,
        skip_channels: int,
        out_channels: int,
        upsampling: Upsampling = "trilinear",
        factors: Sequence[int] = (2, 2, 2),
        **conv_kwargs,
    ) -> None:
        super().__init__()
        factors = tuple(int(f) for f in factors)
        if upsampling == "trilinear":
            self.up: nn.Module = nn.Upsample(
                scale_factor=tuple(float(f) for f in factors), mode="trilinear", align_corners=True
            )
        elif upsampling == "transposed":
            self.up = nn.ConvTranspose3d(
                in_channels, in_channels, kernel_size=factors, stride=factors
            )
        else:
            raise ValueError(f"upsampling must be 'trilinear' or 'transposed'; got {upsampling!r}")
        self.conv = DoubleConv(skip_channels + in_channels, out_channels, **conv_kwargs)

    checkpointed: bool | str = False

    def merge(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        """Upsample ``x``, pad it to ``skip``'s size, concat ``[skip, x]`` on channels."""
        x = self.up(x)
        dz, dy, dx = (s - u for s, u in zip(skip.shape[2:], x.shape[2:], strict=True))
        if dz or dy or dx:
            x = F.pad(x, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2, dz // 2, dz - dz // 2])
        return torch.cat([skip, x], dim=1)

    def forward(
        self, x: torch.Tensor, skip: torch.Tensor, tail: nn.Module | None = None
    ) -> torch.Tensor:
        """``tail`` (level 0's head) runs after the block, inside its last segment when checkpointed
        (the block's output is then not kept for it)."""
        tail = tail if tail is not None else nn.Identity()
        if not checkpointing_now(self):
            return tail(self.conv(self.merge(x, skip)))
        if self.checkpointed == "selective":
            # the merge joins the first segment, the tail the last: neither the concatenated
            # map (the level's largest) nor, at level 0, the block's output is kept
            layers = [*self.conv, *([] if isinstance(tail, nn.Identity) else [tail])]
            return selective_chain(layers, x, skip, before=self.merge, before_modules=[self.up])
        first, second = self.conv.units()
        # the concatenated map is rebuilt in backward instead of kept: segment 1 keeps x, skip
        y = checkpoint_segment(
            lambda x, skip: first(self.merge(x, skip)), [self.up, first], x, skip
        )
        return checkpoint_segment(lambda y: tail(second(y)), [second, tail], y)


class UNet3D(nn.Module):
    """3D U-Net with ``len(widths)`` levels: ``(B, in_channels, D, H, W)`` -> logits
    ``(B, num_classes, D, H, W)``.

    Args:
        widths: feature maps per encoder level, full resolution first.
        decoder_widths: each decoder level's output maps; ``None``: ``widths[:-1]``.
        norm: ``batch``, ``instance`` or ``group`` (``num_groups`` groups).
        upsampling: ``trilinear`` or ``transposed`` (ConvTranspose3d, kernel = stride = factors).
        pooling: ``None`` or a ``[z, y, x]`` kernel of 1s and 2s a level (:func:`pooling_factors`).
        patch_size: training patch ``[D, H, W]`` voxels, checked against the pooling.
        depth: an int cuts or extends ``widths`` (:func:`widths_for_depth`).
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        widths: Sequence[int],
        decoder_widths: Sequence[int] | None = None,
        norm: Norm = "instance",
        num_groups: int = 8,
        upsampling: Upsampling = "trilinear",
        bias: bool = True,
        dropout: float = 0.0,
        pooling: Pooling = None,
        patch_size: Sequence[int] | None = None,
        depth: int | str | None = None,
        activation: Activation = "leaky_relu",
    ) -> None:
        super().__init__()
        widths = list(widths)
        if pooling == "auto" or depth == "auto":
            raise ValueError(
                f"pooling={pooling!r}, depth={depth!r}: auto is planned by the run plan "
                "(volseg.plan.make_plan); UNet3D takes explicit pooling kernels and depth"
            )
        if depth is not None:
            widths = widths_for_depth(widths, int(depth))
        if len(widths) < 2:
            raise ValueError(f"widths needs at least 2 levels; got {widths}")
        decoder_widths = list(decoder_widths) if decoder_widths is not None else widths[:-1]
        if len(decoder_widths) != len(widths) - 1:
            raise ValueError(
                f"decoder_widths needs len(widths) - 1 = {len(widths) - 1} entries; "
                f"got {decoder_widths}"
            )
        factors = pooling_factors(widths, pooling, patch_size)
        if patch_size is not None:
            check_patch_poolable(widths, pooling, patch_size)
        conv_kwargs = dict(
            norm=norm, num_groups=num_groups, bias=bias, dropout=dropout, activation=activation
        )
        self.widths = widths
        self.pooling = factors  # [[fz, fy, fx], ...], level i -> i + 1

        self.inc = DoubleConv(in_channels, widths[0], **conv_kwargs)
        self.downs = nn.ModuleList(
            Down(widths[i - 1], widths[i], factors[i - 1], **conv_kwargs)
            for i in range(1, len(widths))
        )
        # ups[i] produces level i: index i is the level index
        below = [*decoder_widths[1:], widths[-1]]
        self.ups = nn.ModuleList(
            Up(below[i], widths[i], decoder_widths[i], upsampling, factors[i], **conv_kwargs)
            for i in range(len(widths) - 1)
        )
        self.head = nn.Conv3d(decoder_widths[0], num_classes, kernel_size=1)
        self.encoder_device: torch.device | None = None  # set by place()
        self.decoder_device: torch.device | None = None

    @property
    def depth(self) -> int:
        return len(self.widths)

    def place(self, encoder: str | torch.device, decoder: str | torch.device) -> None:
        """Put the encoder and the decoder on two devices (skips cross with ``Tensor.to``)."""
        self.encoder_device, self.decoder_device = torch.device(encoder), torch.device(decoder)
        self.inc.to(self.encoder_device)
        self.downs.to(self.encoder_device)
        self.ups.to(self.decoder_device)
        self.head.to(self.decoder_device)

    def set_activation_checkpointing(self, spec: CheckpointSpec) -> None:
        """Checkpoint the blocks ``spec`` chooses (:func:`checkpoint_levels`)."""
        encoder, decoder = checkpoint_levels(spec, self.depth)
        for level in range(self.depth):
            block = self.inc if level == 0 else self.downs[level - 1][1]
            block.checkpointed = encoder.get(level, False)
        for level, up in enumerate(self.ups):
            up.checkpointed = decoder.get(level, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.encoder_device is not None:
            x = x.to(self.encoder_device)
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(skips[-1]))
        if self.decoder_device is not None:
            skips = [s.to(self.decoder_device, non_blocking=True) for s in skips]
        x = skips.pop()
        for level in reversed(range(1, len(self.ups))):
            x = self.ups[level](x, skips[level])
        if checkpointing_now(self.ups[0]):  # the head joins the last checkpoint segment
            return self.ups[0](x, skips[0], tail=self.head)
        return self.head(self.ups[0](x, skips[0]))
