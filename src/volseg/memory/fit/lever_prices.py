"""Every lever with its price: each lever that applies to the configured step's network, its
predicted peak and its step-time factor (its traced ops priced by the device's measured per-op
costs, :mod:`volseg.speed.step_time`; FLOPs alone for a device this machine lacks); the
checkpointing rows are the network adapter's ``checkpointing_choices``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from volseg.memory.estimate.candidate import Candidate
from volseg.memory.estimate.engine import PlannedRun, estimate_run
from volseg.memory.estimate.margins import planned_total
from volseg.memory.estimate.training_step import LoopSettings
from volseg.memory.fit.step_fit import checkpointing_choices, patch_divisor, scaled_patch, written
from volseg.models.networks import adapter_for
from volseg.speed.step_time import DeviceSpeed, measure_speed
from volseg.utils.config import plain


@dataclass(frozen=True)
class LeverPrice:
    """One row: the ``lever``, the ``setting`` that pulls it, the predicted ``peak`` (bytes, as
    the planner counts a budget: the margin included; ``None``: not estimated, ``why`` says),
    ``time_factor`` (the step's predicted time over the configured step's; ``None``: not
    predicted, ``why`` says), ``flops_factor`` (its FLOPs over the configured step's) and
    ``moved`` (bytes a step copies between host and device, offload only)."""

    lever: str
    setting: str
    peak: int | None
    time_factor: float | None
    flops_factor: float | None = None
    moved: int = 0
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_speed(device: str) -> DeviceSpeed | None:
    """``device``'s measured per-op costs; ``None`` where this machine has no such device."""
    if device == "cuda" and not torch.cuda.is_available():
        return None
    return measure_speed(device)


def lever_prices(plan: PlannedRun) -> list[LeverPrice]:
    """The configured step of ``plan``'s run, then each lever that applies to its network, as
    :class:`LeverPrice` rows (estimates on fake tensors: no step runs)."""
    cfg = plan.run_config()
    batch = int(cfg.data.batch_size)
    patch = [int(p) for p in cfg.data.patch_size]
    accumulate = LoopSettings.from_config(cfg.trainer).accumulate_grad_batches
    configured = plain(cfg.model.activation_checkpointing)

    def run(**changes: Any) -> Any:
        """The engine's estimate of the candidate with ``changes``."""
        return estimate_run(plan, Candidate(**changes))

    base = run()
    rows: list[LeverPrice] = []
    speed = device_speed(base.step.device)
    base_seconds = None if speed is None else base.work.seconds(speed)

    def add(lever: str, setting: str, changes: dict[str, Any], why: str = "") -> Any:
        """The row of the candidate with ``changes``; one the network refuses says why."""
        try:
            est = base if not changes else run(**changes)
        except Exception as err:  # a setting this network cannot take: the row says so
            reason = f"{type(err).__name__}: {err}".splitlines()[0]
            rows.append(LeverPrice(lever, setting, None, None, why=f"not estimated: {reason}"))
            return None
        flops = est.flops_per_step / max(base.flops_per_step, 1)
        seconds = None if speed is None else est.work.seconds(speed) / base_seconds
        # offload's price: the activations it copies to the host and back, each step
        moved = (
            2 * max(base.step.activations - est.step.activations, 0) if "offload" in lever else 0
        )
        rows.append(LeverPrice(lever, setting, planned_total(est.step), seconds, flops, moved, why))
        return est

    add(
        "as configured",
        "",
        {},
        "time: not predicted, no such device here to time its ops on" if speed is None else "",
    )
    if str(cfg.trainer.get("precision")) in ("32", "32-true"):
        half = "bf16-mixed" if base.step.device == "cpu" else "16-mixed"
        add(
            "mixed precision",
            f"trainer.precision={half}",
            {"precision": half},
            "FLOPs alike; its time: its half-precision kernels timed on this device",
        )
    if batch >= 2:
        half_batch = batch // 2 if batch % 2 == 0 else 1
        times = batch // half_batch
        add(
            "micro-batches",
            f"data.batch_size={half_batch} trainer.accumulate_grad_batches={accumulate * times}",
            {"batch_size": half_batch, "accumulate_grad_batches": accumulate * times},
            "the same samples a step, in more and smaller kernel calls",
        )
    for option in checkpointing_choices(cfg, "auto"):
        if written(option) != written(configured):
            add(
                "activation checkpointing",
                f"model.activation_checkpointing={written(option)}",
                {"activation_checkpointing": option},
                "its recomputed forward",
            )
    if not cfg.model.get("offload_activations"):
        add(
            "activation offload",
            "model.offload_activations=true",
            {"offload_activations": True},
            "FLOPs alike; the copies to the host and back are the price",
        )
    divisor = patch_divisor(cfg)
    k = min(p // d for p, d in zip(patch, divisor, strict=True))
    smaller = scaled_patch(patch, k - 1, divisor) if k > 1 else patch
    if smaller != patch:
        # what the network's constructor takes of the patch moves with it (UNETR's img_size)
        net = cfg.model.net
        sized = adapter_for(str(net._target_)).sized_for(net, smaller)
        add(
            "a smaller patch",
            f"data.patch_size={written(smaller)}",
            {"patch_size": smaller, "net_sizes": sized},
            "fewer voxels a step (less context per patch)",
        )
    split = LeverPrice(
        "two-device split",
        "model.placement={encoder: cuda:0, decoder: cuda:1}",
        base.step.process_total,
        None,
        why="not modelled: each device holds its part of the configured step",
    )
    return [*rows, split]
