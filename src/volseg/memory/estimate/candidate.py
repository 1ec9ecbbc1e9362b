"""``Candidate``: one configuration of a planned run that a planner weighs, typed. Every estimate
takes one and every search returns one; :meth:`volseg.plan.RunPlan.run_config` applies it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar


class _Pairs(tuple):
    """A mapping, frozen: its ``(key, value)`` pairs."""


def _frozen(value: Any) -> Any:
    """``value`` with every list a tuple and every mapping :class:`_Pairs`, so that a candidate
    can be hashed and compared."""
    if isinstance(value, Mapping):
        return _Pairs((str(k), _frozen(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    """A frozen value as the config writes it: lists and dicts."""
    if isinstance(value, _Pairs):
        return {k: _thawed(v) for k, v in value}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


@dataclass(frozen=True)
class Candidate:
    """What differs from the plan, every field ``None`` where the plan's value stands.

    ``batch_size``: a micro-batch's samples; ``accumulate_grad_batches``: micro-batches a step;
    ``patch_size`` ``(D, H, W)`` voxels; ``net_sizes``: the network's constructor arguments that
    follow the patch (UNETR's ``img_size``), as ``(name, value)`` pairs; ``placement``:
    ``((part, device), ...)``; ``sw_batch_size``, ``roi_size`` ``(D, H, W)`` and
    ``stitch_device``: validation's sliding window; ``precision``: ``trainer.precision``."""

    batch_size: int | None = None
    patch_size: tuple[int, ...] | None = None
    activation_checkpointing: Any = None
    accumulate_grad_batches: int | None = None
    checkpoint_loss: bool | None = None
    channels_last: bool | None = None
    offload_activations: bool | str | None = None
    placement: tuple[tuple[str, str], ...] | None = None
    net_sizes: tuple[tuple[str, Any], ...] = ()
    sw_batch_size: int | None = None
    roi_size: tuple[int, ...] | None = None
    stitch_device: str | None = None
    precision: str | None = None

    #: each field's config key
    KEYS: ClassVar[dict[str, str]] = {
        "batch_size": "data.batch_size",
        "patch_size": "data.patch_size",
        "activation_checkpointing": "model.activation_checkpointing",
        "accumulate_grad_batches": "trainer.accumulate_grad_batches",
        "checkpoint_loss": "model.checkpoint_loss",
        "channels_last": "model.channels_last",
        "offload_activations": "model.offload_activations",
        "placement": "model.placement",
        "sw_batch_size": "model.inferer.sw_batch_size",
        "roi_size": "model.inferer.roi_size",
        "stitch_device": "model.inferer.device",
        "precision": "trainer.precision",
    }

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in ("batch_size", "accumulate_grad_batches", "sw_batch_size"):
                value = None if value is None else int(value)
            elif field.name in ("patch_size", "roi_size"):
                value = None if value is None else tuple(int(v) for v in value)
            object.__setattr__(self, field.name, _frozen(value))

    def changed(self, **fields: Any) -> Candidate:
        """This candidate with ``fields`` replaced."""
        return dataclasses.replace(self, **fields)

    def settings(self) -> dict[str, Any]:
        """The config keys this candidate sets, with plain values (lists, dicts)."""
        found = {
            key: _thawed(getattr(self, name))
            for name, key in self.KEYS.items()
            if getattr(self, name) is not None
        }
        return found | {f"model.net.{name}": _thawed(value) for name, value in self.net_sizes}
