"""``async_checkpoint``: whether checkpoints are written in the background, from the strategy."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from volseg.plan.run_plan import Decision
from volseg.utils.errors import UserInputError

#: strategies that save through Lightning's CheckpointIO (DeepSpeed and FSDP write their own)
IO_STRATEGIES = ("auto", "single_device", "ddp")
IO_STRATEGY_CLASSES = ("SingleDeviceStrategy", "DDPStrategy")


def plan_async_checkpoint(value: Any, strategy: Any) -> Decision:
    """``async_checkpoint`` (``auto``, ``true``, ``false``) for ``trainer.strategy``; one error for
    another value, or ``true`` where the strategy writes its own."""
    name = str(strategy if strategy is not None else "auto")
    if isinstance(strategy, DictConfig | dict) and "_target_" in strategy:
        name = str(strategy["_target_"]).rsplit(".", 1)[-1]  # the class a node builds
    lowered = name.lower()
    supported = name in IO_STRATEGY_CLASSES or any(
        lowered == s or lowered.startswith(f"{s}_") for s in IO_STRATEGIES
    )
    if value == "auto":
        if supported:
            return Decision(True, "planned", f"trainer.strategy={name} saves through CheckpointIO")
        return Decision(False, "planned", f"trainer.strategy={name} writes its checkpoints itself")
    if not isinstance(value, bool):
        raise UserInputError(f"async_checkpoint={value}: expected auto, true or false")
    if value and not supported:
        raise UserInputError(
            f"async_checkpoint=true: trainer.strategy={name} writes its checkpoints itself, not "
            "through Lightning's CheckpointIO; use async_checkpoint=auto or false"
        )
    return Decision(value, "configured")
